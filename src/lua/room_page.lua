-- One page of a room's members, by user, or only its counts: the HTTP
-- reads. Its work is bounded by the page asked for, whatever the room's
-- size and whoever else is hidden in it: a range of the index from the
-- cursor on, then the page's members read by field.
--
-- KEYS: see room_common.lua
-- ARGV[1] room, ARGV[2..4] the list limits and the time (unused), ARGV[5]
-- the last user of the page before ('' for the first page), ARGV[6] most
-- users on the page (0: the counts alone), ARGV[7] most devices on the
-- page (one user's devices are never split: a page holds at least one
-- whole user), ARGV[8] the reader's user ('' for none), whose own hidden
-- members are listed too, ARGV[9] 1 for the service view, which lists
-- every hidden member, ARGV[10] most bytes of the page's member values (a
-- page holds at least one whole user)
--
-- Returns {seq, users, devices, page, next, own hidden, own visible,
-- hidden users, hidden devices}: page the members as (member, value)
-- pairs sorted by user then device; next the user to start the next page
-- after ('' on the last); own hidden the reader's hidden devices in the
-- room, own visible 1 when the reader's user is among the visible users;
-- hidden users and devices the room's hidden counts (service view only,
-- else 0).
local after, max_users, max_devices = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local viewer, all, max_bytes = ARGV[8], ARGV[9] == '1', tonumber(ARGV[10])

local function user_of(entry)
  return string.match(entry, '^(%S+) ')
end

local page, next_cursor = {}, ''
if max_users > 0 then
  -- Entries of users after the cursor's: "<user> <device>" >= "<after>!".
  local from = '-'
  if after ~= '' then
    from = '[' .. after .. '!'
  end
  -- Each source: its entries from the cursor on, at most one more than a
  -- page holds, its side, and whether that was all of them.
  local sources = {}
  local function ranged(side)
    local got = redis.call('ZRANGEBYLEX', side.index, from, '+', 'LIMIT', 0, max_devices + 1)
    sources[#sources + 1] = {entries = got, side = side, whole = #got <= max_devices}
  end
  ranged(VISIBLE)
  local own_from, own_to = nil, nil
  if all then
    ranged(HIDDEN)
  elseif viewer ~= '' then
    own_from, own_to = room_user_range(viewer)
    local own = {}
    for _, e in ipairs(redis.call('ZRANGEBYLEX', KEYS[8], own_from, own_to)) do
      if from == '-' or e >= after .. '!' then
        own[#own + 1] = e
      end
    end
    sources[#sources + 1] = {entries = own, side = HIDDEN, whole = true}
  end
  -- Merged, the entries are right up to the last one of the shortest
  -- source that was cut: past it, that source has entries not read.
  local bound = nil
  for _, s in ipairs(sources) do
    if not s.whole then
      local last = s.entries[#s.entries]
      if not bound or last < bound then
        bound = last
      end
    end
  end
  local entries = {}
  for _, s in ipairs(sources) do
    for _, e in ipairs(s.entries) do
      if not bound or e <= bound then
        entries[#entries + 1] = {e, s.side}
      end
    end
  end
  table.sort(entries, function(a, b) return a[1] < b[1] end)

  -- Whole users, until the page holds max_users of them or max_devices
  -- devices; the last user read may be cut by the bound: it goes to the
  -- next page, unless it is the page's only user, whose devices are then
  -- read whole (a user's devices are bounded by --max-devices-per-user).
  local taken, users, last_user = {}, 0, nil
  local i = 1
  local stopped = false
  while i <= #entries do
    local user = user_of(entries[i][1])
    local j = i
    while j <= #entries and user_of(entries[j][1]) == user do
      j = j + 1
    end
    if users >= max_users then
      stopped = true
      break
    end
    local group = {}
    if bound and j > #entries then
      if users > 0 then
        stopped = true
        break
      end
      local lo, hi = room_user_range(user)
      for _, e in ipairs(redis.call('ZRANGEBYLEX', KEYS[7], lo, hi)) do
        group[#group + 1] = {e, VISIBLE}
      end
      if all or user == viewer then
        for _, e in ipairs(redis.call('ZRANGEBYLEX', KEYS[8], lo, hi)) do
          group[#group + 1] = {e, HIDDEN}
        end
      end
      table.sort(group, function(a, b) return a[1] < b[1] end)
    else
      for k = i, j - 1 do
        group[#group + 1] = entries[k]
      end
    end
    if users > 0 and #taken + #group > max_devices then
      stopped = true
      break
    end
    for _, e in ipairs(group) do
      taken[#taken + 1] = e
    end
    users = users + 1
    last_user = user
    i = j
  end
  if last_user and (stopped or bound) then
    next_cursor = last_user
  end

  -- The page's values, read by field, side by side.
  local by_side = {[VISIBLE] = {}, [HIDDEN] = {}}
  for k, e in ipairs(taken) do
    local list = by_side[e[2]]
    list[#list + 1] = k
  end
  local values = {}
  for side, ks in pairs(by_side) do
    if #ks > 0 then
      local members = {}
      for n, k in ipairs(ks) do
        members[n] = (string.gsub(taken[k][1], ' ', ':', 1))
      end
      local got = redis.call('HMGET', side.values, unpack(members))
      for n, k in ipairs(ks) do
        values[k] = {members[n], got[n]}
      end
    end
  end
  -- Whole users while their values take at most max_bytes (at least one
  -- user): what the page costs Redis's reply and the node to pass on is
  -- bounded in bytes too, whatever the members' states.
  local kept, bytes, k = #taken, 0, 1
  while k <= #taken do
    local user = user_of(taken[k][1])
    local j, size = k, 0
    while j <= #taken and user_of(taken[j][1]) == user do
      size = size + #(values[j][2] or '')
      j = j + 1
    end
    if k > 1 and bytes + size > max_bytes then
      kept = k - 1
      next_cursor = user_of(taken[k - 1][1])
      break
    end
    bytes = bytes + size
    k = j
  end
  for k = 1, kept do
    -- An entry without its value (only a loss of data makes one) is
    -- passed over; the room pass repairs the index.
    if values[k][2] then
      page[#page + 1] = values[k][1]
      page[#page + 1] = values[k][2]
    end
  end
end

local users, devices = room_counts()
local own_hidden, own_visible = 0, 0
if viewer ~= '' then
  own_hidden = tonumber(redis.call('HGET', KEYS[9], viewer) or '0')
  own_visible = redis.call('HEXISTS', KEYS[3], viewer)
end
local hidden_users, hidden_devices = 0, 0
if all then
  hidden_users, hidden_devices = redis.call('HLEN', KEYS[9]), redis.call('HLEN', KEYS[6])
end
return {tonumber(redis.call('HGET', KEYS[4], 'seq') or '0'), users, devices, page, next_cursor,
  own_hidden, own_visible, hidden_users, hidden_devices}
