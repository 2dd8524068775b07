-- A device joins a room, or replaces its state when it is in it already
-- (a rejoin after a reconnect within the membership's deadline: no leave,
-- no join, only an update when the state changed).
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] user, ARGV[3] device, ARGV[4] state (JSON object),
-- ARGV[5] now ms, ARGV[6] deadline ms, ARGV[7] owner (the connection),
-- ARGV[8] most devices in the room, ARGV[9] most users for a member list
--
-- Returns {kind, first, seq, users, devices, members}: kind is joined,
-- updated or full; first 1 when this is the user's first device in the
-- room; members the HGETALL of KEYS[1] when users <= ARGV[9], else 0.
local user, device, state = ARGV[2], ARGV[3], ARGV[4]
local member = user .. ':' .. device
local old = redis.call('HGET', KEYS[1], member)
local kind, first = 'joined', 0
local seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
if old then
  kind = 'updated'
  local joined_at, _, old_state = room_value(old)
  redis.call('HSET', KEYS[1], member, joined_at .. '|' .. ARGV[7] .. '|' .. state)
  redis.call('ZADD', KEYS[2], ARGV[6], member)
  if old_state ~= state then
    seq = redis.call('HINCRBY', KEYS[4], 'seq', 1)
    local users, devices = room_counts()
    room_emit('update', user, device, seq, users, devices, ',"state":' .. state)
  end
else
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[8]) then
    return {'full', 0, seq, 0, 0, 0}
  end
  redis.call('HSET', KEYS[1], member, ARGV[5] .. '|' .. ARGV[7] .. '|' .. state)
  redis.call('ZADD', KEYS[2], ARGV[6], member)
  if redis.call('HINCRBY', KEYS[3], user, 1) == 1 then
    first = 1
  end
  seq = redis.call('HINCRBY', KEYS[4], 'seq', 1)
  local users, devices = room_counts()
  room_emit('join', user, device, seq, users, devices,
    ',"state":' .. state .. ',"joined_at":' .. ARGV[5]
    .. ',"first":' .. (first == 1 and 'true' or 'false'))
end
local users, devices = room_counts()
local members = 0
if users <= tonumber(ARGV[9]) then
  members = redis.call('HGETALL', KEYS[1])
end
return {kind, first, seq, users, devices, members}
