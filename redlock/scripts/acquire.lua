-- Acquire: set every lock key of one lock on this node, all or nothing.
-- KEYS: n lock keys; then n holds hashes (reentrant locks); then n fencing
-- counters (fenced locks); then the restart gate marker and the marker of
-- releases before 0.2 (gated clients); then the record key (WithRecord);
-- then the high-water mark (WithHighWater), a hash: m the mark, v the
-- value of the acquisition that raised it, pm and pv the ones before.
-- ARGV: [1] lock value, [2] TTL in ms, [3] n, [4] acquisition ID of a
-- reentrant lock or '', [5] '1' for fencing, [6] the restart gate in ms or
-- '0', [7] '1' when a refusal marks the holder's key for a release notice,
-- [8] the record's TTL in ms or '0' for no record, [9] the mark or '' for
-- none, [10] the mark's TTL in ms.
-- Reply: {1} granted, with fencing {1, proposed token, largest counter}
-- and, for a re-entry whose hold noted a token, that token as a fourth
-- element; with a mark always {1, token or 0, largest or 0, noted token
-- or 0, the mark before or 0}; {0, holder's value, its PTTL, i} refused
-- by lock key i, or by the record for i = 0, and {0, value, PTTL, -1,
-- mark} refused by the mark; {2, ms left} gated.
local n = tonumber(ARGV[3])
local aid = ARGV[4]
local ttl = tonumber(ARGV[2])
local rttl = tonumber(ARGV[8])
local hw = tonumber(ARGV[9] or '')
local last = #KEYS
local mk = nil
if hw then mk = KEYS[last]; last = last - 1 end
local rk = nil
if rttl > 0 then rk = KEYS[last]; last = last - 1 end
local nk = n
if aid ~= '' then nk = 2 * n end

-- Restart gating ("delayed restarts"): a node without its marker lost its
-- data; it stores the server time there and refuses until the gate has
-- passed since then. The marker has no TTL.
if ARGV[6] ~= '0' then
  local gate = tonumber(ARGV[6])
  local marker, legacy = KEYS[last - 1], KEYS[last]
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

-- A key that holds our owner token is ours: a command sent again after a
-- lost reply, or a re-entry of a reentrant owner. Another's record refuses
-- like a held key, and first.
local tok = string.sub(ARGV[1], 1, 32)
if rk then
  local v = redis.call('GET', rk)
  if v and string.sub(v, 1, 32) ~= tok then
    return {0, v, redis.call('PTTL', rk), 0}
  end
end
-- A mark at or above ours that another acquisition raised refuses next.
local mark = nil
if mk then
  mark = redis.call('HMGET', mk, 'm', 'v', 'pm')
  if mark[1] and string.sub(mark[2], 1, 32) ~= tok and tonumber(mark[1]) >= hw then
    return {0, mark[2], redis.call('PTTL', mk), -1, tonumber(mark[1])}
  end
end
local mine = 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v then
    if string.sub(v, 1, 32) ~= tok then
      if ARGV[7] == '1' then
        local c = string.sub(v, 33, 33)
        if c == '-' then redis.call('SETRANGE', KEYS[i], 32, '_')
        elseif c == 'T' then redis.call('SETRANGE', KEYS[i], 32, 't') end
      end
      return {0, v, redis.call('PTTL', KEYS[i]), i}
    end
    mine = mine + 1
  end
end
-- TTLs are raised, never lowered: other holds of the owner rely on them.
for i = 1, n do
  if not redis.call('SET', KEYS[i], ARGV[1], 'PX', ttl, 'NX') and redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  if aid ~= '' then
    redis.call('HSET', KEYS[n + i], aid, '1')
    if redis.call('PTTL', KEYS[n + i]) < ttl then redis.call('PEXPIRE', KEYS[n + i], ttl) end
  end
end
-- The record is never extended or released: it expires after its own TTL.
if rk then redis.call('SET', rk, ARGV[1], 'PX', rttl) end
-- The mark keeps the one before it for an undo; a resent command finds
-- its own value and keeps both.
local before = 0
if mk then
  if mark[1] and string.sub(mark[2], 1, 32) == tok then
    before = tonumber(mark[3]) or 0
  else
    before = tonumber(mark[1]) or 0
    redis.call('HSET', mk, 'm', ARGV[9], 'v', ARGV[1], 'pm', mark[1] or '', 'pv', mark[2] or '')
  end
  redis.call('PEXPIRE', mk, ARGV[10])
end
if ARGV[5] ~= '1' then
  if mk then return {1, 0, 0, 0, before} end
  return {1}
end

-- Fencing: the token this node proposes is above every counter of the
-- lock's resources and at least the node's clock in microseconds.
local largest = 0
for i = nk + 1, nk + n do
  local c = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if c > largest then largest = c end
end
local t = redis.call('TIME')
local token = math.max(largest + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
if aid ~= '' and mine == n then
  local kept = redis.call('HGET', KEYS[n + 1], '_t')
  if kept then return {1, token, largest, tonumber(kept), before} end
end
return {1, token, largest, 0, before}
