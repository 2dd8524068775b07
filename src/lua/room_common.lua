-- Shared by the room steps (prepended to each). Every room step touches
-- only the keys of one room, which share its hash tag:
--
-- KEYS[1] presence-room:{r:<room>}               visible member -> "<joined_at>|<owner>|<state>"
-- KEYS[2] presence-room-deadlines:{r:<room>}     member -> deadline ms (hidden ones too)
-- KEYS[3] presence-room-users:{r:<room>}         user -> its visible devices in the room
-- KEYS[4] presence-room-meta:{r:<room>}          seq (the room's event clock); large (counts mode)
-- KEYS[5] presence-events-room:{r:<room>}        the room's sharded channel
-- KEYS[6] presence-room-hidden:{r:<room>}        hidden member -> value, as KEYS[1]
-- KEYS[7] presence-room-index:{r:<room>}         "<user> <device>" of each visible member, score 0
-- KEYS[8] presence-room-hidden-index:{r:<room>}  likewise for the hidden members
-- KEYS[9] presence-room-hidden-users:{r:<room>}  user -> its hidden devices in the room
-- KEYS[10] presence-room-allowed:{r:<room>}      users a `members` room lets in, score 0
-- KEYS[11] presence-room-removed:{r:<room>}      member -> when it was removed (recent removals), and user -> when it was
-- KEYS[12] presence-feed:{r:<room>}              the room's event feed, when on (room_record)
-- KEYS[13] presence-feed-log:{b<k>}, KEYS[14] presence-feed-moved:{b<k>}: its bucket's, where the
--          step writes the log itself (no cluster)
--
-- ARGV[1] room, ARGV[2] most users and ARGV[3] most devices of a room
-- whose members get every event (above either, counts), ARGV[4] the
-- node's time in ms, for every step. (Not Redis's TIME: the documented
-- least-privilege ACL user may not run it.)
--
-- A member is "<user>:<device>" (ids hold no ':'). A member is visible,
-- or hidden (its user is invisible): in KEYS[6], KEYS[8] and KEYS[9]
-- instead of KEYS[1], KEYS[7] and KEYS[3]; not counted, and its events go
-- to its own user's devices only ("to":"user"). All of one user's devices
-- in a room are on one side: a step that sets a device's visibility moves
-- the user's others with it. The indexes hold "<user> <device>" (a space:
-- it sorts before every id character) so that a range by user is a page,
-- and a reader's own hidden devices are found without reading the others'.
--
-- Events are published on KEYS[5] as one JSON object: e (join, leave,
-- update), room, user, device, seq, users and devices (the visible counts
-- after the step), large (true while the room is in counts mode),
-- switched (true on the event whose step switched the mode), to
-- (absent: every member; "user": the user's own devices; "others":
-- everyone but them), and first, last or state as the kind wants.

local room_id = ARGV[1]
local room_now = tonumber(ARGV[4])

local VISIBLE = {values = KEYS[1], index = KEYS[7], users = KEYS[3]}
local HIDDEN = {values = KEYS[6], index = KEYS[8], users = KEYS[9]}

-- Every event this step published, in order: the step's reply ends with
-- it, so that the node that ran the step (and only that one) can queue its
-- webhooks.
local room_emitted = {}

-- The room's event feed, KEYS[12] when the caller passed it (the feed is
-- on): a user's first device joining and its last leaving, as those who
-- see it see it, are recorded there in this same step as
-- `<seq>|<j or l>|<at>|[user, users, devices]` (see event.lua); beyond 256
-- held, the oldest go, counted in presence-feed-lost:{r:<room>}. Where
-- the caller passed the bucket's log and marks too (KEYS[13], KEYS[14]),
-- the step writes the log itself (`feed_direct.lua`).
local function room_record(kind, user, seq, users, devices)
  local key = KEYS[12]
  if not key then return end
  local entry = string.format('%d', seq) .. '|' .. kind .. '|'
    .. string.format('%d', room_now) .. '|' .. cjson.encode({user, users, devices})
  if KEYS[14] then
    local m = redis.call('HMGET', KEYS[4], 'fs', 'fc')
    local since, count, keep = feed_mark(m[1], m[2], room_now)
    redis.call('HSET', KEYS[4], 'fs', since, 'fc', count)
    feed_direct(KEYS[13], KEYS[14], string.sub(key, 16, -2), entry, keep)
    return
  end
  local n = redis.call('RPUSH', key, entry)
  if n > 256 then
    redis.call('LPOP', key, n - 256)
    redis.call('INCRBY', 'presence-feed-lost:' .. string.sub(key, 15), n - 256)
  end
