-- Holders: read the lock keys KEYS on this node, for Client.Holders.
-- ARGV: none.
-- Reply: for each key, its value (false: no key) and its PTTL in ms (a
-- negative PTTL: no key, or a key without a TTL).
local out = {}
for i = 1, #KEYS do
  out[2 * i - 1] = redis.call('GET', KEYS[i])
  out[2 * i] = redis.call('PTTL', KEYS[i])
end
return out
