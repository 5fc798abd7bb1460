package redlock

import "github.com/redis/go-redis/v9"

// The scripts check ownership and change every key of a lock atomically on
// one node. redis.NewScript computes each SHA1 once; Script.Run sends
// EVALSHA and falls back to EVAL only on NOSCRIPT (after SCRIPT FLUSH or a
// restart), so the steady state costs one round trip per node.
//
// KEYS are the lock's keys; ARGV[1] is the lock value, ARGV[2] the TTL in ms.

// acquireScript grants (1) when no key is held by another value, setting all
// of them; otherwise it changes nothing and returns 0. A key that already
// holds our value counts as ours and gets its TTL refreshed, so a retry after
// a timed-out reply never blocks itself (redis.io distlock spec, step 2, made
// multi-key and idempotent).
var acquireScript = redis.NewScript(`
for _, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v and v ~= ARGV[1] then return 0 end
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
