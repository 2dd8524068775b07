-- Read one user's presence atomically, so that the state and the sequence
-- number in a snapshot always belong together; with what decides who may
-- see it, and whether the viewer is one of the user's contacts.
--
-- KEYS[1] presence-count:{<user>}      live device counter
-- KEYS[2] presence-status:{<user>}     status hash
-- KEYS[3] presence-contacts:{<user>}   the user's contacts
-- ARGV[1] viewer ("" for anonymous)
--
-- Returns {count, status, text, seq, last_seen, since, show_online,
-- show_last_seen, viewer_is_contact, until, kinds, idle}; "" for what is not
-- set; kinds are the devices' sorted distinct kinds joined with ","; idle
-- is 1 when every device is paused.
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local h = redis.call('HMGET', KEYS[2], 'status', 'text', 'seq', 'last_seen', 'since',
  'show_online', 'show_last_seen', 'until')
local contact = 0
if ARGV[1] ~= '' then
  contact = redis.call('SISMEMBER', KEYS[3], ARGV[1])
end
-- The same kinds as an event's (event.lua is in front of this script).
local kinds, idle = '', false
if count > 0 then
  local all
  all, idle = device_kinds(KEYS[2])
  kinds = table.concat(all, ',')
end
return {count, h[1] or '', h[2] or '', h[3] or '0', h[4] or '', h[5] or '0',
  h[6] or '', h[7] or '', contact, h[8] or '', kinds, idle and 1 or 0}
