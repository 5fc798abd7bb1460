package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/tracing"
)

// constantRetry is a retry policy that waits d between rounds.
func constantRetry(d time.Duration) func() backoff.BackOff {
	return func() backoff.BackOff { return backoff.NewConstantBackOff(d) }
}

// slowRetry retries every 20 s: a waiter that gets the lock sooner was
// woken by the release, not by its retry delay.
var slowRetry = constantRetry(20 * time.Second)

// acquireAndRelease acquires resource on c in the background (30 s TTL),
// releases it at once, and sends the first error or nil.
func acquireAndRelease(ctx context.Context, c *redlock.Client, resource string) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, []string{resource}, 30*time.Second)
		if err == nil {
			err = l.Release(context.Background())
		}
		got <- err
	}()
	return got
}

// subscribers returns, per node, the number of subscribers of channel.
func subscribers(t *testing.T, nodes []redis.UniversalClient, channel string) []int64 {
	t.Helper()
	out := make([]int64, len(nodes))
	for i, rdb := range nodes {
		m, err := rdb.PubSubNumSub(context.Background(), channel).Result()
		if err != nil {
			t.Fatalf("PUBSUB NUMSUB on node %d: %v", i, err)
		}
		out[i] = m[channel]
	}
	return out
}

// waitFor polls cond every 10 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func allAtLeast(v []int64, n int64) bool {
	for _, x := range v {
		if x < n {
			return false
		}
	}
	return true
}

// startHeld starts 3 nodes and a Client that retries every 20 s
// (slowRetry), and takes "r" for 30 s. nodes is a second client set for
// inspecting the nodes (subscribers).
func startHeld(t *testing.T) (redlocktest.Cluster, []redis.UniversalClient, *redlock.Client, *redlock.Lock) {
	t.Helper()
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	held, err := c.TryAcquire(context.Background(), []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// TryAcquire returns on a quorum; the third SET may still be queued.
	// A waiter in another Client could reach that node first and take it,
	// and then the holder's release would not publish a notice there.
	waitSettled(t, c)
	return cl, cl.Clients(t), c, held
}

// TestReleaseWakesWaiter: an Acquire waiting for a held lock, whose retry
// delay is 20 s, takes the lock as soon as the holder releases it, and its
// subscriptions end with it.
func TestReleaseWakesWaiter(t *testing.T) {
	verifyNoLeaks(t)
	_, nodes, c, held := startHeld(t)
	ctx := context.Background()
	type result struct {
		l   *redlock.Lock
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	go func() {
		l, err := c.Acquire(wctx, []string{"r"}, 30*time.Second)
		got <- result{l, err, time.Now()}
	}()
	// The waiter lost its first round and subscribed on every node.
	waitFor(t, "the waiter's subscriptions", func() bool {
		return allAtLeast(subscribers(t, nodes, "r:released"), 1)
	})
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	defer r.l.Release(ctx)
	// The retry delay is 20 s; 10 s leaves room for any loaded machine.
	if took := r.at.Sub(released); took > 10*time.Second {
		t.Errorf("waiter took the lock %v after the release: not woken", took)
	}
	waitFor(t, "the subscriptions to end", func() bool {
		n := subscribers(t, nodes, "r:released")
		return n[0]+n[1]+n[2] == 0
	})
}

// TestReleaseNoticesOff: with WithReleaseNotices(false) a waiter never
// subscribes and still gets the lock by polling.
func TestReleaseNoticesOff(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, cl.Clients(t), redlock.WithReleaseNotices(false),
		redlock.WithRetry(constantRetry(20*time.Millisecond)))
	ctx := context.Background()
	held, err := c.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAndRelease(ctx, c, "r")
	time.Sleep(200 * time.Millisecond) // several lost rounds
	if n := subscribers(t, nodes, "r:released"); n[0]+n[1]+n[2] != 0 {
		t.Errorf("subscribers with notices off: %v", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}

// TestWakeSurvivesStoppedNode: with one node stopped (SIGSTOP) a waiter is
// still woken by the release notices of the others; the stopped node's
// subscriber ends once the node runs again.
func TestWakeSurvivesStoppedNode(t *testing.T) { wakeWithStoppedNode(t, false) }

// TestWakeAcrossClientsWithStoppedNode: a waiter in another Client (another
// process: only the release notices can wake it) is woken with one node
// stopped. Its refusals marked the holder's key on the two running nodes
// only, and their two notices are a quorum.
func TestWakeAcrossClientsWithStoppedNode(t *testing.T) { wakeWithStoppedNode(t, true) }

// wakeWithStoppedNode stops one of 3 nodes, lets a waiter (in the holder's
// Client, or in another one when otherClient) subscribe on the two others,
// releases, and checks that the waiter got the lock within 15 s. Its retry
// delay is 20 s and, with a node unconfirmed, is not shortened, so it was
// woken by the release.
func wakeWithStoppedNode(t *testing.T, otherClient bool) {
	verifyNoLeaks(t)
	cl, nodes, waiter, held := startHeld(t)
	if otherClient {
		waiter = newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	}
	ctx := context.Background()
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got := acquireAndRelease(wctx, waiter, "r")
	waitFor(t, "the waiter's subscriptions on the running nodes", func() bool {
		return allAtLeast(subscribers(t, nodes[:2], "r:released"), 1)
	})
	if err := held.Release(ctx); err != nil && !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter (other Client: %v) with a stopped node: %v (not woken within 15 s; the retry delay is 20 s)", otherClient, err)
	}
	cl[2].Cont(t)
}

// TestReleaseWithoutChannelPermission: an ACL user without channel access
// (Redis 7's default for new users) acquires and releases as usual, the
// denied PUBLISH notwithstanding, and its waiters still get the lock by
// polling.
func TestReleaseWithoutChannelPermission(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	var nodes []redis.UniversalClient
	for _, s := range cl {
		if err := s.Client(t).Do(context.Background(), "ACL", "SETUSER", "locker", "on", ">secret",
			"~*", "+@all", "resetchannels").Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "locker", Password: "secret"})
		t.Cleanup(func() { rdb.Close() })
		nodes = append(nodes, rdb)
	}
	c := newClient(t, nodes, redlock.WithRetry(constantRetry(20*time.Millisecond)))
	ctx := context.Background()
	held, err := c.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireAndRelease(ctx, c, "r")
	time.Sleep(100 * time.Millisecond) // lost rounds; SUBSCRIBE refused
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release with PUBLISH denied: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	waitSettled(t, c)
	for i, s := range cl {
		if n := len(s.Keys(t)); n != 0 {
			t.Errorf("node %d: %d keys left", i, n)
		}
	}
}

