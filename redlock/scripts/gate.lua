-- Restart gating (gating.go; the redis.io page's "delayed restarts"):
-- KEYS[K.gate + 1] is the gate marker, KEYS[K.gate + 2] the marker of
-- releases before 0.2; ARGV[A.gate + 1] is the gate in ms. A node without
-- its marker lost its data: it stores the server time there and refuses
-- ({2, ms left}) until the gate has passed since then. The marker has no
-- TTL. Acquire checks it first; Extend only before it regains a key.

--@ check regain
local gate = tonumber(ARGV[A.gate + 1])
local marker, legacy = KEYS[K.gate + 1], KEYS[K.gate + 2]
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
