-- A device joins a room, or replaces its state when it is in it already:
-- a rejoin after a reconnect within the membership's deadline is no leave
-- and no join, only an update when the state changed.
--
-- Visibility: the device joins hidden when its user is invisible (ARGV[11],
-- read from the user's status just before), or when the user's other
-- devices in the room are hidden (a status change whose sweep has not
-- reached this room yet: hidden wins until the caller, reading the status
-- again, settles it with room_visibility.lua). Joining moves the user's
-- other devices in the room to the same side.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] user,
-- ARGV[6] device, ARGV[7] state (JSON object), ARGV[8] deadline ms,
-- ARGV[9] owner (the connection), ARGV[10] most devices in the room (on
-- each side: hidden members are bounded apart, so that a visible joiner's
-- answer depends only on what it may see), ARGV[11] 1 when the user is
-- invisible, ARGV[12] 1 when the room's policy is `members` (the user must
-- be in KEYS[10]), ARGV[13] 1 for the session's own rejoin of a membership
-- it found gone (refused for a device removed lately: KEYS[11]), ARGV[14]
-- when the app's backend let the user in (`proxy`), ms: refused when the
-- user was removed (KEYS[11]'s field of the user) at or after it, so that a
-- grant from before a removal never lets it back; 0 for none
--
-- Returns {kind, first, seq, users, devices, members, own hidden, hidden,
-- published events}: kind is joined, updated, full, taken (a newer
-- connection of the device holds the membership), forbidden (not on the
-- member list), removed (a rejoin of a device removed lately) or revoked
-- (a grant older than the user's removal); first 1 when the user
-- joined the room with it (as those who see it see it); members the
-- HGETALL of KEYS[1] unless the room is in counts mode, else 0; own hidden
-- the user's hidden members, as pairs; hidden 1 when the device is hidden.
local user, device, state, now = ARGV[5], ARGV[6], ARGV[7], ARGV[4]
local member = user .. ':' .. device
if ARGV[12] == '1' and not redis.call('ZSCORE', KEYS[10], user) then
  return {'forbidden', 0, 0, 0, 0, 0, {}, 0, {}}
end
if ARGV[14] ~= '0' then
  local removed_at = redis.call('HGET', KEYS[11], user)
  if removed_at and tonumber(removed_at) >= tonumber(ARGV[14]) then
    return {'revoked', 0, 0, 0, 0, 0, {}, 0, {}}
  end
end
if ARGV[13] == '1' then
  if redis.call('HEXISTS', KEYS[11], member) == 1 then
    return {'removed', 0, 0, 0, 0, 0, {}, 0, {}}
  end
else
  -- A join of the client's own: the policy let it in again.
  redis.call('HDEL', KEYS[11], member)
end
local hidden = ARGV[11] == '1' or redis.call('HEXISTS', KEYS[9], user) == 1
local home = VISIBLE
local to = nil
if hidden then
  home, to = HIDDEN, 'user'
end
local _, old = room_find(member)
if old then
  local _, owner = room_value(old)
  -- A newer connection of the device holds it: an older one that has not
  -- heard of its takeover yet must not take it back.
  if not room_not_older(ARGV[9], owner) then
    return {'taken', 0, 0, 0, 0, 0, {}, 0, {}}
  end
elseif redis.call('HLEN', home.values) >= tonumber(ARGV[10]) then
  return {'full', 0, 0, 0, 0, 0, {}, 0, {}}
end
-- Back in use: its clock stays (see room_gc).
redis.call('PERSIST', KEYS[4])
room_set_visibility(user, hidden, now)
local kind, first = 'updated', false
if old then
  local joined_at, _, old_state = room_value(redis.call('HGET', home.values, member))
  redis.call('HSET', home.values, member, joined_at .. '|' .. ARGV[9] .. '|' .. state)
  redis.call('ZADD', KEYS[2], ARGV[8], member)
  if old_state ~= state then
    room_emit('update', user, device, room_tick(), to, ',"state":' .. state)
  end
else
  kind = 'joined'
  first = room_side_add(home, user, device, now .. '|' .. ARGV[9] .. '|' .. state)
  redis.call('ZADD', KEYS[2], ARGV[8], member)
  room_emit('join', user, device, room_tick(), to,
    ',"state":' .. state .. ',"joined_at":' .. now .. flag('first', first))
end
local users, devices = room_counts()
local members, own = room_listing(user)
local seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
return {kind, first and 1 or 0, seq, users, devices, members, own, hidden and 1 or 0, room_emitted}
