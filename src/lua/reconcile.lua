-- Repair one user whose device set or counter disagrees with the live
-- leases (an expired event was missed and the deadline index lost the
-- lease, a node died between steps, Redis lost part of its data), and emit
-- the transition that the repair implies, once.
--
-- KEYS[1] presence-count:{<user>}      live device counter
-- KEYS[2] presence-devices:{<user>}    set of counted device ids
-- KEYS[3] presence-status:{<user>}     status hash (status, text, since, active, last_seen, seq)
-- KEYS[4..] presence:{<user>}:<device> the lease of each device named in ARGV[4..]
-- ARGV[1] user id
-- ARGV[2] now, epoch ms
-- ARGV[3] the user's events channel, presence-events:{<user>} (SPUBLISH)
-- ARGV[4..] device ids the caller found in the set
--
-- Returns {removed, old_count, new_count, transition}: devices removed for
-- want of a lease, the counter before and after, and 1 when `online` or
-- `offline` was published.
local removed = 0
for i = 4, #ARGV do
  local lease = KEYS[i]
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 1 and redis.call('EXISTS', lease) == 0 then
    redis.call('SREM', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = redis.call('SCARD', KEYS[2])
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
  return {removed, old, new, 0}
end
local seq = next_seq(KEYS[3], ARGV[2])
local last_seen = nil
if not is_online then
  -- Last seen at the last refresh of any device, as for a lapsed lease.
  last_seen = stamp_last_seen(KEYS[3], tonumber(redis.call('HGET', KEYS[3], 'active') or ARGV[2]))
end
publish_event(ARGV[3], KEYS[3], ARGV[1], new, last_seen, seq)
return {removed, old, new, 1}
