-- The event feed written by the step itself, where the step's keys and the
-- bucket's are on one server (no cluster: see store/feed.rs): the step that
-- makes a transition appends it to its bucket's log (a stream) at once, in
-- the same atomic step, with the log's next ordinal (`#n`), under the bound
-- of events per feed and window that `feed_append.lua` keeps too (the marks
-- `<last seq>|<window start ms>|<events in it>`), so that the two ways mix
-- in one log. Nothing is left to move: no feed list, no due index.
--
-- The bound and the window are the marks' `#cap` and `#window`, which the
-- feed pass writes from its node's flags; until it has (a Redis that
-- restarted empty), the flags' defaults.

-- Appends `entry` (`<seq>|<kind>|<at>|<record>`) of feed `feed` (its key,
-- `presence-feed:{<owner>}`) to log `log`, with marks `moved`, at `now` ms.
local function feed_direct(log, moved, feed, seq, entry, now)
  now = tonumber(now)
  local m = redis.call('HMGET', moved, feed, '#n', '#cap', '#window')
  local cap, window = tonumber(m[3]) or 10000, tonumber(m[4]) or 86400000
  local last, since, added = 0, now, 0
  if m[1] then
    local a, b, c = string.match(m[1], '^(%d+)|(%d+)|(%d+)$')
    if a then
      last = tonumber(a)
      if now - tonumber(b) < window then
        since, added = tonumber(b), tonumber(c)
      end
    end
  end
  local n = tonumber(m[2] or '0') + 1
  if added < cap then
    redis.call('XADD', log, '*', 'n', n, 'o', string.sub(feed, 16, -2), 'e', entry)
    added = added + 1
  end
  -- Beyond the bound the ordinal still moves on: the gap is the loss.
  redis.call('HSET', moved, feed, string.format('%d|%d|%d', math.max(last, seq), since, added), '#n', n)
end
