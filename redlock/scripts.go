package redlock

// The scripts check ownership and change every key of a lock atomically on
// one node. newScript computes each SHA1 once; scripts go out as EVALSHA
// and fall back to EVAL only on NOSCRIPT (after SCRIPT FLUSH or a restart),
// so the steady state costs one round trip per node (see pipeline.go).
//
// Ownership is the owner token: the first 32 characters of a lock value
// (see buildValue). It is random per acquisition, or derived from the owner
// ID of a reentrant lock (WithOwner), so comparing tokens is comparing
// owners. Reentrant locks keep, beside each lock key, a hash "<key>:holds"
// whose fields are the acquisition IDs holding it (and "_t", the fencing
// token of the current hold).
//
// Common arguments: ARGV[1] is the lock value, ARGV[2] a TTL in ms.

// acquireScript grants when no lock key is held by another owner, and
// returns {1, token, reentered[, fresh token]}; otherwise it returns {0,
// the other holder's value, that key's PTTL in ms} and changes nothing but, when
// ARGV[7] is "1", the other holder's wait mark (below). A key that already
// holds our owner token counts as ours: a retry after a lost reply never
// blocks itself (redis.io distlock spec, step 2, made multi-key and
// idempotent), and an owner may take its lock again (reentrancy). One key
// without reentrancy is one SET NX (a GET, a PTTL and, for a waiter, the
// mark's SETRANGE follow a refusal);
// TryAcquire of such a lock sends SET NX GET instead of this script
// (Client.attempt). Our existing keys keep their value and get their TTL
// raised to ARGV[2], never lowered (an earlier hold of the same owner
// relies on it).
//
// ARGV[3] is n, the number of lock keys; ARGV[4] "1" for fencing; ARGV[5] the
// restart gate in ms or "0"; ARGV[6] the acquisition ID of a reentrant lock
// or "". ARGV[7] is "1" when the caller waits for the key's release
// notice (an Acquire with release notices on): the refusing key then gets
// its wait mark, the byte after the owner token turned from '-' or 'T' to
// '_' or 't' (SETRANGE keeps the TTL; buildValue and unmarked in lock.go),
// which asks its holder's release to publish a notice (releaseScript).
// KEYS: n lock keys, then n holds keys (reentrant only), then n fencing
// counters (fencing only), then the gate marker (gating only).
//
// With fencing the token is 1 + the largest counter of the lock's resources,
// or, when a reentrant owner already holds every key and its hold recorded
// a token, that token (reentered = 1), followed by 1 + the largest counter
// (which tells a live re-entry from a stale hold: Client.attempt). With
// restart gating a node without
// its marker stores the server time there and refuses ({2, ms left}) until
// the gate has passed since then (redis.io distlock spec, "Performance,
// crash recovery and fsync": delayed restarts); the marker has no TTL, so a
// node that keeps its data (appendonly + fsync always) is never gated again.
var acquireScript = newScript(`
local n = tonumber(ARGV[3])
local aid = ARGV[6]
local owner = aid ~= ''
local foff = n
if owner then foff = 2 * n end
if ARGV[5] ~= '0' then
  local gate = tonumber(ARGV[5])
  local gk = KEYS[#KEYS]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local since = redis.call('GET', gk)
  if not since then
    redis.call('SET', gk, now)
    return {2, gate}
  end
  local waited = now - (tonumber(since) or 0)
  if waited < gate then return {2, gate - waited} end
end
local tok = string.sub(ARGV[1], 1, 32)
local ttl = tonumber(ARGV[2])
local mine = 0
local function refuse(k, v)
  if ARGV[7] == '1' then
    local c = string.sub(v, 33, 33)
    if c == '-' then redis.call('SETRANGE', k, 32, '_')
    elseif c == 'T' then redis.call('SETRANGE', k, 32, 't') end
  end
  return {0, v, redis.call('PTTL', k)}
end
if n == 1 and not owner then
  if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ttl) then
    local v = redis.call('GET', KEYS[1])
    if string.sub(v, 1, 32) ~= tok then return refuse(KEYS[1], v) end
    if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  end
else
  local had = {}
  for i = 1, n do
    local v = redis.call('GET', KEYS[i])
    if v then
      if string.sub(v, 1, 32) ~= tok then return refuse(KEYS[i], v) end
      mine = mine + 1
      had[i] = true
    end
  end
  for i = 1, n do
    if not had[i] then
      redis.call('SET', KEYS[i], ARGV[1], 'PX', ttl)
    elseif redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
    if owner then
      local h = KEYS[n + i]
      redis.call('HSET', h, aid, '1')
      if redis.call('PTTL', h) < ttl then redis.call('PEXPIRE', h, ttl) end
    end
  end
end
if ARGV[4] ~= '1' then return {1, 0, 0} end
local token = 0
for i = foff + 1, foff + n do
  local c = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if c > token then token = c end
end
if owner and mine == n then
  local t = redis.call('HGET', KEYS[n + 1], '_t')
  if t then return {1, tonumber(t), 1, token + 1} end
end
return {1, token + 1, 0}
`)

