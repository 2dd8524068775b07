-- The member list of a room under `--room-policy members`: adds users to
-- it, or replaces it; users taken off by a replacement leave the room at
-- once, as with room_remove_user.lua.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..3] the list limits, ARGV[4] now ms, ARGV[5] add or
-- replace, ARGV[6] most users on the list, ARGV[7] how long a removal
-- refuses a session's own rejoin, ms, ARGV[8..] the users
--
-- Returns {kind, users on the list, devices removed as "<user>:<device>",
-- published events}: kind is set, or full (the list would hold more than
-- ARGV[6] users; nothing changed).
local users = {}
for i = 8, #ARGV do
  users[#users + 1] = ARGV[i]
end
local max = tonumber(ARGV[6])
local removed = {}
if ARGV[5] == 'replace' then
  if #users > max then
    return {'full', redis.call('ZCARD', KEYS[10]), {}, {}}
  end
  local keep = {}
  for _, u in ipairs(users) do
    keep[u] = true
  end
  for _, u in ipairs(redis.call('ZRANGE', KEYS[10], 0, -1)) do
    if not keep[u] then
      local from, to = room_user_range(u)
      for _, side in ipairs({VISIBLE, HIDDEN}) do
        for _, entry in ipairs(redis.call('ZRANGEBYLEX', side.index, from, to)) do
          local device = string.sub(entry, #u + 2)
          room_remove(u, device, ',"removed":true')
          redis.call('HSET', KEYS[11], u .. ':' .. device, ARGV[4])
          removed[#removed + 1] = u .. ':' .. device
        end
      end
    end
  end
  -- Never shorter than it is: a removal's record may be kept longer
  -- (`proxy` grants, room_remove_user.lua).
  if #removed > 0 and redis.call('PTTL', KEYS[11]) < tonumber(ARGV[7]) then
    redis.call('PEXPIRE', KEYS[11], ARGV[7])
  end
  redis.call('DEL', KEYS[10])
else
  local new = 0
  for _, u in ipairs(users) do
    if not redis.call('ZSCORE', KEYS[10], u) then
      new = new + 1
    end
  end
  if redis.call('ZCARD', KEYS[10]) + new > max then
    return {'full', redis.call('ZCARD', KEYS[10]), {}, {}}
  end
end
for i = 1, #users, 1000 do
  local args = {}
  for j = i, math.min(i + 999, #users) do
    args[#args + 1] = 0
    args[#args + 1] = users[j]
  end
  redis.call('ZADD', KEYS[10], unpack(args))
end
return {'set', redis.call('ZCARD', KEYS[10]), removed, room_emitted}
