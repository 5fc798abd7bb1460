package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestAttack6InlineExclusion: on a Client of one node whose go-redis client
// applies deadlines (so rounds may go inline), many goroutines mixing
// TryAcquire, Acquire, Extend and Release on one key never hold it at the
// same time, every Release of a held lock succeeds, and no key is left.
func TestAttack6InlineExclusion(t *testing.T) {
	for _, ctxTimeout := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			s := redlocktest.StartServer(t)
			var rdb *redis.Client
			if ctxTimeout {
				rdb = ctxTimeoutClient(t, s, 0)
			} else {
				rdb = plainClient(t, s, 0)
			}
			c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(time.Second))
			ctx := context.Background()
			var holders, grants atomic.Int32
			var wg sync.WaitGroup
			for g := range 12 {
				wg.Go(func() {
					for i := range 40 {
						var l *redlock.Lock
						var err error
						if (g+i)%3 == 0 {
							actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
							l, err = c.Acquire(actx, []string{"k"}, 10*time.Second)
							cancel()
						} else {
							l, err = c.TryAcquire(ctx, []string{"k"}, 10*time.Second)
						}
						if err != nil {
							if !errors.Is(err, redlock.ErrNotAcquired) {
								t.Errorf("acquire: %v", err)
							}
							continue
						}
						grants.Add(1)
						if n := holders.Add(1); n != 1 {
							t.Errorf("%d holders of k at once", n)
						}
						if i%2 == 0 {
							if err := l.Extend(ctx, 10*time.Second); err != nil {
								t.Errorf("Extend of a held lock: %v", err)
							}
						}
						holders.Add(-1)
						if err := l.Release(ctx); err != nil {
							t.Errorf("Release of a held lock: %v", err)
						}
					}
				})
			}
			wg.Wait()
			if grants.Load() == 0 {
				t.Fatal("no goroutine ever held k")
			}
			must(t, c.Wait(ctx))
			if keys := s.Keys(t); len(keys) != 0 {
				t.Errorf("keys left after every lock was released: %v", keys)
			}
		})
	}
}

// TestAttack6CloseDuringInlineCalls: Close while many goroutines send
// rounds (inline and queued) to one node returns, every call returns, and
// goleak (TestMain) finds no goroutine left.
func TestAttack6CloseDuringInlineCalls(t *testing.T) {
	s := redlocktest.StartServer(t)
	rdb := ctxTimeoutClient(t, s, 0)
	c, err := redlock.New([]redis.UniversalClient{rdb}, redlock.WithNodeTimeout(time.Second))
	must(t, err)
	ctx := context.Background()
	var wg sync.WaitGroup
	var calls atomic.Int32
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				l, err := c.TryAcquire(ctx, []string{fmt.Sprintf("k%d", g%3)}, 10*time.Second)
				calls.Add(1)
				if errors.Is(err, redlock.ErrClosed) {
					return
				}
				if err == nil {
					_ = l.Release(ctx)
				}
			}
		})
	}
	for calls.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Close(cctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return")
	}
	wg.Wait()
}

// TestAttack6FrozenNodeRoundsEnd: concurrent rounds on a Client of one
// frozen node (go-redis default retries) each end within about the node
// timeout, with and without ContextTimeoutEnabled, and the Client works
// again once the node wakes.
func TestAttack6FrozenNodeRoundsEnd(t *testing.T) {
	for _, ctxTimeout := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			s := redlocktest.StartServer(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: ctxTimeout, ReadTimeout: 3 * time.Second})
			t.Cleanup(func() { _ = rdb.Close() })
			c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(100*time.Millisecond))
			ctx := context.Background()
			held, err := c.TryAcquire(ctx, []string{"held"}, 30*time.Second)
			must(t, err)
			time.Sleep(300 * time.Millisecond) // the sender ends: the next call is inline
			s.Stop(t)
			var wg sync.WaitGroup
			for g := range 6 {
				wg.Go(func() {
					for i := range 3 {
						start := time.Now()
						var err error
						switch (g + i) % 3 {
						case 0:
							_, err = c.TryAcquire(ctx, []string{"f"}, 10*time.Second)
						case 1:
							err = held.Extend(ctx, 30*time.Second)
						case 2:
							_, _, err = c.HolderMetadata(ctx, "held")
						}
						if took := time.Since(start); took > 1500*time.Millisecond {
							t.Errorf("round %d/%d on the frozen node took %v (err %v), want about 100ms", g, i, took, err)
						}
						if err == nil {
							t.Errorf("round %d/%d on the frozen node succeeded", g, i)
						}
					}
				})
			}
			wg.Wait()
			start := time.Now()
			err = held.Release(ctx)
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("Release on the frozen node took %v (err %v)", took, err)
			}
			s.Cont(t)
			// Once the node wakes (and any stuck read ended), the Client works again.
			deadline := time.Now().Add(20 * time.Second)
			for {
				l, err := c.TryAcquire(ctx, []string{"after"}, 10*time.Second)
				if err == nil {
					must(t, l.Release(ctx))
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("TryAcquire after the node woke: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
