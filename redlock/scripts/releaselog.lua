-- The release log (releaselog.go, WithReleaseLog): KEYS[K.log + 1] a
-- list; ARGV[A.log + 1] its length, ARGV[A.log + 2] its TTL in ms, the
-- rest the entries to push, oldest first.

--@ released
local list = KEYS[K.log + 1]
for j = A.log + 3, #ARGV do redis.call('LPUSH', list, ARGV[j]) end
redis.call('LTRIM', list, 0, tonumber(ARGV[A.log + 1]) - 1)
redis.call('PEXPIRE', list, ARGV[A.log + 2])
