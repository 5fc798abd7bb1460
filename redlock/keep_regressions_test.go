package redlock_test

// Keep and Extend of one Lock used together: the kept context ends no later
// than Until - TTL/10 of the lock as it is, and Until is never later than
// what the nodes may hold (found by an adversarial helper, issue 17 item 3).

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// cancelledAt returns a function that waits for ctx to end and returns when
// it did.
func cancelledAt(t *testing.T, ctx context.Context) func() time.Time {
	t.Helper()
	at := make(chan time.Time, 1)
	go func() { <-ctx.Done(); at <- time.Now() }()
	return func() time.Time {
		select {
		case ts := <-at:
			return ts
		case <-time.After(30 * time.Second):
			t.Fatal("the kept context never ended")
			return time.Time{}
		}
	}
}

// TestShorteningExtendInFlightKeepsExclusion: an Extend to a shorter TTL
// whose answers are slow has already run its script on the nodes. Their
// keys then expired with the short TTL while Until kept the old deadline
// until the Extend returned, so another Client took the lock while Until
// was seconds ahead and the kept context was live. The nodes now never
// lower a TTL.
func TestShorteningExtendInFlightKeepsExclusion(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	a, b := newClient(t, nodes), newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := a.Acquire(ctx, []string{"r"}, 5*time.Second, redlock.WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := l.Keep(ctx)
	defer stop()
	for _, p := range proxies {
		p.SetLatencyIn(redlocktest.NodeToClient, 2*time.Second)
	}
	defer func() {
		for _, p := range proxies {
			p.Heal()
		}
	}()
	extended := make(chan error, 1)
	go func() { extended <- l.Extend(ctx, 400*time.Millisecond) }()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		l2, err := b.TryAcquire(ctx, []string{"r"}, time.Second)
		if err != nil {
			continue
		}
		if left := time.Until(l.Until()); left > 0 || kctx.Err() == nil {
			t.Errorf("another Client acquired r while Until was %v ahead (kept context live: %v)",
				left.Round(time.Millisecond), kctx.Err() == nil)
		}
		_ = l2.Release(ctx)
		break
	}
	t.Logf("Extend = %v", <-extended)
}

// TestKeepInFlightAfterAFailedExtend: Keep's extension waits behind an
// Extend of the caller's that fails, with every node blackholed; the kept
// context ends by Until - TTL/10 of the lock as it then is, and stop
// reports the loss. (When Extend still moved Until earlier on failure, the
// in-flight extension kept the deadline it had read, and the context
// outlived Until.)
func TestKeepInFlightAfterAFailedExtend(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	a := newClient(t, nodes)
	ctx := context.Background()
	l, err := a.Acquire(ctx, []string{"r"}, 6*time.Second, redlock.WithNodeTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	kctx, stop := l.Keep(ctx) // extends 2s after the acquisition
	done := cancelledAt(t, kctx)
	for _, p := range proxies {
		p.Blackhole(true)
	}
	defer func() {
		for _, p := range proxies {
			p.Heal()
		}
	}()
	time.Sleep(time.Second - time.Since(t0))
	// Holds the Lock's op mutex for the 2s node timeout: Keep's extension
	// queues behind it.
	if err := l.Extend(ctx, 3*time.Second); err == nil {
		t.Fatal("Extend with every node blackholed succeeded")
	}
	until, ttl := l.Until(), l.TTL()
	at := done()
	if limit := until.Add(-ttl / 10); at.After(limit.Add(ttl / 20)) {
		t.Errorf("kept context ended %v after Until - TTL/10 (Until %v, TTL %v)", at.Sub(limit).Round(time.Millisecond),
			until.Sub(t0).Round(time.Millisecond), ttl)
	}
	if err := stop(); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("stop = %v, want ErrLockLost", err)
	}
}

// TestKeepAfterACancelledShorteningExtend: an Extend to a short TTL that
// its ctx cancelled leaves Until and TTL as they were; Keep goes on and
// reports no loss. (When Until moved but TTL did not, Keep's margin,
// TTL/10 of the old TTL, was past at once and it reported a loss with no
// extension tried, while the lock was still held.)
func TestKeepAfterACancelledShorteningExtend(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c, b := newClient(t, cl.Clients(t)), newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.Acquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := l.Keep(ctx)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Extend(cctx, 800*time.Millisecond); !errors.Is(err, context.Canceled) {
		t.Fatalf("Extend on a cancelled ctx = %v, want context.Canceled", err)
	}
	if got := l.TTL(); got != 10*time.Second {
		t.Errorf("TTL() = %v after a cancelled Extend to 800ms, want the 10s it had", got)
	}
	select {
	case <-kctx.Done():
		t.Errorf("kept context ended: %v", context.Cause(kctx))
	case <-time.After(2 * time.Second): // Keep extended twice or more meanwhile
	}
	if err := stop(); err != nil {
		t.Errorf("stop = %v, want nil", err)
	}
	if _, err := b.TryAcquire(ctx, []string{"r"}, time.Second); err == nil {
		t.Error("another Client acquired r: Keep did not keep it")
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release = %v", err)
	}
}

// TestTimedOutShortExtendLandingLateKeepsExclusion: an Extend to 2s times
// out (every link delays commands by 1s); a later Extend to 10s succeeds on
// new connections (go-redis drops a connection whose command timed out
// when ContextTimeoutEnabled is set); then the 2s scripts reach the nodes.
// They set the keys' TTL to 2s while Until trusted the 10s: another Client
// took the lock with Until 6.5s ahead (found by an adversarial helper).
// The nodes never lower a TTL now.
func TestTimedOutShortExtendLandingLateKeepsExclusion(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	var nodes []redis.UniversalClient
	var proxies []*redlocktest.Proxy
	for _, s := range cl {
		p := redlocktest.NewProxy(t, s.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		nodes, proxies = append(nodes, rdb), append(proxies, p)
	}
	a, b := newClient(t, nodes, redlock.WithNodeTimeout(300*time.Millisecond)), newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := a.Acquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	for _, p := range proxies {
		p.SetLatencyIn(redlocktest.ClientToNode, time.Second)
	}
	if err := l.Extend(ctx, 2*time.Second); err == nil {
		t.Fatal("Extend through 1s-delayed links succeeded within a 300ms node timeout")
	}
	for _, p := range proxies {
		p.Heal()
	}
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatalf("Extend on healed links: %v", err)
	}
	time.Sleep(3500 * time.Millisecond) // the 2s scripts have landed, and 2s more passed
	if l2, err := b.TryAcquire(ctx, []string{"r"}, time.Second); err == nil {
		if left := time.Until(l.Until()); left > 0 {
			t.Errorf("another Client acquired r while Until was %v ahead", left.Round(time.Millisecond))
		}
		_ = l2.Release(ctx)
	}
}
