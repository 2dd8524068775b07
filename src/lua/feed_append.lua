-- Moves the events of some users' (or rooms') feeds of one bucket into the
-- bucket's log: of each feed, those newer than the last one moved from it,
-- in order, each with the log's next ordinal. Run by any node, as often as
-- it likes: a move twice, or two nodes moving at once, adds each event once
-- and in order. A feed adds at most ARGV[2] events per window of ARGV[3] ms
-- (the retention): beyond, its events are dropped, so that one account
-- cannot fill Redis; what is dropped leaves a gap in the ordinal, which a
-- reader counts as lost.
--
-- KEYS[1] presence-feed-log:{b<k>}    the bucket's log (a stream)
-- KEYS[2] presence-feed-moved:{b<k>}  feed key -> `<last seq moved>|<window start ms>|<events in it>`;
--                                     `#n` the ordinal
-- ARGV[1] the log's oldest id to keep (`<ms>-0`: the retention)
-- ARGV[2] most events per feed and window; ARGV[3] the window, ms; ARGV[4] now, ms
-- ARGV[5..] per feed: its key, the events it lost before this move, how
--           many entries follow, then its entries, oldest first:
--           `<seq>|<kind>|<at>|<record>`
--
-- Returns, per feed, the last seq moved from it (0 when none ever was).
local cap, window, now = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local n = nil
local moved = false
local i = 5
while i <= #ARGV do
  local feed, gap, count = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local mark = redis.call('HGET', KEYS[2], feed)
  local last, since, added = 0, now, 0
  if mark then
    local a, b, c = string.match(mark, '^(%d+)|(%d+)|(%d+)$')
    if a then
      last, since, added = tonumber(a), tonumber(b), tonumber(c)
    else
      last = tonumber(mark) or 0
    end
  end
  if now - since >= window then
    since, added = now, 0
  end
  local was = last
  for j = i + 3, i + 2 + count do
    local entry = ARGV[j]
    local bar = string.find(entry, '|', 1, true)
    local seq = bar and tonumber(string.sub(entry, 1, bar - 1))
    if seq and seq > last then
      last = seq
      if added < cap then
        if not n then n = tonumber(redis.call('HGET', KEYS[2], '#n') or '0') end
        n = n + gap + 1
        gap = 0
        redis.call('XADD', KEYS[1], '*', 'n', n, 'o', string.sub(feed, 16, -2), 'e', entry)
        added = added + 1
        moved = true
      else
        gap = gap + 1
      end
    end
  end
  if gap > 0 then
    if not n then n = tonumber(redis.call('HGET', KEYS[2], '#n') or '0') end
    n = n + gap
  end
  if last ~= was then
    redis.call('HSET', KEYS[2], feed, string.format('%d|%d|%d', last, since, added))
  end
  out[#out + 1] = string.format('%d', last)
  i = i + 3 + count
end
if n then
  redis.call('HSET', KEYS[2], '#n', n)
end
if moved then
  redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
end
return out
