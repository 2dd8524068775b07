-- The backend removes a user from a room (DELETE /api/rooms/{room}/members/{user}),
-- under any policy: every device of the user leaves at once, the others
-- get its `room_leave` (with "removed":true, which also tells each removed
-- device's own session to drop the room), and a session's own rejoin of
-- the membership it finds gone is refused for a lease TTL. Under `members`
-- the user also leaves the list, so that a join of its is refused.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] user,
-- ARGV[6] 1 to take the user off the member list, ARGV[7] how long a
-- removal refuses a session's own rejoin, and a grant of the app's backend
-- from before it (`proxy`: the field of the user, when it was removed), ms
--
-- Returns {devices removed, was on the list (1/0), published events}.
local user = ARGV[5]
local from, to = room_user_range(user)
local removed = {}
for _, side in ipairs({VISIBLE, HIDDEN}) do
  for _, entry in ipairs(redis.call('ZRANGEBYLEX', side.index, from, to)) do
    removed[#removed + 1] = string.sub(entry, #user + 2)
  end
end
for _, device in ipairs(removed) do
  room_remove(user, device, ',"removed":true')
  redis.call('HSET', KEYS[11], user .. ':' .. device, ARGV[4])
end
redis.call('HSET', KEYS[11], user, ARGV[4])
if redis.call('PTTL', KEYS[11]) < tonumber(ARGV[7]) then
  redis.call('PEXPIRE', KEYS[11], ARGV[7])
end
local listed = 0
if ARGV[6] == '1' then
  listed = redis.call('ZREM', KEYS[10], user)
end
return {removed, listed, room_emitted}