end

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

-- The side that holds `member` and its value; nil when it is no member.
local function room_find(member)
  local v = redis.call('HGET', KEYS[1], member)
  if v then
    return VISIBLE, v
  end
  v = redis.call('HGET', KEYS[6], member)
  if v then
    return HIDDEN, v
  end
  return nil, nil
end

-- The index range of one user's entries: every "<user> <device>".
local function room_user_range(user)
  return '[' .. user .. ' ', '(' .. user .. '!'
end

-- The devices of `user` on `side`, sorted.
local function room_side_devices(side, user)
  local from, to = room_user_range(user)
  local out = {}
  for i, entry in ipairs(redis.call('ZRANGEBYLEX', side.index, from, to)) do
    out[i] = string.sub(entry, #user + 2)
  end
  return out
end

-- Puts a member on `side`; true when it is the user's first device there.
local function room_side_add(side, user, device, value)
  redis.call('HSET', side.values, user .. ':' .. device, value)
  redis.call('ZADD', side.index, 0, user .. ' ' .. device)
  return redis.call('HINCRBY', side.users, user, 1) == 1
end

-- Takes a member off `side`: whether it was there, and whether it was the
-- user's last device there.
local function room_side_del(side, user, device)
  if redis.call('HDEL', side.values, user .. ':' .. device) == 0 then
    return false, false
  end
  redis.call('ZREM', side.index, user .. ' ' .. device)
  if redis.call('HINCRBY', side.users, user, -1) <= 0 then
    redis.call('HDEL', side.users, user)
    return true, true
  end
  return true, false
end

-- Whether the room is in counts mode, brought up to date with its counts,
-- and whether that just switched: it enters above either limit, and leaves
-- only once both counts are a tenth (at least one) below them, so that one
-- member going and coming at the edge does not switch every member's view
-- back and forth.
local function room_mode()
  local users, devices = room_counts()
  local max_users, max_devices = tonumber(ARGV[2]), tonumber(ARGV[3])
  local large = redis.call('HGET', KEYS[4], 'large') == '1'
  if not large and (users > max_users or devices > max_devices) then
    redis.call('HSET', KEYS[4], 'large', '1')
    return true, true
  end
  if large then
    local low_users = max_users - math.max(1, math.floor(max_users / 10))
    local low_devices = max_devices - math.max(1, math.floor(max_devices / 10))
    if users <= low_users and devices <= low_devices then
      redis.call('HDEL', KEYS[4], 'large')
      return false, true
    end
  end
  return large, false
end

local function room_emit(kind, user, device, seq, to, extra)
  local large, switched = room_mode()
  local users, devices = room_counts()
  local target = ''
  if to then
    target = ',"to":"' .. to .. '"'
  end
  if large then
    target = target .. ',"large":true'
  end
  if switched then
    target = target .. ',"switched":true'
  end
  local payload = '{"e":"' .. kind .. '","room":' .. cjson.encode(room_id)
    .. ',"user":' .. cjson.encode(user) .. ',"device":' .. cjson.encode(device)
    .. ',"seq":' .. string.format('%d', seq) .. ',"users":' .. users .. ',"devices":' .. devices .. target
    .. extra .. '}'
  redis.call('SPUBLISH', KEYS[5], payload)
  room_emitted[#room_emitted + 1] = payload
  -- What the webhooks announce (store/rooms/webhooks.rs): not a hidden
  -- member's own events.
  if to ~= 'user' and extra then
    -- A join's flag comes last, after the device's own state.
    if kind == 'join' and string.sub(extra, -12) == '"first":true' then
      room_record('j', user, seq, users, devices)
    elseif kind == 'leave' and string.find(extra, '"last":true', 1, true) then
      room_record('l', user, seq, users, devices)
    end
  end
end

-- The room's clock, one tick on: never below the time in ms, so that it
-- keeps increasing when Redis loses its data, and an event's
-- `<room>:<seq>` is never used twice (an empty room's meta lingers an
-- hour, so that nodes' clocks a little apart do not go back on it).
local function room_tick()
  local seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
  if room_now > seq then
    seq = room_now
  else
    seq = seq + 1
  end
  redis.call('HSET', KEYS[4], 'seq', string.format('%d', seq))
  return seq
end

local function flag(name, v)
  return ',"' .. name .. '":' .. (v and 'true' or 'false')
end

-- The room is empty: its mode goes, and its clock an hour later (see
-- room_tick) unless a join comes back first.
local function room_gc()
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('HDEL', KEYS[4], 'large')
    redis.call('PEXPIRE', KEYS[4], 3600000)
  end
end

-- Removes one member, visible or hidden, with its leave (`extra` added to
-- the event); deletes the room's clock once the room is empty. Returns
-- whether it was the user's last device (as those who saw it see it).
local function room_remove(user, device, extra)
  local member = user .. ':' .. device
  redis.call('ZREM', KEYS[2], member)
  local to = nil
  local was, last = room_side_del(VISIBLE, user, device)
  if not was then
    was, last = room_side_del(HIDDEN, user, device)
    if not was then
      -- A deadline without a membership (only a loss of data makes one):
      -- nobody was in the room, nobody leaves it.
      return false
    end
    to = 'user'
  end
  room_emit('leave', user, device, room_tick(), to, flag('last', last) .. (extra or ''))
  room_gc()
  return last
end

-- Moves every device of `user` in the room to the hidden side (`hidden`)
-- or the visible one, each with its event for the others: a leave going
-- hidden, a join coming back (whose joined_at is `now`: how long it was
-- there unseen is nobody else's business). The user's own devices saw it
-- all along and hear nothing. Returns how many devices moved.
local function room_set_visibility(user, hidden, now)
  local from, to = VISIBLE, HIDDEN
  if not hidden then
    from, to = HIDDEN, VISIBLE
  end
  local devices = room_side_devices(from, user)
  for _, device in ipairs(devices) do
    local member = user .. ':' .. device
    local joined_at, owner, state = room_value(redis.call('HGET', from.values, member))
    local _, last = room_side_del(from, user, device)
    if not hidden then
      joined_at = now
    end
    local first = room_side_add(to, user, device, joined_at .. '|' .. owner .. '|' .. state)
    if hidden then
      room_emit('leave', user, device, room_tick(), 'others', flag('last', last))
    else
      room_emit('join', user, device, room_tick(), 'others',
        ',"state":' .. state .. ',"joined_at":' .. joined_at .. flag('first', first))
    end
  end
  return #devices
end

-- `pairs` (member, value, ...) of `side` for the "<user> <device>"
-- entries given.
local function room_values(side, entries)
  local out = {}
  if #entries == 0 then
    return out
  end
  local members = {}
  for i, entry in ipairs(entries) do
    members[i] = string.gsub(entry, ' ', ':', 1)
  end
  local values = redis.call('HMGET', side.values, unpack(members))
  for i, member in ipairs(members) do
    if values[i] then
      out[#out + 1] = member
      out[#out + 1] = values[i]
    end
  end
  return out
end

-- `user`'s own hidden members, as pairs: only the reader's own, found by
-- its range of the hidden index, whoever else is hidden in the room.
local function room_own_hidden(user)
  if user == '' then
    return {}
  end
  local from, to = room_user_range(user)
  return room_values(HIDDEN, redis.call('ZRANGEBYLEX', KEYS[8], from, to))
end

-- The member list for a room frame: every visible member while the room
-- is not in counts mode (its size is then bounded by ARGV[2] and ARGV[3]),
-- else 0; and `user`'s own hidden members.
local function room_listing(user)
  local members = 0
  if redis.call('HGET', KEYS[4], 'large') ~= '1' then
    members = redis.call('HGETALL', KEYS[1])
  end
  return members, room_own_hidden(user)
end