// fenceScript records a fencing token: when every counter (KEYS) is below
// ARGV[1] it sets them all to it with TTL ARGV[2] ms and returns 1;
// otherwise (another acquisition has already recorded this token or a
// larger one) it changes nothing and returns 0. Because every recorded
// token is on a majority and needs a majority of nodes below it, two
// acquisitions never both record the same token.
var fenceScript = newScript(`
local t = tonumber(ARGV[1])
for i = 1, #KEYS do
  local c = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if c >= t then return 0 end
end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return 1
`)

// checkScript confirms a re-entry that would keep the token ARGV[1]: it
// returns {1, the largest counter} when every counter (KEYS) is at most
// ARGV[1], else {0, the largest counter}. It changes nothing. Run after
// the re-entry's grants, it sees every token recorded before them.
var checkScript = newScript(`
local k = tonumber(ARGV[1])
local m = 0
for i = 1, #KEYS do
  local c = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if c > m then m = c end
end
if m <= k then return {1, m} end
return {0, m}
`)

// noteScript notes the token ARGV[1] of a reentrant hold, once a fence
// round has recorded it on a majority, in the holds hashes (KEYS) that
// hold its acquisition ID ARGV[2] (field "_t"), for the owner's
// re-entries: never in another owner's hold (stale on a node its release
// did not reach, whose next re-entry would take the token), and never
// for a record round that failed (its token was handed to nobody). It
// returns 1.
var noteScript = newScript(`
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[2]) == 1 then
    redis.call('HSET', KEYS[i], '_t', ARGV[1])
  end
end
return 1
`)

// extendScript sets the TTL of every lock key (KEYS[1..n]) to ARGV[2] only
// when all of them still hold our owner token, and returns 1; otherwise it
// changes nothing and returns 0. It never creates a key. For a reentrant
// lock (ARGV[3] = "1"; KEYS[n+1..2n] are the holds hashes) it only raises
// TTLs, never lowers them, since other holds of the owner share the keys.
var extendScript = newScript(`
local tok = string.sub(ARGV[1], 1, 32)
local ttl = tonumber(ARGV[2])
local owner = ARGV[3] == '1'
local n = #KEYS
if owner then n = n / 2 end
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if not v or string.sub(v, 1, 32) ~= tok then return 0 end
end
for i = 1, #KEYS do
  if not owner or redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return 1
`)

// releaseScript deletes every lock key (KEYS[1..n]) that holds our owner
// token and returns how many held it (compare-and-delete, redis.io distlock
// spec, "Releasing the lock"). For a reentrant lock (ARGV[2] is the
// acquisition ID; KEYS[n+1..2n] are the holds hashes) it removes this
// acquisition's hold and deletes the key only when no hold is left.
//
// When ARGV[3] is not empty (Release), for each key it deletes that has its
// wait mark (an Acquire was refused by it and waits: acquireScript) it
// publishes ARGV[3], an ID of the lock, as a release notice on the channel
// "<key>:released" (releasedSuffix), which wakes the Acquire calls waiting
// for the key (wake.go). A release that nobody waits for publishes nothing
// (PUBLISH was a third of this script's cost on the server). Undo rounds
// and late-grant cleanups publish nothing, nor does a key that expires:
// waiters poll as well. PUBLISH runs under pcall: a user whose ACL denies
// the channel (Redis 7's default for new users is resetchannels) still
// releases; its waiters poll.
var releaseScript = newScript(`
local tok = string.sub(ARGV[1], 1, 32)
local aid = ARGV[2]
local n = #KEYS
if aid ~= '' then n = n / 2 end
local mine = 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v and string.sub(v, 1, 32) == tok then
    mine = mine + 1
    local last = true
    if aid ~= '' then
      local h = KEYS[n + i]
      redis.call('HDEL', h, aid)
      last = redis.call('HLEN', h) - redis.call('HEXISTS', h, '_t') <= 0
      if last then redis.call('DEL', h) end
    end
    if last then
      redis.call('DEL', KEYS[i])
      local c = string.sub(v, 33, 33)
      if ARGV[3] ~= '' and (c == '_' or c == 't') then redis.pcall('PUBLISH', KEYS[i] .. '` + releasedSuffix + `', ARGV[3]) end
    end
  end
end
return mine
`)

// holderScript returns the value of KEYS[1], or false (Client.Holder).
var holderScript = newScript(`return redis.call('GET', KEYS[1])`)
