-- A member replaces its state; the others (or, for a hidden member, its
-- own user's other devices) get an update.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] user, ARGV[3] device, ARGV[4] state (JSON object),
-- ARGV[5] owner (the connection that joined)
--
-- Returns {kind}: updated, same (the state did not change), absent (not a
-- member) or taken (another connection holds it).
local user, device, state = ARGV[2], ARGV[3], ARGV[4]
local member = user .. ':' .. device
local home, to = KEYS[1], nil
local old = redis.call('HGET', home, member)
if not old then
  home, to = KEYS[6], 'user'
  old = redis.call('HGET', home, member)
end
if not old then
  return {'absent'}
end
local joined_at, owner, old_state = room_value(old)
if owner ~= ARGV[5] then
  return {'taken'}
end
if old_state == state then
  return {'same'}
end
redis.call('HSET', home, member, joined_at .. '|' .. owner .. '|' .. state)
room_emit('update', user, device, room_tick(), to, ',"state":' .. state)
return {'updated', room_emitted}
