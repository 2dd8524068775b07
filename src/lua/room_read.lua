-- A room as it is now, in one atomic read.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] most users for a member list, ARGV[3] the reader's
-- user ('' for none), whose own hidden members are listed too, ARGV[4] 1
-- to list every hidden member instead (the service view)
--
-- Returns {seq, users, devices, members, own hidden}: members the HGETALL
-- of KEYS[1] when users <= ARGV[2], else 0.
local users, devices = room_counts()
local members, own = room_listing(ARGV[3], tonumber(ARGV[2]))
if ARGV[4] == '1' then
  own = redis.call('HGETALL', KEYS[6])
elseif ARGV[3] == '' then
  own = {}
end
return {tonumber(redis.call('HGET', KEYS[4], 'seq') or '0'), users, devices, members, own}
