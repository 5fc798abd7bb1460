-- Check: confirm that a re-entry may keep its hold's token. KEYS: the
-- counters. ARGV: [1] the kept token. Returns {1, largest counter} when
-- every counter is at most the kept token, else {0, largest counter}.
-- Changes nothing.
local m = 0
for i = 1, #KEYS do
  local c = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if c > m then m = c end
end
if m <= tonumber(ARGV[1]) then return {1, m} end
return {0, m}
