-- Moves the events of some users' (or rooms') feeds of one bucket into the
-- bucket's log: of each feed, those newer than the last one moved from it,
-- in order, each with the log's next ordinal. Run by any node, as often as
-- it likes: a move twice, or two nodes moving at once, adds each event once
-- and in order.
--
-- KEYS[1] presence-feed-log:{b<k>}    the bucket's log (a stream)
-- KEYS[2] presence-feed-moved:{b<k>}  feed key -> last seq moved; `#n` the ordinal
-- ARGV[1] the log's oldest id to keep (`<ms>-0`: the retention)
-- ARGV[2..] per feed: its key, the events it lost before this move
--           (counted in the ordinal, so that a reader sees the gap), how
--           many entries follow, then its entries, oldest first:
--           `<seq>|<kind>|<at>|<record>`
--
-- Returns, per feed, the last seq moved from it (0 when none ever was).
local out = {}
local moved = false
local i = 2
while i <= #ARGV do
  local feed, lost, count = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local last = tonumber(redis.call('HGET', KEYS[2], feed) or '0')
  local owner = string.sub(feed, 16, -2)
  local added = lost
  local first = nil
  for j = i + 3, i + 2 + count do
    local entry = ARGV[j]
    local bar = string.find(entry, '|', 1, true)
    local seq = bar and tonumber(string.sub(entry, 1, bar - 1))
    if seq and seq > last then
      if not first then
        first = tonumber(redis.call('HINCRBY', KEYS[2], '#n', added + 1))
      else
        first = first + 1
      end
      redis.call('XADD', KEYS[1], '*', 'n', first, 'o', owner, 'e', entry)
      added = 0
      last = seq
      moved = true
    end
  end
  if first then
    redis.call('HSET', KEYS[2], '#n', first, feed, string.format('%d', last))
  elseif lost > 0 then
    redis.call('HINCRBY', KEYS[2], '#n', lost)
  end
  out[#out + 1] = string.format('%d', last)
  i = i + 3 + count
end
if moved then
  redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
end
return out
