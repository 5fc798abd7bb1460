-- The high-water mark (highwater.go, WithHighWater): KEYS[K.mark + 1], a
-- hash: m the mark, v the value of the acquisition that raised it, pm and
-- pv the ones before. ARGV[A.mark + 1] the mark, ARGV[A.mark + 2] its TTL
-- in ms. Reply: reply[R.mark + 1] the mark before, or 0.

--@ check
-- A mark at or above ours that another acquisition raised refuses, with
-- i = I.mark and the mark, after a record and before the lock's keys.
local m = redis.call('HMGET', KEYS[K.mark + 1], 'm', 'v')
if m[1] and string.sub(m[2], 1, TOKEN) ~= tok and tonumber(m[1]) >= tonumber(ARGV[A.mark + 1]) then
  return {0, m[2], redis.call('PTTL', KEYS[K.mark + 1]), I.mark, tonumber(m[1])}
end

--@ granted
-- The mark keeps the one before it for an undo; a resent command finds
-- its own value and keeps both.
local mk = KEYS[K.mark + 1]
local m = redis.call('HMGET', mk, 'm', 'v', 'pm')
if m[1] and string.sub(m[2], 1, TOKEN) == tok then
  reply[R.mark + 1] = tonumber(m[3]) or 0
else
  reply[R.mark + 1] = tonumber(m[1]) or 0
  redis.call('HSET', mk, 'm', ARGV[A.mark + 1], 'v', value, 'pm', m[1] or '', 'pv', m[2] or '')
end
redis.call('PEXPIRE', mk, ARGV[A.mark + 2])

--@ undo
-- If this attempt raised the mark, the mark before is put back, with 'r'
-- as its own "before", so that a second undo on the same mark, whose
-- "before" is then unknown, leaves it as it is rather than lower it.
local mk = KEYS[K.mark + 1]
local m = redis.call('HMGET', mk, 'v', 'pm', 'pv')
if m[1] and string.sub(m[1], 1, TOKEN) == tok then
  if m[2] == 'r' then
    -- An earlier undo put this mark back and the one before it is not
    -- known: leave it (a scheduled time lost, never run twice).
  elseif m[2] and m[2] ~= '' then
    redis.call('HSET', mk, 'm', m[2], 'v', m[3], 'pm', 'r', 'pv', '')
  else
    redis.call('DEL', mk)
  end
end
