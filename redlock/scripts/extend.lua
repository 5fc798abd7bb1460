-- Extend: raise the TTL of every key (KEYS[1..n] lock keys, and for a
-- reentrant lock, ARGV[3] = '1', KEYS[n+1..2n] its holds hashes) to ARGV[2]
-- ms when all lock keys still hold our owner token (the first 32 bytes of
-- ARGV[1]), and return 1; otherwise change nothing and return 0. Never
-- creates a key, and never lowers a TTL: an extension that timed out may
-- still reach the node after a later, longer one (on another connection),
-- and must not cut it short; other holds of a reentrant owner share the
-- keys.
local tok = string.sub(ARGV[1], 1, 32)
local ttl = tonumber(ARGV[2])
local reentrant = ARGV[3] == '1'
local n = #KEYS
if reentrant then n = n / 2 end
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if not v or string.sub(v, 1, 32) ~= tok then return 0 end
end
for i = 1, #KEYS do
  if redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
