package redlock

import "github.com/redis/go-redis/v9"

// The scripts check ownership and change every key of a lock atomically on
// one node. redis.NewScript computes each SHA1 once; Script.Run sends
// EVALSHA and falls back to EVAL only on NOSCRIPT (after SCRIPT FLUSH or a
// restart), so the steady state costs one round trip per node.
//
// Unless said otherwise, KEYS are the lock's keys, ARGV[1] is the lock value
// and ARGV[2] a TTL in ms.

// acquireScript grants when no lock key is held by another value, setting
// all of them, and returns {1, token}; otherwise it changes nothing and
// returns {0, the other holder's value}. A key that already holds our value
// counts as ours and gets its TTL refreshed, so a retry after a timed-out
// reply never blocks itself (redis.io distlock spec, step 2, made multi-key
// and idempotent). With fencing (ARGV[4] = "1") the token is 1 + the
// largest fencing counter of the lock's resources on this node (KEYS[n+1..]),
// else 0.
//
// With restart gating (ARGV[5] = the gate in ms, else "0") it first checks
// the node's gate marker (the last KEY): a node without the marker has lost
// its data (or is new); it stores the server time (TIME) there and refuses
// with {2, ms left}, and keeps refusing until the gate has passed since then
// (redis.io distlock spec, "Performance, crash recovery and fsync": delayed
// restarts). The marker has no TTL, so a node that keeps its data
// (appendonly + fsync always) is never gated again.
//
// KEYS[1..n] are the lock keys, KEYS[n+1..2n] the fencing counters (with
// fencing only), then the gate marker (with gating only); ARGV[1] is the
// lock value, ARGV[2] the TTL in ms, ARGV[3] is n.
var acquireScript = redis.NewScript(`
local n = tonumber(ARGV[3])
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
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= ARGV[1] then return {0, v} end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
local token = 0
if ARGV[4] == '1' then
  for i = n + 1, 2 * n do
    local c = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
    if c > token then token = c end
  end
  token = token + 1
end
return {1, token}
`)

// fenceScript records a fencing token: when every counter (KEYS) is below
// ARGV[1] it sets them all to it with TTL ARGV[2] ms and returns 1;
// otherwise (another acquisition has already recorded this token or a
// larger one) it changes nothing and returns 0. Because every recorded token
// is on a majority and needs a majority of nodes below it, two acquisitions
// never both record the same token.
var fenceScript = redis.NewScript(`
local t = tonumber(ARGV[1])
for _, k in ipairs(KEYS) do
  local c = tonumber(redis.call('GET', k) or '0') or 0
  if c >= t then return 0 end
end
for _, k in ipairs(KEYS) do
  redis.call('SET', k, ARGV[1], 'PX', ARGV[2])
end
return 1
`)

// extendScript refreshes the TTL of every key (1) only when all of them
// still hold our value; otherwise it changes nothing and returns 0. It never
// creates a key.
var extendScript = redis.NewScript(`
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) ~= ARGV[1] then return 0 end
end
for _, k in ipairs(KEYS) do
  redis.call('PEXPIRE', k, ARGV[2])
end
return 1
`)

// releaseScript deletes every key that holds our value and returns how many
// it deleted (compare-and-delete, redis.io distlock spec, "Releasing the
// lock").
var releaseScript = redis.NewScript(`
local n = 0
for _, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[1] then
    redis.call('DEL', k)
    n = n + 1
  end
end
return n
`)
