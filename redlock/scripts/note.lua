-- Note: once a fence round has recorded ARGV[1] on a quorum, note it as
-- the token of the reentrant hold (field '_t') in each holds hash (KEYS)
-- that has the acquisition ID ARGV[2], for the owner's re-entries to keep.
-- Never in another owner's hash, never for a token no quorum recorded.
-- Returns 1.
for i = 1, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[2]) == 1 then
    redis.call('HSET', KEYS[i], '_t', ARGV[1])
  end
end
return 1
