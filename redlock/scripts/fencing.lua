-- Fencing (fencing.go): the counter of lock key i is KEYS[K.fencing + i].
-- Reply: reply[R.fencing + 1] the token this node proposes,
-- reply[R.fencing + 2] the largest counter, reply[R.fencing + 3] the
-- token a re-entry keeps, or 0.

--@ granted
-- The token this node proposes is above every counter of the lock's
-- resources and at least the node's clock in microseconds.
local largest = 0
for i = 1, n do
  local c = tonumber(redis.call('GET', KEYS[K.fencing + i]) or '0') or 0
  if c > largest then largest = c end
end
local t = redis.call('TIME')
reply[R.fencing + 1] = math.max(largest + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
reply[R.fencing + 2] = largest
reply[R.fencing + 3] = 0
-- A re-entry that holds every key already keeps its hold's token, noted
-- in the holds (field '_t').
if K.reentrant and mine == n then
  local kept = redis.call('HGET', KEYS[K.reentrant + 1], '_t')
  if kept then reply[R.fencing + 3] = tonumber(kept) end
end
