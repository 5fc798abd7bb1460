-- The release log (releaselog.go, WithReleaseLog): KEYS[K.log + 1] a
-- list; ARGV[A.log + 1] its length, ARGV[A.log + 2] its TTL in ms, the
-- rest the entries to push, oldest first.

--@ verify
-- A key of another type under the list's name (another key has its name)
-- fails the release before it deletes anything, so that its error is
-- true: the lock was kept.
local kind = redis.call('TYPE', KEYS[K.log + 1])['ok']
if kind ~= 'none' and kind ~= 'list' then
  return redis.error_reply('WRONGTYPE the release log list holds a ' .. kind .. ', not a list')
end

--@ released
local list = KEYS[K.log + 1]
for j = A.log + 3, #ARGV do redis.call('LPUSH', list, ARGV[j]) end
redis.call('LTRIM', list, 0, tonumber(ARGV[A.log + 1]) - 1)
redis.call('PEXPIRE', list, ARGV[A.log + 2])
