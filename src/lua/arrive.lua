-- Claim or refresh one device lease, and count the device if it is new.
-- The atomic "device here" step: a connect, a refresh and a re-assert after
-- Redis lost its data all go through it.
--
-- KEYS[1] presence:{<user>}:<device>   the device lease
-- KEYS[2] presence-count:{<user>}      live device counter
-- KEYS[3] presence-status:{<user>}     the user's hash: d:<device> per counted
--                                      device (the run number of the node
--                                      holding it); status, text, since,
--                                      privacy, last_seen, seq
-- ARGV[1] lease owner (this connection's value)
-- ARGV[2] lease TTL in ms
-- ARGV[3] device id
-- ARGV[4] now, epoch ms
-- ARGV[5] mode: "connect" takes the lease from any older connection, and
--         marks the device not paused (a resume); "refresh" keeps it only
--         while this connection still owns it; "pause" is a refresh (ARGV[2]
--         the grace) that marks the device paused, `i:<device>` holding the
--         end of the grace: a user whose devices are all paused is idle
-- ARGV[6] user id
-- ARGV[7] the user's events channel, presence-events:{<user>} (SPUBLISH)
-- ARGV[8] status this connection last knew for its user ("" when none)
-- ARGV[9] that status's text ("" when none)
-- ARGV[10] that status's `since`, epoch ms
-- ARGV[11] most devices the user may have (connect only)
-- ARGV[12] show_online this connection last knew ("" when none)
-- ARGV[13] show_last_seen this connection last knew ("" when none)
-- ARGV[14] the run number of this connection's node (presence-run:<run>)
-- ARGV[15] when the status this connection last knew ends, epoch ms ("0": never)
-- ARGV[16] the device's kind (web, mobile...), written as k:<device> when
--          the device is claimed or counted ("": leave it as it is; "other",
--          the default, is no field)
--
-- Returns {held, came_online, status, text, since, show_online, show_last_seen,
-- until, replaced}, or just {held, came_online} for a refresh that holds the lease and
-- finds status, text, since, privacy and until exactly as ARGV[8..10, 12, 13,
-- 15] (the common case: the refreshing connection already knows them):
--   held        1 when the lease now belongs to ARGV[1], 0 when another
--               connection owns it (refresh only: this connection was replaced),
--               -1 when the user already has ARGV[11] other devices (connect
--               only; nothing was changed)
--   came_online 1 when this call made the user's first device arrive; the
--               `online` event has then been published (a later device
--               publishes a `devices_only` event with the new count)
--   status, text, since: the user's chosen status now ("" when none)
--   show_online, show_last_seen: the user's privacy settings ("" when unset)
--   replaced    (connect only) the lease value this call took the device
--               over from, "" when none: its socket, if one holds it, is
--               told at once rather than at its next refresh
local current = redis.call('GET', KEYS[1])
if ARGV[5] ~= 'connect' and current and current ~= ARGV[1] then
  return {0, 0, '', '', '0', '', '', '0'}
end
local field = 'd:' .. ARGV[3]
if ARGV[5] == 'connect' and redis.call('HEXISTS', KEYS[3], field) == 0 then
  -- Counted from the hash itself, not the counter: the limit holds even
  -- while a counter awaits repair.
  local devices = 0
  for _, f in ipairs(redis.call('HKEYS', KEYS[3])) do
    if string.sub(f, 1, 2) == 'd:' then devices = devices + 1 end
  end
  if devices >= tonumber(ARGV[11]) then
    return {-1, 0, '', '', '0', '', '', '0'}
  end
end
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
-- One read of everything a holder re-asserts: status, text, since, then
-- the privacy settings.
local st = redis.call('HMGET', KEYS[3], 'status', 'text', 'since', 'show_online', 'show_last_seen', 'seq',
  'until')
local restored_until = false
-- Redis lost the status (restart without persistence) or holds an older one
-- re-asserted by another device: restore the newest this connection knew.
if ARGV[8] ~= '' and (not st[1] or tonumber(st[3] or '0') < tonumber(ARGV[10])) then
  redis.call('HSET', KEYS[3], 'status', ARGV[8], 'since', ARGV[10])
  if ARGV[9] == '' then
    redis.call('HDEL', KEYS[3], 'text')
    st[2] = false
  else
    redis.call('HSET', KEYS[3], 'text', ARGV[9])
    st[2] = ARGV[9]
  end
  -- The status's end goes with it (and the caller puts it back in the due
  -- index, presence-until:{b<k>}).
  local known_until = ARGV[15] or '0'
  if known_until == '0' or known_until == '' then
    redis.call('HDEL', KEYS[3], 'until')
    st[7] = false
  else
    redis.call('HSET', KEYS[3], 'until', known_until)
    st[7] = known_until
    -- The caller puts the due-index entry back: answer in full.
    restored_until = true
  end
  st[1], st[3] = ARGV[8], ARGV[10]
