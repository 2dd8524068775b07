-- The room deadline pass: removes the memberships whose deadline has
-- passed (their device's node died, or the device vanished), each with the
-- same leave as a clean one.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] now ms, ARGV[3] most memberships to remove,
-- ARGV[4] the lease TTL in ms
--
-- Returns {removed, next, repaired, published events}: the members
-- removed, the earliest deadline left (as a string) or '' when the room is
-- empty, how many entries the reconciliation repaired, and the leaves it
-- published.
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, member in ipairs(due) do
  local user, device = string.match(member, '^([^:]*):(.*)$')
  if user then
    room_remove(user, device)
  else
    -- Not a member the steps write: dropped.
    redis.call('ZREM', KEYS[2], member)
  end
end

-- Reconciliation: the counts must be the memberships. Cheap checks first;
-- the full repair only when one fails (nothing the steps do makes them
-- disagree, so this is for what went wrong elsewhere).
local repaired = 0
local counted = 0
for _, n in ipairs(redis.call('HVALS', KEYS[3])) do
  counted = counted + tonumber(n)
end
if counted ~= redis.call('HLEN', KEYS[1]) then
  local by_user = {}
  for _, m in ipairs(redis.call('HKEYS', KEYS[1])) do
    local u = string.match(m, '^([^:]*):')
    by_user[u] = (by_user[u] or 0) + 1
  end
  redis.call('DEL', KEYS[3])
  for u, n in pairs(by_user) do
    redis.call('HSET', KEYS[3], u, n)
  end
  repaired = repaired + 1
end
if redis.call('ZCARD', KEYS[2]) ~= redis.call('HLEN', KEYS[1]) + redis.call('HLEN', KEYS[6]) then
  -- A membership without a deadline would never lapse: it gets one a TTL
  -- away, which a live device's refreshes push on and a dead one's lets
  -- lapse. A deadline without a membership is dropped.
  for _, key in ipairs({KEYS[1], KEYS[6]}) do
    for _, m in ipairs(redis.call('HKEYS', key)) do
      if not redis.call('ZSCORE', KEYS[2], m) then
        redis.call('ZADD', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[4]), m)
        repaired = repaired + 1
      end
    end
  end
  for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if redis.call('HEXISTS', KEYS[1], m) == 0 and redis.call('HEXISTS', KEYS[6], m) == 0 then
      redis.call('ZREM', KEYS[2], m)
      repaired = repaired + 1
    end
  end
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {due, first[2] or '', repaired, room_emitted}
