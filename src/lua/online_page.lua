-- One slice of `presence-online` for the online list, newest first, from a
-- position that holds up while entries move: the list is read a bounded
-- slice at a time, and each request goes on where the last one stopped.
--
-- KEYS[1] presence-online
-- ARGV[1] where to start: "top"; "after" the entry ARGV[2] (score),
--         ARGV[3] (member), the last one examined; or "ties": after the
--         first ARGV[3] entries whose score is ARGV[2]
-- ARGV[4] most entries to return
--
-- Returns {index, member, score, member, score, ...}: the position (in the
-- newest-first order) of the first entry returned, then the entries.

-- Bytewise, as sorted sets order equal scores (Lua's own `<` follows the
-- server's locale).
local function less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

local key, mode, count = KEYS[1], ARGV[1], tonumber(ARGV[4])
local start = 0
if mode ~= 'top' then
  local score = ARGV[2]
  local above = redis.call('ZCOUNT', key, '(' .. score, '+inf')
  if mode == 'ties' then
    start = above + tonumber(ARGV[3])
  else
    local member = ARGV[3]
    local s = redis.call('ZSCORE', key, member)
    if s and tonumber(s) == tonumber(score) then
      start = redis.call('ZREVRANK', key, member) + 1
    else
      -- It moved or left: entries tied at its old score come newest-first
      -- by member, descending; binary-search the first one after it.
      local lo, hi = 0, redis.call('ZCOUNT', key, score, score)
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local m = redis.call('ZRANGE', key, above + mid, above + mid, 'REV')[1]
        if less(m, member) then hi = mid else lo = mid + 1 end
      end
      start = above + lo
    end
  end
end
local out = {start}
if count > 0 then
  local page = redis.call('ZRANGE', key, start, start + count - 1, 'REV', 'WITHSCORES')
  for _, v in ipairs(page) do out[#out + 1] = v end
end
return out
