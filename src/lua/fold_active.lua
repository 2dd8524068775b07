-- Fold a schema-3 hash's `active` (the last refresh, ms) into `seq`, at
-- start: since schema 4, `seq` is raised to every refresh and dates the
-- user's last activity, one field for both. Idempotent.
--
-- KEYS[1] presence-status:{<user>}     the user's hash
--
-- Returns 1 when the hash had `active` (now folded and deleted), else 0.
local active = redis.call('HGET', KEYS[1], 'active')
if not active then
  return 0
end
if tonumber(active) and tonumber(active) > tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') then
  redis.call('HSET', KEYS[1], 'seq', active)
end
redis.call('HDEL', KEYS[1], 'active')
return 1
