-- Renew a node's run record while no other node holds that run number: the
-- record is written back if it lapsed (or Redis lost it), and left alone if
-- another node claimed the number meanwhile.
--
-- KEYS[1] presence-run:<run>
-- ARGV[1] the node's id
-- ARGV[2] how long the record holds, in ms
--
-- Returns 1 when the record is the node's (renewed), 0 when another node
-- holds the number.
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
