-- Move one user's schema-2 device set into its hash (schema 3), at start.
-- Idempotent, and safe beside a node of this version serving the user: a
-- device already in the hash stays as it is.
--
-- KEYS[1] presence-devices:{<user>}    the schema-2 set of counted device ids
-- KEYS[2] presence-status:{<user>}     the user's hash, which takes d:<device>
--
-- Returns the number of devices moved.
local moved = 0
for _, device in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  moved = moved + redis.call('HSETNX', KEYS[2], 'd:' .. device, 0)
end
redis.call('DEL', KEYS[1])
return moved
