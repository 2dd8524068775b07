-- Shared by the room steps (prepended to each). Every room step touches
-- only the keys of one room, which share its hash tag:
--
-- KEYS[1] presence-room:{r:<room>}            member -> "<joined_at>|<owner>|<state>"
-- KEYS[2] presence-room-deadlines:{r:<room>}  member -> deadline ms
-- KEYS[3] presence-room-users:{r:<room>}      user -> devices in the room
-- KEYS[4] presence-room-meta:{r:<room>}       seq (the room's event clock)
-- KEYS[5] presence-room-events:{r:<room>}     the room's sharded channel
--
-- A member is "<user>:<device>" (ids hold no ':'). Events are published on
-- KEYS[5] as one JSON object: e (join, leave, update), room, user, device,
-- seq, users and devices (the counts after the step), and first, last or
-- state as the kind wants.

local room_id = ARGV[1]

-- joined_at, owner and state of a member's value.
local function room_value(v)
  return string.match(v, '^(%d+)|([^|]*)|(.*)$')
end

local function room_counts()
  return redis.call('HLEN', KEYS[3]), redis.call('ZCARD', KEYS[2])
end

local function room_emit(kind, user, device, seq, users, devices, extra)
  redis.call('SPUBLISH', KEYS[5], '{"e":"' .. kind .. '","room":' .. cjson.encode(room_id)
    .. ',"user":' .. cjson.encode(user) .. ',"device":' .. cjson.encode(device)
    .. ',"seq":' .. seq .. ',"users":' .. users .. ',"devices":' .. devices .. extra .. '}')
end

-- Removes one member: its value, its deadline, one device of its user (the
-- user's entry goes with the last one, which the event marks last), and
-- the room's counters once it is empty. Returns seq, last (0/1), users,
-- devices.
local function room_remove(user, device)
  local member = user .. ':' .. device
  redis.call('HDEL', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
  local last = 0
  if redis.call('HINCRBY', KEYS[3], user, -1) <= 0 then
    redis.call('HDEL', KEYS[3], user)
    last = 1
  end
  local seq = redis.call('HINCRBY', KEYS[4], 'seq', 1)
  local users, devices = room_counts()
  room_emit('leave', user, device, seq, users, devices,
    ',"last":' .. (last == 1 and 'true' or 'false'))
  if devices == 0 then
    redis.call('DEL', KEYS[4])
  end
  return seq, last, users, devices
end
