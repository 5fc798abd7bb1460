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

// TestAttack6ReleaseLogOtherTypes: a release log whose list name holds a
// hash, set, sorted set or stream refuses the Release before deleting
// anything (ErrMisconfigured), for plain, reentrant and fenced locks; a
// valid log then releases each of them.
func TestAttack6ReleaseLogOtherTypes(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithKeyPrefix("p:"))
	ctx := context.Background()
	kinds := map[string]func(rdb *redis.Client) error{
		"hash": func(rdb *redis.Client) error { return rdb.HSet(ctx, "p:log", "f", "v").Err() },
		"set":  func(rdb *redis.Client) error { return rdb.SAdd(ctx, "p:log", "v").Err() },
		"zset": func(rdb *redis.Client) error { return rdb.ZAdd(ctx, "p:log", redis.Z{Member: "v"}).Err() },
		"stream": func(rdb *redis.Client) error {
			return rdb.XAdd(ctx, &redis.XAddArgs{Stream: "p:log", Values: []any{"f", "v"}}).Err()
		},
	}
	variants := map[string][]redlock.LockOption{
		"plain":     nil,
		"reentrant": {redlock.WithOwner("o")},
		"fenced":    {redlock.WithFencing(true)},
		"both":      {redlock.WithOwner("o2"), redlock.WithFencing(true)},
	}
	for kind, set := range kinds {
		for name, opts := range variants {
			res := "r-" + kind + "-" + name
			for _, s := range cl {
				rdb := s.Client(t)
				must(t, rdb.Del(ctx, "p:log").Err())
				must(t, set(rdb))
			}
			l, err := c.TryAcquire(ctx, []string{res}, 10*time.Second, opts...)
			must(t, err)
			err = l.Release(ctx, redlock.WithReleaseLog("log", 2, time.Minute, "entry"))
			if !errors.Is(err, redlock.ErrMisconfigured) {
				t.Errorf("%s/%s: Release with a log on a %s: %v, want ErrMisconfigured", kind, name, kind, err)
			}
			waitSettled(t, c) // the acquire and the release on every node, also the last to answer
			for i, s := range cl {
				rdb := s.Client(t)
				if n := rdb.Exists(ctx, "p:"+res).Val(); n != 1 {
					t.Errorf("%s/%s: node %d: the lock's key is gone after a refused Release", kind, name, i)
				}
				if ty := rdb.Type(ctx, "p:log").Val(); ty != kind {
					t.Errorf("%s/%s: node %d: the log's key is a %q now", kind, name, i, ty)
				}
				must(t, rdb.Del(ctx, "p:log").Err())
			}
			// The refused Lock stays held (TestAttack6RefusedReleaseCannotBeRetried);
			// a fresh one releases with a valid log.
			must(t, l.Release(ctx))
			l, err = c.TryAcquire(ctx, []string{res + "-2"}, 10*time.Second, opts...)
			must(t, err)
			if err := l.Release(ctx, redlock.WithReleaseLog("log", 2, time.Minute, "entry")); err != nil {
				t.Errorf("%s/%s: Release with a valid log: %v", kind, name, err)
			}
			waitSettled(t, c) // Release returns at a quorum: the last node too
			for i, s := range cl {
				rdb := s.Client(t)
				if n := rdb.Exists(ctx, "p:"+res+"-2").Val(); n != 0 {
					t.Errorf("%s/%s: node %d: the lock's key is left after Release", kind, name, i)
				}
				if v := rdb.LRange(ctx, "p:log", 0, -1).Val(); len(v) != 1 || v[0] != "entry" {
					t.Errorf("%s/%s: node %d: log %q, want [entry]", kind, name, i, v)
				}
			}
		}
	}
}

