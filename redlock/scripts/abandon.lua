-- Abandon: delete the lock key KEYS[1] when its value carries exactly the
-- metadata ARGV[1] (keys.go: the owner token, then '-' or '_' and the
-- metadata, or 'T' or 't', a 55-character traceparent and the metadata).
-- Reply: 1 deleted, 0 not (absent, or another value).
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local c = string.sub(v, 33, 33)
local md
if c == '-' or c == '_' then
  md = string.sub(v, 34)
elseif c == 'T' or c == 't' then
  md = string.sub(v, 34 + 55)
else
  return 0
end
if md ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
