-- Raise the deployment's run counter to at least the caller's run, so that
-- after Redis lost its data no node starting later takes a run number a
-- running node already has.
--
-- KEYS[1] presence-meta
-- ARGV[1] the caller's run number
--
-- Returns the counter after the call.
local runs = tonumber(redis.call('HGET', KEYS[1], 'runs') or '0')
if runs < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'runs', ARGV[1])
  return tonumber(ARGV[1])
end
return runs
