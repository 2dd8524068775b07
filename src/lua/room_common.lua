-- Shared by the room steps (prepended to each). Every room step touches
-- only the keys of one room, which share its hash tag:
--
-- KEYS[1] presence-room:{r:<room>}            member -> "<joined_at>|<owner>|<state>"
-- KEYS[2] presence-room-deadlines:{r:<room>}  member -> deadline ms (hidden ones too)
-- KEYS[3] presence-room-users:{r:<room>}      user -> visible devices in the room
-- KEYS[4] presence-room-meta:{r:<room>}       seq (the room's event clock)
-- KEYS[5] presence-room-events:{r:<room>}     the room's sharded channel
-- KEYS[6] presence-room-hidden:{r:<room>}     the hidden members, as KEYS[1]
--
-- A member is "<user>:<device>" (ids hold no ':'). A hidden member (its
-- user is invisible) is in KEYS[6] instead of KEYS[1]: not counted, and
-- its events go to its own user's devices only ("to":"user"). Events are
-- published on KEYS[5] as one JSON object: e (join, leave, update), room,
-- user, device, seq, users and devices (the visible counts after the
-- step), to (absent: every member; "user": the user's own devices;
-- "others": everyone but them), and first, last or state as the kind
-- wants.

local room_id = ARGV[1]

-- Every event this step published, in order: the step's reply ends with
-- it, so that the node that ran the step (and only that one) can queue its
-- webhooks.
local room_emitted = {}

-- joined_at, owner and state of a member's value.
local function room_value(v)
  return string.match(v, '^(%d+)|([^|]*)|(.*)$')
end

-- Whether lease value `a` is `b`'s or a later one: values are decimal
-- numbers past what a Lua number holds exactly, so they compare as text
-- (a longer one is larger).
local function room_not_older(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a >= b
end

-- Visible users and devices.
local function room_counts()
  return redis.call('HLEN', KEYS[3]), redis.call('HLEN', KEYS[1])
end

-- The user's devices in the room, visible and hidden.
local function room_own(user)
  local n = tonumber(redis.call('HGET', KEYS[3], user) or '0')
  local prefix = user .. ':'
  for _, m in ipairs(redis.call('HKEYS', KEYS[6])) do
    if string.sub(m, 1, #prefix) == prefix then
      n = n + 1
    end
  end
  return n
end

local function room_emit(kind, user, device, seq, to, extra)
  local users, devices = room_counts()
  local target = ''
  if to then
    target = ',"to":"' .. to .. '"'
  end
  local payload = '{"e":"' .. kind .. '","room":' .. cjson.encode(room_id)
    .. ',"user":' .. cjson.encode(user) .. ',"device":' .. cjson.encode(device)
    .. ',"seq":' .. string.format('%d', seq) .. ',"users":' .. users .. ',"devices":' .. devices .. target
    .. extra .. '}'
  redis.call('SPUBLISH', KEYS[5], payload)
  room_emitted[#room_emitted + 1] = payload
end

-- The room's clock, one tick on: never below the time in ms, so that it
-- keeps increasing when the room empties (its meta goes with it) or Redis
-- loses its data, and an event's `<room>:<seq>` is never used twice.
local function room_tick()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
  if now > seq then
    seq = now
  else
    seq = seq + 1
  end
  redis.call('HSET', KEYS[4], 'seq', string.format('%d', seq))
  return seq
end

local function flag(name, v)
  return ',"' .. name .. '":' .. (v and 'true' or 'false')
end

-- One more visible device of `user`; true when it is the user's first.
local function room_count_in(user)
  return redis.call('HINCRBY', KEYS[3], user, 1) == 1
end

-- One visible device of `user` fewer; true when it was the user's last.
local function room_count_out(user)
  if redis.call('HINCRBY', KEYS[3], user, -1) <= 0 then
    redis.call('HDEL', KEYS[3], user)
    return true
  end
  return false
end

-- Removes one member, visible or hidden, with its leave; deletes the
-- room's clock once the room is empty.
local function room_remove(user, device)
  local member = user .. ':' .. device
  local hidden = redis.call('HDEL', KEYS[1], member) == 0
  redis.call('ZREM', KEYS[2], member)
  local last, to
  if hidden then
    if redis.call('HDEL', KEYS[6], member) == 0 then
      -- A deadline without a membership (only a loss of data makes one):
      -- nobody was in the room, nobody leaves it.
      return false
    end
    last, to = room_own(user) == 0, 'user'
  else
    last = room_count_out(user)
  end
  room_emit('leave', user, device, room_tick(), to, flag('last', last))
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[4])
  end
  return last
end

-- The member list for a room frame: the visible members when there are at
-- most `max` users (else 0), and `user`'s own hidden members.
local function room_listing(user, max)
  local members = 0
  if redis.call('HLEN', KEYS[3]) <= max then
    members = redis.call('HGETALL', KEYS[1])
  end
  local own = {}
  local prefix = user .. ':'
  local hidden = redis.call('HGETALL', KEYS[6])
  for i = 1, #hidden, 2 do
    if string.sub(hidden[i], 1, #prefix) == prefix then
      own[#own + 1] = hidden[i]
      own[#own + 1] = hidden[i + 1]
    end
  end
  return members, own
end
