-- The event feed written by the step itself, where the step's keys and the
-- bucket's are on one server (no cluster: see store/feed.rs): the step that
-- makes a transition appends it to its bucket's log (a stream) at once, in
-- the same atomic step, with the log's next ordinal (`#n` in the bucket's
-- marks). Nothing is left to move: no feed list, no due index.
--
-- One user or room adds at most FEED_CAP events per window of FEED_WINDOW
-- ms (its node's --event-max-per-user and --event-retention-secs, set in
-- front of every script by the node that loads it): its window's start
-- and count, the fields `fs` and `fc`, are kept with the owner (a user's
-- status hash, a room's meta). Beyond the bound the ordinal still moves on,
-- and the gap is what a reader counts as lost.

-- The owner's window after one more event at `now` (ms), from the fields
-- read (`since`, `count`; nil: none yet): its start, its count, and
-- whether that event is within the bound.
local function feed_mark(since, count, now)
  since, count = tonumber(since), tonumber(count)
  if not since or not count or now - since >= FEED_WINDOW then
    since, count = now, 0
  end
  if count < FEED_CAP then
    return since, count + 1, true
  end
  return since, count, false
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
