-- Release (and the undo of a failed attempt): delete every lock key that
-- holds our owner token and return how many held it (compare-and-delete).
-- KEYS[1..n]: the lock keys, then the layers' keys. ARGV: [1] the lock
-- value (its first TOKEN bytes are the owner token), [2] n, then the layers'
-- arguments (offsets K and A: internal/script). A layer may refuse
-- the release with an error reply before anything is deleted (verify),
-- keep a key that other holds still use (hold), act where a key is
-- deleted (deleted), and after (released); an undo first takes back what
-- the layers' acquire part set beside the keys (undo).
-- Locals a layer's fragment may read: value, n, tok; in hold and deleted
-- the key's i and its value v; hold may set last to false (keep the key)
-- and ours to false (the owner token matches, but this lock's hold there
-- is gone: the key is not counted as released, nor deleted).
local value, n = ARGV[1], tonumber(ARGV[2])
--@ layout
local tok = string.sub(value, 1, TOKEN)
--@ verify
--@ undo
local mine = 0
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if v and string.sub(v, 1, TOKEN) == tok then
    local ours, last = true, true
    --@ hold
    if ours then mine = mine + 1 end
    if last then
      redis.call('DEL', KEYS[i])
      --@ deleted
    end
  end
end
--@ released
return mine
