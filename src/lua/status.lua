-- Set a user's chosen status and text; announce it when the user is online
-- and something visible changed.
--
-- KEYS[1] presence-status:{<user>}     status hash (status, text, since, last_seen, seq)
-- KEYS[2] presence-count:{<user>}      live device counter
-- ARGV[1] status: online, away, busy or invisible
-- ARGV[2] text, "" for none
-- ARGV[3] now, epoch ms
-- ARGV[4] user id
-- ARGV[5] the user's events channel, presence-events:{<user>} (SPUBLISH)
-- ARGV[6] when the status ends, epoch ms ("" or "0": it does not); the
--         caller adds it to the due index, presence-until:{b<k>}
--
-- Returns {published, since, was}: 1 when a `presence` event was published,
-- when the current status was chosen (a change of text alone keeps it, so
-- that an invisible user's last seen, which is that moment, never moves),
-- and the status before (the caller sweeps the user's rooms when it was or
-- now is `invisible`).
local old = redis.call('HMGET', KEYS[1], 'status', 'text', 'since', 'until')
local old_status = old[1] or 'online'
local old_text = old[2] or ''
local new_until = ARGV[6] or ''
if new_until == '0' then new_until = '' end
if old_status == ARGV[1] and old_text == ARGV[2] and (old[4] or '') == new_until then
  return {0, old[3] or ARGV[3], old_status}
end
if new_until == '' then
  redis.call('HDEL', KEYS[1], 'until')
else
  redis.call('HSET', KEYS[1], 'until', new_until)
end
local count = tonumber(redis.call('GET', KEYS[2]) or '0')
if old_status == 'invisible' and ARGV[1] ~= 'invisible' and count <= 0 and old[3] then
  -- Offline and no longer invisible: others were shown the moment it went
  -- invisible as its last seen; its real departure must not show now.
  redis.call('HSET', KEYS[1], 'last_seen', old[3])
end
if old_status ~= ARGV[1] or not old[3] then
  redis.call('HSET', KEYS[1], 'status', ARGV[1], 'since', ARGV[3])
end
local since = redis.call('HGET', KEYS[1], 'since')
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'text')
else
  redis.call('HSET', KEYS[1], 'text', ARGV[2])
end
if count <= 0 then
  return {0, since, old_status}
end
publish_event(ARGV[5], KEYS[1], ARGV[4], count, nil, next_seq(KEYS[1], ARGV[3]))
return {1, since, old_status}
