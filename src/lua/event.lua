-- Prepended to every script that publishes a transition (see store/scripts.rs), so
-- that the sequence number and the event are made in one place.

-- The user's next transition sequence number: never below now, so it keeps
-- increasing even after the retention trim deleted the status hash and a
-- watcher's last seen seq never hides an event.
local function next_seq(status_key, now)
  local seq = math.max(tonumber(redis.call('HGET', status_key, 'seq') or '0') + 1, tonumber(now))
  redis.call('HSET', status_key, 'seq', seq)
  return seq
end

-- Publishes the user's true record after a transition, with what decides
-- who may see it (chosen status, privacy settings); each node derives every
-- viewer's view from it.
local function publish_event(channel, status_key, user, devices, last_seen, seq)
  local h = redis.call('HMGET', status_key, 'status', 'text', 'since', 'show_online', 'show_last_seen')
  local status = 'offline'
  if devices > 0 then status = h[1] or 'online' end
  redis.call('SPUBLISH', channel, cjson.encode({
    user = user,
    status = status,
    devices = devices,
    last_seen = last_seen or cjson.null,
    text = h[2] or cjson.null,
    chosen = h[1] or 'online',
    since = tonumber(h[3] or '0'),
    show_online = h[4] or 'everyone',
    show_last_seen = h[5] or 'everyone',
    seq = seq,
  }))
end
