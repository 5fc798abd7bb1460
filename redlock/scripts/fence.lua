-- Fence: record a fencing token. KEYS: the counters. ARGV: [1] token, [2]
-- counter TTL in ms. When every counter is below the token, sets them all
-- to it and returns 1; otherwise changes nothing and returns 0, so that no
-- two acquisitions record the same token.
local t = tonumber(ARGV[1])
for i = 1, #KEYS do
  if (tonumber(redis.call('GET', KEYS[i]) or '0') or 0) >= t then return 0 end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