// TestAttack6ReentrantReleaseLog: two holds of one owner (fenced); a
// Release of the first refused by the log's check (a hash under its name)
// keeps both holds; with a valid log, releasing one hold keeps the lock
// for the other, releasing that frees it, and both entries are logged.
func TestAttack6ReentrantReleaseLog(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	opts := []redlock.LockOption{redlock.WithOwner("me"), redlock.WithFencing(true)}
	a, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second, opts...)
	must(t, err)
	for _, s := range cl {
		must(t, s.Client(t).HSet(ctx, "log", "f", "v").Err())
	}
	if err := a.Release(ctx, redlock.WithReleaseLog("log", 5, time.Minute, "a")); !errors.Is(err, redlock.ErrMisconfigured) {
		t.Fatalf("refused Release: %v, want ErrMisconfigured", err)
	}
	if _, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("another owner acquired r after a refused Release: %v", err)
	}
	for _, s := range cl {
		must(t, s.Client(t).Del(ctx, "log").Err())
	}
	x, err := c.TryAcquire(ctx, []string{"r2"}, 10*time.Second, opts...)
	must(t, err)
	y, err := c.TryAcquire(ctx, []string{"r2"}, 10*time.Second, opts...)
	must(t, err)
	must(t, x.Release(ctx, redlock.WithReleaseLog("log", 5, time.Minute, "x")))
	if _, err := c.TryAcquire(ctx, []string{"r2"}, 10*time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("another owner acquired r2 while y still holds it: %v", err)
	}
	must(t, y.Extend(ctx, 10*time.Second))
	must(t, y.Release(ctx, redlock.WithReleaseLog("log", 5, time.Minute, "y")))
	l, err := c.TryAcquire(ctx, []string{"r2"}, 10*time.Second, redlock.WithFencing(true))
	must(t, err)
	if l.FencingToken() <= y.FencingToken() || y.FencingToken() < x.FencingToken() {
		t.Errorf("fencing tokens x %d, y %d, next holder %d: want them not to go back", x.FencingToken(), y.FencingToken(), l.FencingToken())
	}
	must(t, l.Release(ctx))
	for i, s := range cl {
		if v := s.Client(t).LRange(ctx, "log", 0, -1).Val(); len(v) != 2 || v[0] != "y" || v[1] != "x" {
			t.Errorf("node %d: log %q, want [y x]", i, v)
		}
	}
}

// TestAttack6RefusedReleaseCannotBeRetried: a Release refused by the
// release log's check deleted nothing on any node (the verify hook); the
// Lock must stay held so that a second Release, without the log, frees
// it (it used to count as released: the second Release returned nil,
// sent nothing, and the keys stayed until their TTL).
func TestAttack6RefusedReleaseCannotBeRetried(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	for _, s := range cl {
		must(t, s.Client(t).Set(ctx, "log", "a string", 0).Err())
	}
	l, err := c.TryAcquire(ctx, []string{"run"}, 10*time.Second)
	must(t, err)
	if err := l.Release(ctx, redlock.WithReleaseLog("log", 2, time.Minute, "entry")); !errors.Is(err, redlock.ErrMisconfigured) {
		t.Fatalf("Release with a log on a string: %v, want ErrMisconfigured", err)
	}
	must(t, l.Release(ctx)) // without the log: should release
	waitSettled(t, c)       // on every node, also the one that answered last
	for i, s := range cl {
		if n := s.Client(t).Exists(ctx, "run").Val(); n != 0 {
			t.Errorf("node %d: the lock's key is still there after the second Release returned nil", i)
		}
	}
}

