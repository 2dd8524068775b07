-- Remove a member from a sorted set only while its score is still the one the
-- caller read, so that a deadline re-added meanwhile by a fresh lease stays.
--
-- KEYS[1] the sorted set (presence-leases)
-- ARGV[1] member
-- ARGV[2] score the caller read
--
-- Returns 1 when removed, 0 when the member is gone or has a new score.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
