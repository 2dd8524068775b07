-- A member replaces its state; the others get an update.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] user, ARGV[3] device, ARGV[4] state (JSON object),
-- ARGV[5] owner (the connection that joined)
--
-- Returns {kind, seq}: kind is updated, same (the state did not change),
-- absent (not a member) or taken (another connection holds it).
local user, device, state = ARGV[2], ARGV[3], ARGV[4]
local member = user .. ':' .. device
local old = redis.call('HGET', KEYS[1], member)
if not old then
  return {'absent', 0}
end
local joined_at, owner, old_state = room_value(old)
if owner ~= ARGV[5] then
  return {'taken', 0}
end
if old_state == state then
  return {'same', tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')}
end
redis.call('HSET', KEYS[1], member, joined_at .. '|' .. owner .. '|' .. state)
local seq = redis.call('HINCRBY', KEYS[4], 'seq', 1)
local users, devices = room_counts()
room_emit('update', user, device, seq, users, devices, ',"state":' .. state)
return {'updated', seq}
