package faults

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Store is the protected resource of the pause scenarios: a register
// written by lock holders, kept on a Redis server outside the lock's
// quorum, that logs every write it accepts. A fenced write carries the
// writer's fencing token and is rejected when the token is lower than the
// highest one accepted so far (the check a fenced store or a database
// constraint makes); an unfenced write is always accepted.
type Store struct {
	rdb redis.UniversalClient
	key string
}

// NewStore returns the store named key on rdb.
func NewStore(rdb redis.UniversalClient, key string) Store { return Store{rdb: rdb, key: key} }

// KEYS: highest token, accepted log, rejected log. ARGV: token, entry,
// fenced ("1" or "0").
var storeWrite = redis.NewScript(`
if ARGV[3] == '1' then
  local top = tonumber(redis.call('GET', KEYS[1]) or '0')
  if tonumber(ARGV[1]) < top then
    redis.call('RPUSH', KEYS[3], ARGV[2])
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
`)

func (s Store) keys() []string {
	return []string{s.key + ":top", s.key + ":accepted", s.key + ":rejected"}
}

// Write writes on behalf of owner with token, fenced or not, and reports
// whether the store accepted it.
func (s Store) Write(ctx context.Context, owner string, token uint64, fenced bool) (bool, error) {
	f := "0"
	if fenced {
		f = "1"
	}
	n, err := storeWrite.Run(ctx, s.rdb, s.keys(), token, owner+" "+strconv.FormatUint(token, 10), f).Int64()
	if err != nil {
		return false, fmt.Errorf("store write: %w", err)
	}
	return n == 1, nil
}

// StoreWrite is one logged write.
type StoreWrite struct {
	Owner string
	Token uint64
}

// Log returns the accepted and the rejected writes, each in order.
func (s Store) Log(ctx context.Context) (accepted, rejected []StoreWrite, err error) {
	read := func(key string) ([]StoreWrite, error) {
		entries, err := s.rdb.LRange(ctx, key, 0, -1).Result()
		if err != nil {
			return nil, err
		}
		out := make([]StoreWrite, 0, len(entries))
		for _, e := range entries {
			owner, tok, _ := strings.Cut(e, " ")
			n, _ := strconv.ParseUint(tok, 10, 64)
			out = append(out, StoreWrite{Owner: owner, Token: n})
		}
		return out, nil
	}
	k := s.keys()
	if accepted, err = read(k[1]); err != nil {
		return nil, nil, err
	}
	if rejected, err = read(k[2]); err != nil {
		return nil, nil, err
	}
	return accepted, rejected, nil
}
