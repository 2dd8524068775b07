-- Takes out of a bucket's due index the feeds the pass found empty, each
-- only while its score is still the one the pass read: a step that put it
-- back meanwhile (before recording) keeps it there.
--
-- KEYS[1] presence-feed-due:{b<k>}
-- ARGV pairs: feed key, the score read
--
-- Returns how many it took out.
local n = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return n
