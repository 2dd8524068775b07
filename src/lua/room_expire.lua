-- The room deadline pass: removes the memberships whose deadline has
-- passed (their device's node died, or the device vanished), each with the
-- same leave as a clean one; then checks that the room's counts and
-- indexes are its memberships, and repairs them when they are not.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms (the pass's),
-- ARGV[5] most memberships to remove, ARGV[6] the lease TTL in ms
--
-- Returns {removed, next, repaired, published events}: the members
-- removed, the earliest deadline left (as a string) or '' when the room is
-- empty, how many entries the reconciliation repaired, and the leaves it
-- published.
local now = tonumber(ARGV[4])
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
for _, member in ipairs(due) do
  local user, device = string.match(member, '^([^:]*):(.*)$')
  if user then
    room_remove(user, device)
  else
    -- Not a member the steps write: dropped.
    redis.call('ZREM', KEYS[2], member)
  end
end

-- Reconciliation: each side's user counts and index must be its members.
-- Cheap checks first; the full repair only when one fails (nothing the
-- steps do makes them disagree, so this is for what went wrong elsewhere,
-- or for a room written before the indexes existed).
local repaired = 0
for _, side in ipairs({VISIBLE, HIDDEN}) do
  local n = redis.call('HLEN', side.values)
  local counted = 0
  for _, c in ipairs(redis.call('HVALS', side.users)) do
    counted = counted + tonumber(c)
  end
  if counted ~= n or redis.call('ZCARD', side.index) ~= n then
    local by_user = {}
    redis.call('DEL', side.users, side.index)
    for _, m in ipairs(redis.call('HKEYS', side.values)) do
      local u, d = string.match(m, '^([^:]*):(.*)$')
      by_user[u] = (by_user[u] or 0) + 1
      redis.call('ZADD', side.index, 0, u .. ' ' .. d)
    end
    for u, c in pairs(by_user) do
      redis.call('HSET', side.users, u, c)
    end
    repaired = repaired + 1
  end
end
if redis.call('ZCARD', KEYS[2]) ~= redis.call('HLEN', KEYS[1]) + redis.call('HLEN', KEYS[6]) then
  -- A membership without a deadline would never lapse: it gets one a TTL
  -- away, which a live device's refreshes push on and a dead one's lets
  -- lapse. A deadline without a membership is dropped.
  for _, key in ipairs({KEYS[1], KEYS[6]}) do
    for _, m in ipairs(redis.call('HKEYS', key)) do
      if not redis.call('ZSCORE', KEYS[2], m) then
        redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), m)
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
room_gc()
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
return {due, first[2] or '', repaired, room_emitted}