end
-- Privacy settings Redis lost are restored too, before anything is
-- announced: a user who hides must not flash online.
local known_online, known_last_seen = ARGV[12] or '', ARGV[13] or ''
if not st[4] and known_online ~= '' then
  redis.call('HSET', KEYS[3], 'show_online', known_online)
  st[4] = known_online
end
if not st[5] and known_last_seen ~= '' then
  redis.call('HSET', KEYS[3], 'show_last_seen', known_last_seen)
  st[5] = known_last_seen
end
-- The user's clock, `seq`, is raised to this refresh: besides ordering the
-- transitions it dates the last activity of any device (a lapsed lease's
-- last seen), one field for both.
if tonumber(st[6] or '0') < tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[3], 'seq', ARGV[4])
end
local status, text, since = st[1] or '', st[2] or '', st[3] or '0'
local show_online, show_last_seen = st[4] or '', st[5] or ''
local status_until = st[7] or '0'
local came_online = 0
-- Whether the user was idle before this step, where the step may change
-- it (nil elsewhere): a connect of a paused device or of a new one, a pause.
local idle_before = nil
local paused_field = 'i:' .. ARGV[3]
if ARGV[5] == 'connect' then
  local paused = redis.call('HEXISTS', KEYS[3], paused_field) == 1
  if paused or redis.call('HEXISTS', KEYS[3], field) == 0 then
    idle_before = user_idle(KEYS[3])
  end
  if paused then redis.call('HDEL', KEYS[3], paused_field) end
elseif ARGV[5] == 'pause' then
  idle_before = user_idle(KEYS[3])
  redis.call('HSET', KEYS[3], paused_field, tonumber(ARGV[4]) + tonumber(ARGV[2]))
end
-- The device's field names the node run holding it: a new connection
-- writes it even where the device was already counted (it may have moved
-- from another node), a refresh only where it was missing.
local added
if ARGV[5] == 'connect' then
  added = redis.call('HSET', KEYS[3], field, ARGV[14])
else
  added = redis.call('HSETNX', KEYS[3], field, ARGV[14])
end
-- `other`, the default, is no field at all: a plain device costs nothing.
-- A device that comes back as another kind (a takeover, a reconnect) is
-- news to those who see the kinds.
local kind_changed = false
if (added == 1 or ARGV[5] == 'connect') and (ARGV[16] or '') ~= '' then
  local kind_field = 'k:' .. ARGV[3]
  local old_kind = redis.call('HGET', KEYS[3], kind_field) or 'other'
  if ARGV[16] == 'other' then
    redis.call('HDEL', KEYS[3], kind_field)
  else
    redis.call('HSET', KEYS[3], kind_field, ARGV[16])
  end
  kind_changed = old_kind ~= ARGV[16]
end
if added == 1 then
  local count = redis.call('INCR', KEYS[2])
  if count == 1 then
    publish_event(ARGV[7], KEYS[3], ARGV[6], 1, nil, next_seq(KEYS[3], ARGV[4]))
    came_online = 1
  else
    publish_event(ARGV[7], KEYS[3], ARGV[6], count, nil, next_seq(KEYS[3], ARGV[4]), true, idle_before)
  end
elseif kind_changed or idle_before ~= nil then
  local count = tonumber(redis.call('GET', KEYS[2]) or '0')
  -- A kind that changed is news for the device counts' watchers; a flip of
  -- the idle mark for every watcher; anything else is no news.
  if count > 0 and (kind_changed or user_idle(KEYS[3]) ~= idle_before) then
    publish_event(ARGV[7], KEYS[3], ARGV[6], count, nil, next_seq(KEYS[3], ARGV[4]), true, idle_before)
  end
end
if ARGV[5] == 'refresh' and status == ARGV[8] and text == ARGV[9] and since == ARGV[10]
    and show_online == known_online and show_last_seen == known_last_seen
    and status_until == (ARGV[15] or '0') and not restored_until then
  return {1, came_online}
end
local replaced = ''
if ARGV[5] == 'connect' and current and current ~= ARGV[1] then
  replaced = current
end
return {1, came_online, status, text, since, show_online, show_last_seen, status_until, replaced}
