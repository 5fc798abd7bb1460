-- The record of an acquisition (record.go, WithRecord): KEYS[K.record + 1];
-- ARGV[A.record + 1] its TTL in ms. Another's record refuses like a held
-- key, with i = I.record, before the lock's keys; the record is never extended or
-- released: it expires after its own TTL. An undo deletes it.

--@ check
local v = redis.call('GET', KEYS[K.record + 1])
if v and string.sub(v, 1, TOKEN) ~= tok then
  return {0, v, redis.call('PTTL', KEYS[K.record + 1]), I.record}
end

--@ granted
redis.call('SET', KEYS[K.record + 1], value, 'PX', ARGV[A.record + 1])

--@ undo
local v = redis.call('GET', KEYS[K.record + 1])
if v and string.sub(v, 1, TOKEN) == tok then redis.call('DEL', KEYS[K.record + 1]) end
