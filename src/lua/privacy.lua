-- Change who may see a user's online status and last seen, and publish the
-- user's record so that every watcher's view is recomputed.
--
-- KEYS[1] presence-status:{<user>}     status hash (..., show_online, show_last_seen)
-- KEYS[2] presence-count:{<user>}      live device counter
-- ARGV[1] show_online: everyone, contacts or nobody ("" leaves it)
-- ARGV[2] show_last_seen: everyone, contacts or nobody ("" leaves it)
-- ARGV[3] now, epoch ms
-- ARGV[4] user id
-- ARGV[5] the user's events channel, presence-events:{<user>} (SPUBLISH)
--
-- Returns 1 when a setting changed (and the record was published), else 0.
local old = redis.call('HMGET', KEYS[1], 'show_online', 'show_last_seen')
local changed = false
if ARGV[1] ~= '' and ARGV[1] ~= (old[1] or 'everyone') then
  redis.call('HSET', KEYS[1], 'show_online', ARGV[1])
  changed = true
end
if ARGV[2] ~= '' and ARGV[2] ~= (old[2] or 'everyone') then
  redis.call('HSET', KEYS[1], 'show_last_seen', ARGV[2])
  changed = true
end
if not changed then
  return 0
end
local count = tonumber(redis.call('GET', KEYS[2]) or '0')
local last_seen = nil
if count <= 0 then
  count = 0
  last_seen = tonumber(redis.call('HGET', KEYS[1], 'last_seen') or '')
end
publish_event(ARGV[5], KEYS[1], ARGV[4], count, last_seen, next_seq(KEYS[1], ARGV[3]))
return 1
