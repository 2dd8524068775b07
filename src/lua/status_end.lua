-- End a status whose `until` has come: back to `online`, text cleared,
-- announced when the user is online. The atomic step of the status-end
-- pass; idempotent, so that whichever node runs it, and however often, the
-- reset is published once: a second run finds no `until` left.
--
-- KEYS[1] presence-status:{<user>}     status hash (status, text, since, until, seq)
-- KEYS[2] presence-count:{<user>}      live device counter
-- ARGV[1] now, epoch ms
-- ARGV[2] user id
-- ARGV[3] the user's events channel, presence-events:{<user>} (SPUBLISH)
--
-- Returns {outcome, until, was invisible}:
--   outcome 0  nothing to end (no `until` any more): drop the index entry
--   outcome 1  ended now (a `presence` event was published if online);
--              was invisible 1 when the status that ended was `invisible`
--              (the caller shows the user in its rooms again)
--   outcome 2  not due yet: `until` (a later one was chosen) is the entry's
--              new score
local u = redis.call('HGET', KEYS[1], 'until')
if not u then
  return {0, 0}
end
if tonumber(u) and tonumber(u) > tonumber(ARGV[1]) then
  return {2, tonumber(u)}
end
local count = tonumber(redis.call('GET', KEYS[2]) or '0')
local was = redis.call('HMGET', KEYS[1], 'status', 'since')
if was[1] == 'invisible' and count <= 0 and was[2] then
  -- Offline: others were shown the moment it went invisible as its last
  -- seen; its real departure must not show once the status ends.
  redis.call('HSET', KEYS[1], 'last_seen', was[2])
end
redis.call('HDEL', KEYS[1], 'until', 'text')
redis.call('HSET', KEYS[1], 'status', 'online', 'since', ARGV[1])
if count > 0 then
  publish_event(ARGV[3], KEYS[1], ARGV[2], count, nil, next_seq(KEYS[1], ARGV[1], true))
end
return {1, 0, was[1] == 'invisible' and 1 or 0}
