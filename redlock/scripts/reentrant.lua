-- Reentrancy (reentrant.go): the holds hash of lock key i is
-- KEYS[K.reentrant + i]; ARGV[A.reentrant + 1] is the acquisition ID, a
-- field of each holds hash while that hold lasts.

--@ granted extended
-- The hold joins each holds hash; TTLs are raised, never lowered: other
-- holds of the owner rely on them.
for i = 1, n do
  local h = KEYS[K.reentrant + i]
  redis.call('HSET', h, ARGV[A.reentrant + 1], '1')
  if redis.call('PTTL', h) < ttl then redis.call('PEXPIRE', h, ttl) end
end

--@ hold
-- Remove this hold; the key goes only with the last hold (the field '_t',
-- fencing's note, is not a hold). A hold that is not there expired: the
-- owner holds the key again by another acquisition, which keeps it.
local h = KEYS[K.reentrant + i]
if redis.call('HDEL', h, ARGV[A.reentrant + 1]) == 0 then
  ours, last = false, false
else
  last = redis.call('HLEN', h) - redis.call('HEXISTS', h, '_t') <= 0
  if last then redis.call('DEL', h) end
end
