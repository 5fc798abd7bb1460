-- Abandon: delete the lock key KEYS[1] when it is a plain lock (no
-- reentrant holds KEYS[2] beside it) whose value carries exactly the
-- metadata ARGV[1] (keys.go: the owner token, then '-' or '_' and the
-- metadata, or 'T' or 't', a 55-character traceparent and the metadata);
-- and, when KEYS[3] is given, put back the high-water mark before the one
-- that an acquisition with that metadata raised there (as an undo does,
-- release.lua). Reply: 1 when it deleted or put back something, else 0.
-- TOKEN is the owner token's length (internal/script).
--@ layout
local function metadata(v)
  local c = string.sub(v, TOKEN + 1, TOKEN + 1)
  if c == '-' or c == '_' then return string.sub(v, TOKEN + 2) end
  if c == 'T' or c == 't' then return string.sub(v, TOKEN + 2 + 55) end
  return nil
end
local done = 0
local v = redis.call('GET', KEYS[1])
if v and metadata(v) == ARGV[1] and redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
  done = 1
end
if KEYS[3] then
  local m = redis.call('HMGET', KEYS[3], 'v', 'pm', 'pv')
  if m[1] and metadata(m[1]) == ARGV[1] then
    if m[2] == 'r' then
      -- the mark before is not known (an earlier undo put this one
      -- back): leave it, a scheduled time lost rather than run twice
    elseif m[2] and m[2] ~= '' then
      redis.call('HSET', KEYS[3], 'm', m[2], 'v', m[3], 'pm', 'r', 'pv', '')
    else
      redis.call('DEL', KEYS[3])
    end
    done = 1
  end
end
return done
