-- The room deadline pass: removes the memberships whose deadline has
-- passed (their device's node died, or the device vanished), each with the
-- same leave as a clean one.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] now ms, ARGV[3] most memberships to remove
--
-- Returns {removed, next, published events}: the members removed, the
-- earliest deadline left (as a string) or '' when the room is empty, and
-- the leaves it published.
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, member in ipairs(due) do
  local user, device = string.match(member, '^([^:]*):(.*)$')
  room_remove(user, device)
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {due, first[2] or '', room_emitted}
