-- Release: delete every lock key (KEYS[1..n]) that holds our owner token
-- (the first 32 bytes of ARGV[1]) and return how many held it
-- (compare-and-delete). For a reentrant lock (ARGV[2] is the acquisition
-- ID; KEYS[n+1..2n] are the holds hashes) remove this acquisition's hold and
-- delete the key only when no hold is left. When ARGV[3] is not empty, a
-- deleted key that a waiter marked (byte 33 '_' or 't') publishes ARGV[3] on
-- "<key>:released"; PUBLISH runs under pcall, so that a user whose ACL
-- denies the channel still releases. When ARGV[4] is '1' (the undo of an
-- attempt that raised a high-water mark), the last key is the mark: if
-- this attempt raised it, the mark before is put back (not counted), with
-- 'r' as its own "before", so that a second undo on the same mark, whose
-- "before" is then unknown, leaves it as it is rather than lower it.
local tok = string.sub(ARGV[1], 1, 32)
local aid = ARGV[2]
local n = #KEYS
-- WithReleaseLog: the last key is a list; ARGV[5] its length, ARGV[6]
-- its TTL in ms, ARGV[7..] the entries to push, oldest first.
local list = nil
if ARGV[5] then
  list = KEYS[n]
  n = n - 1
end
if ARGV[4] == '1' then
  local mk = KEYS[n]
  n = n - 1
  local m = redis.call('HMGET', mk, 'v', 'pm', 'pv')
  if m[1] and string.sub(m[1], 1, 32) == tok then
    if m[2] == 'r' then
      -- An earlier undo put this mark back and the one before it is not
      -- known: leave it (a scheduled time lost, never run twice).
    elseif m[2] and m[2] ~= '' then
      redis.call('HSET', mk, 'm', m[2], 'v', m[3], 'pm', 'r', 'pv', '')
    else
      redis.call('DEL', mk)
    end
  end
end
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
      if ARGV[3] ~= '' and (c == '_' or c == 't') then
        redis.pcall('PUBLISH', KEYS[i] .. ':released', ARGV[3])
      end
    end
  end
end
if list then
  for i = 7, #ARGV do redis.call('LPUSH', list, ARGV[i]) end
  redis.call('LTRIM', list, 0, tonumber(ARGV[5]) - 1)
  redis.call('PEXPIRE', list, ARGV[6])
end
return mine
