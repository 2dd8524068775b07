-- A member relays a signal: published on the room's channel, never
-- stored. The membership decides who hears it, not the sender's own idea
-- of its status: a hidden member's signals go to its own user's devices
-- only, from the moment its status sweep hid it, on every node.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] user,
-- ARGV[6] device, ARGV[7] owner (the connection that joined), ARGV[8] data
-- (JSON)
--
-- Returns sent (to every member), hidden (to the user's own devices), absent
-- (not a member: it left, lapsed or was removed) or taken (another
-- connection of the device holds the membership).
local user, device = ARGV[5], ARGV[6]
local side, old = room_find(user .. ':' .. device)
if not old then
  return 'absent'
end
local _, owner = room_value(old)
if owner ~= ARGV[7] then
  return 'taken'
end
local to, sent = '', 'sent'
if side == HIDDEN then
  to, sent = ',"to":"user"', 'hidden'
end
redis.call('SPUBLISH', KEYS[5], '{"e":"signal","room":' .. cjson.encode(room_id)
  .. ',"user":' .. cjson.encode(user) .. ',"device":' .. cjson.encode(device) .. to
  .. ',"data":' .. ARGV[8] .. '}')
return sent
