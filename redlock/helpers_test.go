package redlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// ctxTimeoutClient returns a client of s with ContextTimeoutEnabled (and
// readTimeout, 0 for go-redis's default), closed at the end of the test.
func ctxTimeoutClient(t *testing.T, s *redlocktest.Server, readTimeout time.Duration) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, ReadTimeout: readTimeout})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// plainClient returns a client of s with go-redis's defaults but
// readTimeout (ContextTimeoutEnabled off), closed at the end of the test.
func plainClient(t *testing.T, s *redlocktest.Server, readTimeout time.Duration) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: readTimeout})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// readTimeoutClients returns a client per server of cl with readTimeout,
// and ContextTimeoutEnabled when ctxTimeout (ctxTimeoutClient, else
// plainClient).
func readTimeoutClients(t *testing.T, cl redlocktest.Cluster, readTimeout time.Duration, ctxTimeout bool) []redis.UniversalClient {
	t.Helper()
	nodes := make([]redis.UniversalClient, len(cl))
	for i, s := range cl {
		if ctxTimeout {
			nodes[i] = ctxTimeoutClient(t, s, readTimeout)
		} else {
			nodes[i] = plainClient(t, s, readTimeout)
		}
	}
	return nodes
}

// commandHook counts the commands go-redis processes (a pipeline counts
// once per command).
type commandHook struct{ calls atomic.Int32 }

func (h *commandHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.Add(1)
		return next(ctx, cmd)
	}
}

func (h *commandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.calls.Add(int32(len(cmds)))
		return next(ctx, cmds)
	}
}

// must ends the test when err is not nil.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
