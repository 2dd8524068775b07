-- Repair one user whose devices or counter disagree with the live leases
-- (an expired event was missed and the deadline index lost the lease, a
-- node died between steps, Redis lost part of its data), and emit the
-- transition that the repair implies, once.
--
-- KEYS[1] presence-count:{<user>}      live device counter
-- KEYS[2] presence-status:{<user>}     the user's hash: d:<device> per counted
--                                      device; status, text, since, privacy,
--                                      last_seen, seq
-- KEYS[3..] presence:{<user>}:<device> the lease of each device named in ARGV[4..]
-- ARGV[1] user id
-- ARGV[2] now, epoch ms
-- ARGV[3] the user's events channel, presence-events:{<user>} (SPUBLISH)
-- ARGV[4..] device ids the caller found in the hash (then the feed's time:
--          see event.lua)
--
-- Returns {removed, old_count, new_count, transition}: devices removed for
-- want of a lease, the counter before and after, and 1 when `online` or
-- `offline` was published (a count that changed while the user stays
-- online publishes a `devices_only` event instead).
local removed = 0
local idle_before = user_idle(KEYS[2])
for i = 4, #ARGV - feed_args do
  local lease = KEYS[i - 1]
  if redis.call('EXISTS', lease) == 0 and redis.call('HDEL', KEYS[2], 'd:' .. ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[2], 'k:' .. ARGV[i], 'i:' .. ARGV[i])
    removed = removed + 1
  end
end
local new = 0
for _, f in ipairs(redis.call('HKEYS', KEYS[2])) do
  if string.sub(f, 1, 2) == 'd:' then new = new + 1 end
end
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if old == new then
  return {removed, old, new, 0}
end
if new == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], new)
end
local was_online, is_online = old > 0, new > 0
if was_online == is_online then
  if not is_online then
    return {removed, old, new, 0}
  end
  publish_event(ARGV[3], KEYS[2], ARGV[1], new, nil, next_seq(KEYS[2], ARGV[2], true), true, idle_before)
  return {removed, old, new, 0}
end
-- Last seen at the user's last activity (`seq` before this transition
-- moves it), as for a lapsed lease.
local active = math.min(tonumber(redis.call('HGET', KEYS[2], 'seq') or ARGV[2]), tonumber(ARGV[2]))
local seq = next_seq(KEYS[2], ARGV[2], true)
local last_seen = nil
if not is_online then
  last_seen = stamp_last_seen(KEYS[2], active)
end
publish_event(ARGV[3], KEYS[2], ARGV[1], new, last_seen, seq)
return {removed, old, new, 1}
