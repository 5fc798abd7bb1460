-- Acquire: the redis.io step on this node, for every key of one lock at
-- once: SET key value NX PX ttl, all or nothing.
-- KEYS[1..n]: the lock keys, then the layers' keys. ARGV: [1] the lock
-- value (its first TOKEN bytes are the owner token), [2] the TTL in ms, [3]
-- n, then the layers' arguments. K, A and R say where each layer's keys,
-- arguments and reply elements are, I a refusing layer's index, TOKEN the
-- owner token's length (written in by internal/script).
-- Reply: {1, the layers' elements...} granted; {0, holder's value, its
-- PTTL, i} refused by lock key i, or by a layer (i = I.<layer>, <= 0); a
-- layer's own reply (gating's {2, ms left}).
-- Locals a layer's fragment may read: value, ttl, n, tok; in refused the
-- refusing key's i and its value v; in granted mine (keys already ours)
-- and reply (it appends its elements).
local value, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
--@ layout
local tok = string.sub(value, 1, TOKEN)

-- The layers' refusals come before anything is set.
--@ check

-- SET NX PX per key. A key that holds our owner token is ours: a command
-- sent again after a lost reply, or a re-entry of a reentrant owner. A key
-- that holds another's refuses, and the keys this script set are deleted
-- again (all or nothing).
local set, mine = {}, 0
for i = 1, n do
  if redis.call('SET', KEYS[i], value, 'PX', ttl, 'NX') then
    set[#set + 1] = i
  else
    local v = redis.call('GET', KEYS[i])
    if string.sub(v, 1, TOKEN) ~= tok then
      for _, j in ipairs(set) do redis.call('DEL', KEYS[j]) end
      --@ refused
      return {0, v, redis.call('PTTL', KEYS[i]), i}
    end
    mine = mine + 1
  end
end
-- TTLs are raised, never lowered: other holds of a reentrant owner rely
-- on them.
for i = 1, n do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end

local reply = {1}
--@ granted
return reply
