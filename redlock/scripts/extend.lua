-- Extend: keep a lock on this node and regain its missing keys.
-- KEYS: n lock keys; then n holds hashes (reentrant locks); then the
-- restart gate marker and the marker of releases before 0.2 (gated
-- clients).
-- ARGV: [1] lock value (its first 32 bytes are the owner token), [2] TTL
-- in ms, [3] '1' for a reentrant lock, [4] its acquisition ID or '', [5]
-- the restart gate in ms or '0'.
-- Reply: 0 when a lock key holds another owner's token: nothing changes.
-- {2, ms left} when a lock key is missing and the node is within its
-- restart gate (a node without its marker stores the server time there
-- first, as the acquire script does): nothing else changes. Otherwise
-- every missing lock key is set again to ARGV[1] (SET NX: the lock regains
-- a key this node lost or never got), every key's TTL is raised to
-- ARGV[2] when lower, never lowered (an extension that timed out may
-- still reach the node after a later, longer one, on another connection,
-- and must not cut it short; other holds of a reentrant owner share the
-- keys), and a reentrant lock's hold is in each holds hash; the reply is 1
-- when every lock key was there, 3 when one was missing (regained).
local tok = string.sub(ARGV[1], 1, 32)
local ttl = tonumber(ARGV[2])
local reentrant = ARGV[3] == '1'
local gated = ARGV[5] ~= '0'
local last = #KEYS
if gated then last = last - 2 end
local n = last
if reentrant then n = n / 2 end
local missing = false
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if not v then
    missing = true
  elseif string.sub(v, 1, 32) ~= tok then
    return 0
  end
end

-- Restart gating ("delayed restarts"), as in the acquire script: a node
-- that lost its data sets no lock key until the gate has passed.
if missing and gated then
  local gate = tonumber(ARGV[5])
  local marker, legacy = KEYS[last + 1], KEYS[last + 2]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local since = tonumber(redis.call('GET', marker) or '')
  if not since then
    since = tonumber(redis.call('GET', legacy) or '')
    if not since then
      redis.call('SET', marker, now)
      return {2, gate}
    end
    redis.call('SET', marker, since)
  end
  if now - since < gate then return {2, gate - (now - since)} end
end

for i = 1, n do
  if not redis.call('SET', KEYS[i], ARGV[1], 'PX', ttl, 'NX') and redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  if reentrant then
    redis.call('HSET', KEYS[n + i], ARGV[4], '1')
    if redis.call('PTTL', KEYS[n + i]) < ttl then redis.call('PEXPIRE', KEYS[n + i], ttl) end
  end
end
if missing then return 3 end
return 1
