-- A device leaves a room (a leave frame, or its connection closed).
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] user, ARGV[3] device, ARGV[4] owner: the
-- connection that joined, so that a late leave of an old connection does
-- not remove the membership a newer connection of the device holds; ''
-- removes whoever holds it.
--
-- Returns {kind, last, published events}: kind is left, absent (not a
-- member) or taken (another connection of the device holds it).
local user, device = ARGV[2], ARGV[3]
local member = user .. ':' .. device
local old = redis.call('HGET', KEYS[1], member) or redis.call('HGET', KEYS[6], member)
if not old then
  return {'absent', 0, {}}
end
if ARGV[4] ~= '' then
  local _, owner = room_value(old)
  if owner ~= ARGV[4] then
    return {'taken', 0, {}}
  end
end
local last = room_remove(user, device) and 1 or 0
return {'left', last, room_emitted}
