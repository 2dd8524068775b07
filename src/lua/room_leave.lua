-- A device leaves a room (a leave frame, its connection closed, or its
-- device removed over HTTP).
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] user,
-- ARGV[6] device, ARGV[7] owner: the connection that joined, so that a late leave of an
-- old connection does not remove the membership a newer connection of the
-- device holds; '' removes whoever holds it.
--
-- Returns {kind, last, published events}: kind is left, absent (not a
-- member) or taken (another connection of the device holds it).
local user, device = ARGV[5], ARGV[6]
local _, old = room_find(user .. ':' .. device)
if not old then
  return {'absent', 0, {}}
end
if ARGV[7] ~= '' then
  local _, owner = room_value(old)
  if owner ~= ARGV[7] then
    return {'taken', 0, {}}
  end
end
local last = room_remove(user, device) and 1 or 0
return {'left', last, room_emitted}