// TestAttack6QuorumFirstExclusionUnderFaults: contenders mixing
// quorum-first rounds (given to New, and to a call) and plain ones on the
// same resources, while one node is frozen and thawed and another killed
// (losing its data) and restarted, under restart gating: a grant never
// comes while another holder's validity has not ended.
func TestAttack6QuorumFirstExclusionUnderFaults(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	gate := 2 * time.Second
	for _, s := range cl { // the nodes have voted for longer than the gate
		must(t, s.Client(t).Set(ctx, "\x00restart-gate", "0", 0).Err())
	}
	clients := []*redlock.Client{
		newClient(t, readTimeoutClients(t, cl, 0, true), redlock.WithNodeTimeout(150*time.Millisecond), redlock.WithRestartGating(gate), redlock.WithQuorumFirst()),
		newClient(t, readTimeoutClients(t, cl, time.Second, false), redlock.WithNodeTimeout(150*time.Millisecond), redlock.WithRestartGating(gate)),
		newClient(t, readTimeoutClients(t, cl, 0, true), redlock.WithNodeTimeout(150*time.Millisecond), redlock.WithRestartGating(gate)),
	}
	type hold struct {
		l     *redlock.Lock
		until time.Time
	}
	var mu sync.Mutex
	cur := map[string]*hold{}
	var granted, violations atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			c := clients[w%len(clients)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res := fmt.Sprintf("r%d", i%2)
				opts := []redlock.LockOption{redlock.WithRetry(constantRetry(5 * time.Millisecond))}
				if w%4 == 1 {
					opts = append(opts, redlock.WithQuorumFirst())
				}
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				l, err := c.Acquire(actx, []string{res}, time.Second, opts...)
				cancel()
				if err != nil {
					continue
				}
				mu.Lock()
				if h := cur[res]; h != nil && time.Now().Before(h.until) {
					violations.Add(1)
					t.Errorf("%s granted to worker %d while another holder is valid for %v more", res, w, time.Until(h.until))
				}
				cur[res] = &hold{l: l, until: l.Until()}
				mu.Unlock()
				granted.Add(1)
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				if h := cur[res]; h != nil && h.l == l {
					delete(cur, res)
				}
				mu.Unlock()
				_ = l.Release(ctx)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	cl[0].Stop(t)
	time.Sleep(400 * time.Millisecond)
	cl[1].Kill(t)
	time.Sleep(200 * time.Millisecond)
	cl[0].Cont(t)
	time.Sleep(300 * time.Millisecond)
	cl[1].Restart(t)
	cl[2].Stop(t)
	time.Sleep(400 * time.Millisecond)
	cl[2].Cont(t)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if granted.Load() == 0 {
		t.Fatal("no contender ever held a lock")
	}
	t.Logf("%d grants, %d violations", granted.Load(), violations.Load())
}

// TestAttack6SharedOptionsAtNewAndCall: a SharedOption given to a call
// overrides the same option given to New ("a call's own options apply
// after New's, so a call overrides the default").
func TestAttack6SharedOptionsAtNewAndCall(t *testing.T) {
	s := redlocktest.StartServer(t)
	ctx := context.Background()
	nodes := []redis.UniversalClient{ctxTimeoutClient(t, s, 0)}
	t.Run("fencing", func(t *testing.T) {
		c := newClient(t, nodes, redlock.WithFencing(true))
		l, err := c.TryAcquire(ctx, []string{"f1"}, 10*time.Second, redlock.WithFencing(false))
		must(t, err)
		defer l.Release(ctx)
		if tok := l.FencingToken(); tok != 0 {
			t.Errorf("WithFencing(false) to the call over WithFencing(true) to New: token %d, want 0", tok)
		}
	})
	t.Run("metadata", func(t *testing.T) {
		c := newClient(t, nodes, redlock.WithMetadata("new"))
		l, err := c.TryAcquire(ctx, []string{"m1"}, 10*time.Second, redlock.WithMetadata("call"))
		must(t, err)
		defer l.Release(ctx)
		if md := l.Metadata(); md != "call" {
			t.Errorf("Metadata %q, want the call's", md)
		}
	})
	t.Run("owner", func(t *testing.T) {
		c := newClient(t, nodes, redlock.WithOwner("a"))
		l, err := c.TryAcquire(ctx, []string{"o1"}, 10*time.Second)
		must(t, err)
		defer l.Release(ctx)
		if _, err := c.TryAcquire(ctx, []string{"o1"}, 10*time.Second, redlock.WithOwner("b")); !errors.Is(err, redlock.ErrNotAcquired) {
			t.Errorf("owner b over New's owner a acquired a's lock: %v", err)
		}
		l2, err := c.TryAcquire(ctx, []string{"o1"}, 10*time.Second)
		must(t, err) // the same owner a re-enters
		must(t, l2.Release(ctx))
	})
	t.Run("nodeTimeout", func(t *testing.T) {
		c := newClient(t, nodes, redlock.WithNodeTimeout(time.Microsecond))
		l, err := c.TryAcquire(ctx, []string{"n1"}, 10*time.Second, redlock.WithNodeTimeout(time.Second))
		must(t, err)
		must(t, l.Extend(ctx, 10*time.Second)) // the Lock's rounds keep the call's timeout
		must(t, l.Release(ctx))
	})
}

// TestAttack6CallMetadataOverNewMetadataFunc: WithMetadata given to a
// call beats WithMetadataFunc given to New, as SharedOption promises ("a
// call overrides the default"); New's func used to win.
func TestAttack6CallMetadataOverNewMetadataFunc(t *testing.T) {
	s := redlocktest.StartServer(t)
	ctx := context.Background()
	nodes := []redis.UniversalClient{ctxTimeoutClient(t, s, 0)}
	c := newClient(t, nodes, redlock.WithMetadataFunc(func() string { return "new-func" }))
	l, err := c.TryAcquire(ctx, []string{"m2"}, 10*time.Second, redlock.WithMetadata("call"))
	must(t, err)
	defer l.Release(ctx)
	if md := l.Metadata(); md != "call" {
		t.Errorf("WithMetadata to the call over WithMetadataFunc to New: Metadata %q, want the call's %q", md, "call")
	}
}

// TestAttack6CloseDuringFrozenInlineCall: Close while a round's call to a
// frozen node is in flight (inline with ContextTimeoutEnabled, on the
// sender without) returns within about the call's limit (node timeout,
// or the read timeout), and so does the round.
func TestAttack6CloseDuringFrozenInlineCall(t *testing.T) {
	for _, ctxTimeout := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			s := redlocktest.StartServer(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: ctxTimeout, ReadTimeout: 500 * time.Millisecond})
			t.Cleanup(func() { _ = rdb.Close() })
			c, err := redlock.New([]redis.UniversalClient{rdb}, redlock.WithNodeTimeout(300*time.Millisecond))
			must(t, err)
			ctx := context.Background()
			l, err := c.TryAcquire(ctx, []string{"warm"}, 10*time.Second)
			must(t, err)
			time.Sleep(300 * time.Millisecond) // the sender ends
			s.Stop(t)
			defer s.Cont(t)
			done := make(chan error, 2)
			go func() {
				_, err := c.TryAcquire(ctx, []string{"x"}, 10*time.Second)
				done <- err
			}()
			go func() { done <- l.Release(ctx) }()
			time.Sleep(50 * time.Millisecond) // the calls are in flight
			cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
			defer cancel()
			start := time.Now()
			_ = c.Close(cctx)
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("Close took %v", took)
			}
			for range 2 {
				select {
				case err := <-done:
					if err == nil {
						t.Errorf("a call to the frozen node succeeded")
					}
				case <-time.After(5 * time.Second):
					t.Fatal("a call did not return after Close")
				}
			}
		})
	}
}

