-- Moves every device of a user in the room to the hidden side or back: the
-- sweep that follows a change of the user's status to invisible or away
-- from it, run room by room over the rooms its devices are in. The others
-- see each device leave (or join, with joined_at now); its own devices
-- hear nothing.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] user,
-- ARGV[6] 1 to hide, 0 to show
--
-- Returns {moved, published events}: how many devices moved.
local moved = room_set_visibility(ARGV[5], ARGV[6] == '1', ARGV[4])
return {moved, room_emitted}
