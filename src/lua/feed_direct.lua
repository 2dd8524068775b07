-- The event feed written by the step itself, where the step's keys and the
-- bucket's are on one server (no cluster: see store/feed.rs): the step that
-- makes a transition appends it to its bucket's log (a stream) at once, in
-- the same atomic step, with the log's next ordinal (`#n` in the bucket's
-- marks). Nothing is left to move: no feed list, no due index.
--
-- One user or room adds at most FEED_CAP events per window of FEED_WINDOW
-- ms (its node's --event-max-per-user and --event-retention-secs, set in
-- front of every script by the node that loads it): its mark, `<window
-- start ms>|<events in it>`, is kept with the owner (a user's status hash,
-- a room's meta). Beyond the bound the ordinal still moves on, and the gap
-- is what a reader counts as lost.

-- The owner's mark after one more event at `now` (ms) from mark `mark`
-- (nil: none yet), and whether that event is within the bound.
local function feed_mark(mark, now)
  local since, count = now, 0
  if mark then
    local b, c = string.match(mark, '^(%d+)|(%d+)$')
    if b and now - tonumber(b) < FEED_WINDOW then
      since, count = tonumber(b), tonumber(c)
    end
  end
  local keep = count < FEED_CAP
  if keep then count = count + 1 end
  return string.format('%d|%d', since, count), keep
end

-- Appends `entry` (`<seq>|<kind>|<at>|<record>`) of `owner` (a user, or
-- `r:<room>`) to log `log` with the next ordinal of marks `moved`; with
-- `keep` false only the ordinal moves on.
local function feed_direct(log, moved, owner, entry, keep)
  local n = redis.call('HINCRBY', moved, '#n', 1)
  if keep then
    redis.call('XADD', log, '*', 'n', n, 'o', owner, 'e', entry)
  end
end
