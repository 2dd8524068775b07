-- A device joins a room, or replaces its state (and its visibility) when
-- it is in it already: a rejoin after a reconnect within the membership's
-- deadline is no leave and no join, only an update when the state changed.
-- A device whose user turned invisible (or visible again) moves between
-- the visible and the hidden members: the others see it leave (or join).
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2] user, ARGV[3] device, ARGV[4] state (JSON object),
-- ARGV[5] now ms, ARGV[6] deadline ms, ARGV[7] owner (the connection),
-- ARGV[8] most devices in the room, ARGV[9] most users for a member list,
-- ARGV[10] 1 when the user is invisible
--
-- Returns {kind, first, seq, users, devices, members, own hidden}: kind is
-- joined, updated, full or taken (a newer connection of the device holds
-- the membership); first 1 when the user joined the room with it
-- (as the others see it); members the HGETALL of KEYS[1] when users <=
-- ARGV[9], else 0; own hidden the user's hidden members, as pairs; then
-- the events it published.
local user, device, state = ARGV[2], ARGV[3], ARGV[4]
local hidden = ARGV[10] == '1'
local member = user .. ':' .. device
local home, away = KEYS[1], KEYS[6]
if hidden then
  home, away = KEYS[6], KEYS[1]
end
local to = nil
if hidden then
  to = 'user'
end
local kind, first = 'updated', false
local old = redis.call('HGET', home, member)
local moved = redis.call('HGET', away, member)
if old or moved then
  local joined_at, owner, old_state = room_value(old or moved)
  -- A newer connection of the device holds it: an older one that has not
  -- heard of its takeover yet must not take it back.
  if not room_not_older(ARGV[7], owner) then
    return {'taken', 0, 0, 0, 0, 0, {}, {}}
  end
  redis.call('HSET', home, member, joined_at .. '|' .. ARGV[7] .. '|' .. state)
  redis.call('ZADD', KEYS[2], ARGV[6], member)
  if moved then
    redis.call('HDEL', away, member)
    -- To the others it comes or goes; the user's own devices saw it all
    -- along.
    if hidden then
      room_emit('leave', user, device, room_tick(), 'others', flag('last', room_count_out(user)))
    else
      first = room_count_in(user)
      room_emit('join', user, device, room_tick(), 'others',
        ',"state":' .. state .. ',"joined_at":' .. joined_at .. flag('first', first))
    end
  end
  if old_state ~= state then
    room_emit('update', user, device, room_tick(), to, ',"state":' .. state)
  end
else
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[8]) then
    return {'full', 0, 0, 0, 0, 0, {}, {}}
  end
  kind = 'joined'
  redis.call('HSET', home, member, ARGV[5] .. '|' .. ARGV[7] .. '|' .. state)
  redis.call('ZADD', KEYS[2], ARGV[6], member)
  if hidden then
    first = room_own(user) == 1
  else
    first = room_count_in(user)
  end
  room_emit('join', user, device, room_tick(), to,
    ',"state":' .. state .. ',"joined_at":' .. ARGV[5] .. flag('first', first))
end
local users, devices = room_counts()
local members, own = room_listing(user, tonumber(ARGV[9]))
local seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
return {kind, first and 1 or 0, seq, users, devices, members, own, room_emitted}
