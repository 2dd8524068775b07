-- Prepended to every script that publishes a transition (see store/scripts.rs), so
-- that the sequence number and the event are made in one place.

-- The user's next transition sequence number. `seq` is also the user's
-- clock: each refresh raises it to its time (arrive.lua), and a lapsed
-- lease's last seen reads it. So a transition of a client (connect, close,
-- status, privacy) takes at least now, which keeps it increasing even when
-- Redis lost the hash, and a watcher's last seen seq never hides an event;
-- one the server makes for a lease that lapsed or a repair (`lapsed`) is
-- no activity of the user's and only adds 1 (or takes now, when there is
-- no seq yet).
-- The new seq is stored by `publish_event`, which every caller calls with
-- it (in one write with the feed's mark).
local function next_seq(status_key, now, lapsed)
  local old = tonumber(redis.call('HGET', status_key, 'seq') or '0')
  local seq = old + 1
  if not lapsed or old == 0 then
    seq = math.max(seq, tonumber(now))
  end
  return seq
end

-- The event this call published (its JSON), for the scripts that report it
-- to their caller (`reporting!` in store/scripts.rs): the node that made a
-- transition is the one that sends its webhook.
local published = false

-- The event feed (`reporting!`): when the caller passed the user's feed key
-- as the last key (and the time, epoch ms, as the last argument), the
-- transition is also recorded there, in this same step, as
-- `<seq>|<kind>|<at>|<record>` (record: [status, devices, last_seen, text,
-- since, until, kinds, seq] as JSON, and on a flip of the idle mark a
-- ninth element, the mark after it, 1 or 0); `feed_args` is how many
-- arguments that took, for a script that counts its own.
-- Where the caller writes the log in the step (`feed_direct.lua`), the
-- bucket's log and marks follow the feed key as the last two keys.
local feed_key, feed_now, feed_args, feed_log, feed_moved = nil, nil, 0, nil, nil
if #KEYS > 2 and string.sub(KEYS[#KEYS], 1, 20) == 'presence-feed-moved:' then
  feed_key, feed_log, feed_moved = KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
  feed_now, feed_args = ARGV[#ARGV], 1
elseif #KEYS > 0 and string.sub(KEYS[#KEYS], 1, 14) == 'presence-feed:' then
  feed_key, feed_now, feed_args = KEYS[#KEYS], ARGV[#ARGV], 1
end
local feed_record = false
local feed_seq = 0
-- Whether the event is within its user's bound (`feed_mark`), where the
-- step writes the log itself.
local feed_keep = true
-- Whether the recorded transition left the user offline.
local feed_offline = false
-- The feed kind of the recorded transition when it is not the step's own
-- (`reporting!`): 'i', a flip of the user's idle mark alone.
local feed_kind = nil

-- The sorted distinct kinds of the user's counted devices (`k:<device>`
-- beside each `d:<device>`; a device without one is `other`), and whether
-- the user is idle: it has counted devices and every one of them is paused
-- (`i:<device>` beside it, the end of its grace, written by a pause).
local function device_kinds(status_key)
  local flat = redis.call('HGETALL', status_key)
  local counted, kind, paused = {}, {}, {}
  for i = 1, #flat, 2 do
    local prefix = string.sub(flat[i], 1, 2)
    if prefix == 'd:' then
      counted[string.sub(flat[i], 3)] = true
    elseif prefix == 'k:' then
      kind[string.sub(flat[i], 3)] = flat[i + 1]
    elseif prefix == 'i:' then
      paused[string.sub(flat[i], 3)] = true
    end
  end
  local seen, out = {}, {}
  local any, idle = false, true
  for device in pairs(counted) do
    any = true
    if not paused[device] then idle = false end
    local k = kind[device] or 'other'
    if not seen[k] then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  table.sort(out)
  return out, any and idle
end

-- Whether the user is idle now (see `device_kinds`).
local function user_idle(status_key)
  local _, idle = device_kinds(status_key)
  return idle
end

-- Publishes the user's true record after a transition, with what decides
-- who may see it (chosen status, privacy settings); each node derives every
-- viewer's view from it. `devices_only` marks a change of the device count
-- alone (a second device came or went): nodes hand it only to the watchers
-- who asked for device counts. `idle_before`, where the caller knows it
-- (nil otherwise), is whether the user was idle before the step: a change
-- of the count that flips the idle mark is a transition (`idle_flip`), for
-- every watcher, the feed and the webhooks.
local function publish_event(channel, status_key, user, devices, last_seen, seq, devices_only,
    idle_before)
  local h = redis.call('HMGET', status_key, 'status', 'text', 'since', 'show_online', 'show_last_seen',
    'last_seen', 'until', 'fs', 'fc')
  -- The stored last seen rides along on every event, as on every read: a
  -- viewer who may not see the user online sees it offline with that last
  -- seen, the same record an event or a snapshot.
  if last_seen == nil then last_seen = tonumber(h[6]) end
  local status = 'offline'
  if devices > 0 then status = h[1] or 'online' end
  -- An empty table would be encoded as an object: no kinds, no field.
  local kinds, idle = nil, false
  if devices > 0 then
    kinds, idle = device_kinds(status_key)
    if #kinds == 0 then kinds = nil end
  end
  local idle_flip = nil
  if devices > 0 and idle_before ~= nil and idle ~= idle_before then
    devices_only, idle_flip = nil, true
  end
  local event = cjson.encode({
    devices_only = devices_only or nil,
    user = user,
    status = status,
    devices = devices,
    last_seen = last_seen or cjson.null,
    text = h[2] or cjson.null,
    chosen = h[1] or 'online',
    since = tonumber(h[3] or '0'),
    show_online = h[4] or 'everyone',
    show_last_seen = h[5] or 'everyone',
    ['until'] = tonumber(h[7]) or cjson.null,
    kinds = kinds,
    idle = idle or nil,
    idle_flip = idle_flip,
    seq = seq,
  })
  redis.call('SPUBLISH', channel, event)
  -- A change of the device count alone is no transition: no webhook.
  local recorded = false
  if not devices_only then
    published = event
    if feed_key then
      feed_seq = seq
      feed_offline = status == 'offline'
      if idle_flip then feed_kind = 'i' end
      -- By hand, not cjson: this runs on every transition. The status and
      -- the kinds are the server's own words; the text is the user's.
      local function num(v) return v and string.format('%d', v) or 'null' end
      feed_record = '["' .. status .. '",' .. devices .. ',' .. num(last_seen) .. ','
        .. (h[2] and cjson.encode(h[2]) or 'null') .. ',' .. num(tonumber(h[3] or '0')) .. ','
        .. num(tonumber(h[7])) .. ',"' .. table.concat(kinds or {}, ',') .. '",' .. num(seq)
        -- The idle mark only on a flip of it (kind 'i', which an older node
        -- skips): an older node reads every other entry, whose record must
        -- keep its eight elements.
        .. (idle_flip and (idle and ',1]' or ',0]') or ']')
      recorded = true
    end
  end
  -- The seq, and where this call recorded its event in the log itself, the
  -- user's window of the bound, in one write.
  if recorded and feed_log then
    local since, count
    since, count, feed_keep = feed_mark(h[8], h[9], tonumber(feed_now))
    redis.call('HSET', status_key, 'seq', seq, 'fs', since, 'fc', count)
  else
    redis.call('HSET', status_key, 'seq', seq)
  end
end

-- Most transitions a user's (or room's) feed holds before a node moves them
-- to the bucket's log (at once, normally): beyond it the oldest go, and are
-- counted as lost (presence-feed-lost:{<tag>}).
local FEED_HELD = 256

-- Records `record` of kind `kind` (one letter) with `seq` in the feed list
-- `key`, at `at`; or, where the caller passed the bucket's log, in the log.
local function feed_push(key, seq, kind, at, record)
  local entry = string.format('%d', seq) .. '|' .. kind .. '|' .. at .. '|' .. record
  if feed_log then
    feed_direct(feed_log, feed_moved, string.sub(key, 16, -2), entry, feed_keep)
    return
  end
  local n = redis.call('RPUSH', key, entry)
  if n > FEED_HELD then
    redis.call('LPOP', key, n - FEED_HELD)
    redis.call('INCRBY', 'presence-feed-lost:' .. string.sub(key, 15), n - FEED_HELD)
  end
end

-- Stamps a user's last seen as it goes offline and returns the value to
-- publish. An invisible user's last seen, as everyone else sees it, stays
-- what it was when it went invisible (nil if never seen): storing the real
-- departure would tell everyone when a hidden user was really there.
local function stamp_last_seen(status_key, last_seen)
  if redis.call('HGET', status_key, 'status') == 'invisible' then
    local kept = redis.call('HGET', status_key, 'last_seen')
    if kept then return tonumber(kept) end
    return nil
  end
  redis.call('HSET', status_key, 'last_seen', last_seen)
  return last_seen
end
