-- Extend a short lock only while it is still the caller's: a lock that
-- lapsed and was taken by another node meanwhile stays with that node.
--
-- KEYS[1] the lock key (presence-reaper-lock, presence-run)
-- ARGV[1] the caller's lock value (its node id)
-- ARGV[2] the new hold, in ms
--
-- Returns 1 when the lock is the caller's and was extended, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