// TestWaiterDoesNotPollAHeldLock: a waiter whose retry delay is 5 ms, once
// subscribed, sleeps until the holder's key expires (the holder never
// releases: a crashed process) instead of polling every 5 ms, and takes
// the lock when it expires.
func TestWaiterDoesNotPollAHeldLock(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := newClient(t, cl.Clients(t), redlock.WithRetry(constantRetry(5*time.Millisecond)), redlock.WithTracerProvider(tp))
	crashed := newClient(t, cl.Clients(t))
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	if _, err := crashed.TryAcquire(ctx, []string{"r"}, ttl); err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatalf("waiter: %v", err)
	}
	defer l.Release(ctx)
	var attempts int64 = -1
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanAcquire {
			for _, a := range s.Attributes() {
				if a.Key == tracing.Attempts {
					attempts = a.Value.AsInt64()
				}
			}
		}
	}
	// Polling every 5 ms for 1.5 s would be about 300 rounds; waiting for
	// the expiry takes a few (the rounds before the subscription is
	// confirmed, and the one after the expiry).
	if attempts < 2 || attempts > 30 {
		t.Errorf("waiter made %d rounds over a %v hold, want a few (not polling every 5ms)", attempts, ttl)
	}
}

// publishes returns the number of PUBLISH calls each node ran since its
// last CONFIG RESETSTAT (INFO commandstats counts those of scripts too).
func publishes(t *testing.T, nodes []redis.UniversalClient) []int64 {
	t.Helper()
	out := make([]int64, len(nodes))
	for i, rdb := range nodes {
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatalf("INFO commandstats on node %d: %v", i, err)
		}
		out[i] = int64(cmdCalls(info, "publish"))
	}
	return out
}

