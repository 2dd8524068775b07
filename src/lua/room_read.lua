-- A room as it is now, in one atomic read.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] most users for a member list
--
-- Returns {seq, users, devices, members}: members the HGETALL of KEYS[1]
-- when users <= ARGV[2], else 0.
local users, devices = room_counts()
local members = 0
if users <= tonumber(ARGV[2]) then
  members = redis.call('HGETALL', KEYS[1])
end
return {tonumber(redis.call('HGET', KEYS[4], 'seq') or '0'), users, devices, members}
