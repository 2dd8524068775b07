-- A member replaces its state; the others (or, for a hidden member, its
-- own user's other devices) get an update.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] user,
-- ARGV[6] device, ARGV[7] state (JSON object), ARGV[8] owner (the
-- connection that joined)
--
-- Returns {kind, published events}: kind is updated, same (the state did
-- not change), absent (not a member) or taken (another connection holds
-- it).
local user, device, state = ARGV[5], ARGV[6], ARGV[7]
local member = user .. ':' .. device
local side, old = room_find(member)
if not old then
  return {'absent', {}}
end
local joined_at, owner, old_state = room_value(old)
if owner ~= ARGV[8] then
  return {'taken', {}}
end
if old_state == state then
  return {'same', {}}
end
local to = nil
if side == HIDDEN then
  to = 'user'
end
redis.call('HSET', side.values, member, joined_at .. '|' .. owner .. '|' .. state)
room_emit('update', user, device, room_tick(), to, ',"state":' .. state)
return {'updated', room_emitted}