// TestReleaseNoticeOnlyWhenAwaited: a release that no Acquire waits for
// publishes nothing; an Acquire of another Client (another process) that
// was refused marks the holder's key on every node, and the holder's
// release then publishes its notice there.
func TestReleaseNoticeOnlyWhenAwaited(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	waiter := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	// Load the scripts first, so that nothing below is re-sent after
	// NOSCRIPT (internal/node).
	if l, err := holder.TryAcquire(ctx, []string{"warm-up"}, time.Second); err != nil {
		t.Fatal(err)
	} else if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	resetStats(t, nodes)

	for _, acquire := range []func() (*redlock.Lock, error){
		func() (*redlock.Lock, error) { return holder.TryAcquire(ctx, []string{"alone"}, 30*time.Second) },
		func() (*redlock.Lock, error) { return holder.Acquire(ctx, []string{"alone"}, 30*time.Second) },
	} {
		l, err := acquire()
		must(t, err)
		must(t, l.Release(ctx))
	}
	waitSettled(t, holder)
	if p := publishes(t, nodes); p[0]+p[1]+p[2] != 0 {
		t.Errorf("PUBLISH calls per node after releases nobody waited for: %v, want none", p)
	}

	held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	must(t, err)
	waitSettled(t, holder) // the key on every node before the waiter's first round
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got := acquireAndRelease(wctx, waiter, "r")
	waitMarked(t, nodes, "r")
	if md, ok, err := holder.HolderMetadata(ctx, "r"); err != nil || !ok || md != "" {
		t.Errorf("Holder() of a marked lock = %q, %v, %v; want \"\", true, nil", md, ok, err)
	}
	must(t, held.Release(ctx))
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	waitSettled(t, holder)
	if p := publishes(t, nodes); p[0] < 1 || p[1] < 1 || p[2] < 1 {
		t.Errorf("PUBLISH calls per node after a release a waiter marked: %v, want at least 1 on each", p)
	}
}

// TestHolderIgnoresWaitMarks: a waiter marks the holder's key only on the
// nodes that refused it, so the values differ between nodes; Holder counts
// them as one lock.
func TestHolderIgnoresWaitMarks(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, 30*time.Second, redlock.WithMetadata("me"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	waitSettled(t, c)
	v, err := nodes[0].Get(ctx, "r").Result()
	if err != nil || len(v) <= 32 || v[32] != '-' {
		t.Fatalf("value on node 0 = %q, %v; want the owner token, '-', the metadata", v, err)
	}
	// Node 0 marked as by a waiter, node 2 lost the key (restart without
	// persistence): one marked and one plain value remain.
	if err := nodes[0].SetRange(ctx, "r", 32, "_").Err(); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].Del(ctx, "r").Err(); err != nil {
		t.Fatal(err)
	}
	if md, ok, err := c.HolderMetadata(ctx, "r"); err != nil || !ok || md != "me" {
		t.Errorf("Holder() = %q, %v, %v; want me, true, nil", md, ok, err)
	}
}

// TestWakeWithGlobCharactersInPrefix: a waiter in another Client (only the
// notices can wake it; its retry delay is 20 s) is woken by the release of
// a key under a prefix with glob characters and a byte that is not UTF-8.
func TestWakeWithGlobCharactersInPrefix(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	const p = "a*?[b]\\c\xff:"
	holder := newClient(t, cl.Clients(t), redlock.WithKeyPrefix(p))
	waiter := newClient(t, cl.Clients(t), redlock.WithKeyPrefix(p), redlock.WithRetry(slowRetry))
	ctx := context.Background()
	held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got := acquireAndRelease(wctx, waiter, "r")
	nodes := cl.Clients(t)
	waitFor(t, "the waiter's subscriptions", func() bool { return allAtLeast(subscribers(t, nodes, p+"r:released"), 1) })
	time.Sleep(100 * time.Millisecond) // the confirmations reach the waiter
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter under a prefix with glob characters: %v (not woken within 15 s; the retry delay is 20 s)", err)
	}
}