// TestAttack6OneNodeKilledAndRestarted: a Client of one node (inline
// calls) fails fast while the node is down and works again once it is
// back, even though its script cache is empty (NOSCRIPT, resent as EVAL).
func TestAttack6OneNodeKilledAndRestarted(t *testing.T) {
	s := redlocktest.StartServer(t)
	c := newClient(t, []redis.UniversalClient{ctxTimeoutClient(t, s, 0)}, redlock.WithNodeTimeout(500*time.Millisecond), redlock.WithFencing(true))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	must(t, err)
	must(t, l.Release(ctx))
	s.Kill(t)
	if _, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("TryAcquire on a killed node: %v", err)
	}
	s.Restart(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err = c.TryAcquire(ctx, []string{"r"}, 10*time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryAcquire after the restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	must(t, l.Extend(ctx, 10*time.Second))
	must(t, l.Release(ctx))
	if keys := s.Keys(t); len(keys) != 1 { // the fencing counter
		t.Errorf("keys after Release: %q, want only the fencing counter", keys)
	}
}

// TestAttack6InlineDoWithKeep: many goroutines run Do on one key of a
// Client of one node, its Keep extending every few milliseconds (inline
// and queued extends racing the Releases): one holder at a time, every
// Do that got the lock ends with fn's result, and no key is left.
func TestAttack6InlineDoWithKeep(t *testing.T) {
	s := redlocktest.StartServer(t)
	c := newClient(t, []redis.UniversalClient{ctxTimeoutClient(t, s, 0)}, redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	var holders, ran atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 15 {
				actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				err := c.Do(actx, []string{"k"}, 2*time.Second, func(context.Context) error {
					if n := holders.Add(1); n != 1 {
						t.Errorf("%d holders of k at once", n)
					}
					ran.Add(1)
					time.Sleep(5 * time.Millisecond)
					holders.Add(-1)
					return nil
				}, redlock.ExtendEvery(time.Millisecond), redlock.WithRetry(constantRetry(time.Millisecond)))
				cancel()
				if err != nil && !errors.Is(err, redlock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Do: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if ran.Load() == 0 {
		t.Fatal("fn never ran")
	}
	must(t, c.Wait(ctx))
	if keys := s.Keys(t); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
}
