-- Release one device and uncount it; the atomic "device gone" step shared by
-- a clean close, an expired-key event and the deadline pass. Idempotent: any
-- number of nodes may run it for the same device and at most one of them
-- removes the device and, for the last device, publishes `offline`.
--
-- KEYS[1] presence:{<user>}:<device>   the device lease
-- KEYS[2] presence-count:{<user>}      live device counter
-- KEYS[3] presence-status:{<user>}     the user's hash: d:<device> per counted
--                                      device; status, text, since, privacy,
--                                      last_seen, seq
-- ARGV[1] lease owner of the closing connection, or "" when the lease lapsed
--         (then the device goes only if no lease exists any more), or "*" to
--         take the device away from whoever holds it (DELETE of an HTTP
--         device): the lease is kept as a tombstone until its TTL, so that a
--         socket that held it finds it replaced and closes with 4001
-- ARGV[2] device id
-- ARGV[3] now, epoch ms
-- ARGV[4] user id
-- ARGV[5] the user's events channel, presence-events:{<user>} (SPUBLISH)
--
-- Returns {outcome, went_offline, value, taken}:
--   outcome 0  a lease still exists (another connection's, or not yet lapsed);
--              value = its remaining TTL in ms (-1 when it has none)
--   outcome 1  this call removed the device; went_offline = 1 when it was the
--              user's last one, and value = when it was last seen (the time
--              published, unless the user is invisible: then its last seen
--              is left as it was); otherwise a `devices_only` event with the
--              new count has been published
--   outcome 2  nothing to do: the device was already gone
--   taken      with ARGV[1] "*", the lease value this call turned into the
--              tombstone: the connection to tell (its node closes its socket
--              at once rather than at its next refresh); "" otherwise
local current = redis.call('GET', KEYS[1])
local taken = ''
if current then
  if ARGV[1] == '*' then
    redis.call('SET', KEYS[1], '0', 'KEEPTTL')
    taken = current
  elseif ARGV[1] == '' or current ~= ARGV[1] then
    return {0, 0, redis.call('PTTL', KEYS[1]), taken}
  else
    redis.call('DEL', KEYS[1])
  end
end
if redis.call('HDEL', KEYS[3], 'd:' .. ARGV[2]) == 0 then
  return {2, 0, 0, taken}
end
redis.call('HDEL', KEYS[3], 'k:' .. ARGV[2])
-- A device that was not paused leaves a user who was not idle: if every
-- device left is paused, the user is idle now, for every watcher. (One that
-- was paused changes nothing of the mark.)
local idle_before = nil
if redis.call('HDEL', KEYS[3], 'i:' .. ARGV[2]) == 0 then idle_before = false end
local count = redis.call('DECR', KEYS[2])
if count > 0 then
  publish_event(ARGV[5], KEYS[3], ARGV[4], count, nil, next_seq(KEYS[3], ARGV[3], ARGV[1] == ''), true,
    idle_before)
  return {1, 0, 0, taken}
end
redis.call('DEL', KEYS[2])
-- A lapsed lease was last seen at the user's last activity, not when Redis
-- noticed: `seq`, raised to every refresh and every transition a client made.
local last_seen = tonumber(ARGV[3])
if ARGV[1] == '' then
  local active = tonumber(redis.call('HGET', KEYS[3], 'seq') or '0')
  if active and active > 0 and active < last_seen then
    last_seen = active
  end
end
-- last_seen is stored with the transition, so no read ever sees the user
-- offline without it; an invisible user's is left as it was.
local shown = stamp_last_seen(KEYS[3], last_seen)
publish_event(ARGV[5], KEYS[3], ARGV[4], 0, shown, next_seq(KEYS[3], ARGV[3], ARGV[1] == ''))
-- The real time still goes back: it keeps the retention index honest.
return {1, 1, last_seen, taken}
