-- Read one user's presence atomically, so that the state and the sequence
-- number in a snapshot always belong together.
--
-- KEYS[1] presence-count:{<user>}      live device counter
-- KEYS[2] presence-status:{<user>}     status hash (status, text, since, active, last_seen, seq)
--
-- Returns {count, status, text, seq, last_seen}; "" for what is not set.
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local h = redis.call('HMGET', KEYS[2], 'status', 'text', 'seq', 'last_seen')
return {count, h[1] or '', h[2] or '', h[3] or '0', h[4] or ''}
