-- A room as a `room` frame shows it, in one atomic read.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms (unused),
-- ARGV[5] the reader's user ('' for none), whose own hidden members are
-- listed too
--
-- Returns {seq, users, devices, members, own hidden, large}: members the
-- HGETALL of KEYS[1] unless the room is in counts mode (its size is then
-- bounded by the list limits), else 0; large 1 in counts mode.
local members, own = room_listing(ARGV[5])
local users, devices = room_counts()
local large = redis.call('HGET', KEYS[4], 'large') == '1'
return {tonumber(redis.call('HGET', KEYS[4], 'seq') or '0'), users, devices, members, own, large and 1 or 0}
