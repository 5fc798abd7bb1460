-- Wake on release (wake.go). An Acquire's attempt that a holder's key
-- refuses marks the key: the byte after the owner token, '-' or 'T',
-- becomes '_' or 't'. A Release that deletes a marked key publishes
-- ARGV[A.wake + 1], the notice ID ('' for none), on "<key>:released";
-- PUBLISH runs under pcall, so that a user whose ACL denies the channel
-- still releases.

--@ refused
local c = string.sub(v, TOKEN + 1, TOKEN + 1)
if c == '-' then redis.call('SETRANGE', KEYS[i], TOKEN, '_')
elseif c == 'T' then redis.call('SETRANGE', KEYS[i], TOKEN, 't') end

--@ deleted
local c = string.sub(v, TOKEN + 1, TOKEN + 1)
if ARGV[A.wake + 1] ~= '' and (c == '_' or c == 't') then
  redis.pcall('PUBLISH', KEYS[i] .. ':released', ARGV[A.wake + 1])
end
