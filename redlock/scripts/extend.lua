-- Extend: keep a lock on this node and regain its missing keys.
-- KEYS[1..n]: the lock keys, then the layers' keys. ARGV: [1] the lock
-- value (its first TOKEN bytes are the owner token), [2] the TTL in ms, [3]
-- n, then the layers' arguments (offsets K and A: internal/script).
-- Reply: 0 when a lock key holds another owner's token: nothing changes.
-- A layer may refuse to regain a missing key ({2, ms left}: the restart
-- gate) before anything changes. Otherwise every missing lock key is set
-- again to ARGV[1] (SET NX: the lock regains a key this node lost or never
-- got), and every key's TTL is raised to ARGV[2] when lower, never lowered
-- (an extension that timed out may still reach the node after a later,
-- longer one, on another connection, and must not cut it short; other
-- holds of a reentrant owner share the keys); the reply is 1 when every
-- lock key was there, 3 when one was missing (regained).
-- Locals a layer's fragment may read: value, ttl, n, tok.
local value, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
--@ layout
local tok = string.sub(value, 1, TOKEN)
local missing = false
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if not v then
    missing = true
  elseif string.sub(v, 1, TOKEN) ~= tok then
    return 0
  end
end
if missing then
  --@ regain
end

for i = 1, n do
  if not redis.call('SET', KEYS[i], value, 'PX', ttl, 'NX') and redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
--@ extended
if missing then return 3 end
return 1
