package redlock_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// markedEverywhere reports whether key holds a value with a waiter's mark
// (byte 33 '_' or 't') on every node.
func markedEverywhere(nodes []redis.UniversalClient, key string) bool {
	for _, rdb := range nodes {
		v, err := rdb.Get(context.Background(), key).Result()
		if err != nil || len(v) <= 32 || (v[32] != '_' && v[32] != 't') {
			return false
		}
	}
	return true
}

// waitMarkedOnAQuorum waits until key's value carries a wait mark on a
// quorum of nodes: a waiter woken by a release that had reached a quorum
// but not yet the last node marks the next holder's key on the others
// only, and then sleeps until a notice comes.
func waitMarkedOnAQuorum(t *testing.T, nodes []redis.UniversalClient, key string) {
	t.Helper()
	waitFor(t, "the wait mark on "+key+" on a quorum", func() bool {
		n := 0
		for _, rdb := range nodes {
			if markedEverywhere([]redis.UniversalClient{rdb}, key) {
				n++
			}
		}
		return n >= len(nodes)/2+1
	})
}

// listening returns, per node, the number of subscribed patterns and
// channels.
func listening(t *testing.T, nodes []redis.UniversalClient) []int64 {
	t.Helper()
	out := make([]int64, len(nodes))
	for i, rdb := range nodes {
		n, err := rdb.PubSubNumPat(context.Background()).Result()
		if err != nil {
			t.Fatalf("PUBSUB NUMPAT on node %d: %v", i, err)
		}
		chs, err := rdb.PubSubChannels(context.Background(), "*").Result()
		if err != nil {
			t.Fatalf("PUBSUB CHANNELS on node %d: %v", i, err)
		}
		out[i] = n + int64(len(chs))
	}
	return out
}

// markedOn returns the number of nodes where key is marked.
func markedOn(nodes []redis.UniversalClient, key string) int {
	n := 0
	for _, rdb := range nodes {
		if markedEverywhere([]redis.UniversalClient{rdb}, key) {
			n++
		}
	}
	return n
}

// waitMarked waits until key is marked on every node.
func waitMarked(t *testing.T, nodes []redis.UniversalClient, key string) {
	t.Helper()
	waitFor(t, "the wait mark on "+key, func() bool { return markedEverywhere(nodes, key) })
}

type acquired struct {
	l   *redlock.Lock
	err error
	at  time.Time
}

func acquireBG(ctx context.Context, c *redlock.Client, resources []string, ttl time.Duration, opts ...redlock.LockOption) <-chan acquired {
	out := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, resources, ttl, opts...)
		out <- acquired{l, err, time.Now()}
	}()
	return out
}

// TestWakeReentrantOwnerReleasesTwice: a reentrant owner's lock value
// repeats between its acquisitions, so the notices of its second release
// must not be counted with its first's. Waiter W (retry delay 20 s) wants
// [k, l]; B (owner "o") holds k, C holds l. B releases k (W is woken, l
// refuses), B takes k again, C releases l (W is woken, k refuses), B
// releases k again: W is woken and gets the lock.
func TestWakeReentrantOwnerReleasesTwice(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	b := newClient(t, cl.Clients(t))
	c := newClient(t, cl.Clients(t))
	w := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	owner := redlock.WithOwner("o")

	bk1, err := b.TryAcquire(ctx, []string{"k"}, 30*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	cl1, err := c.TryAcquire(ctx, []string{"l"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, b)
	waitSettled(t, c)

	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got := acquireBG(wctx, w, []string{"k", "l"}, 30*time.Second)
	waitMarked(t, nodes, "k")
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
	time.Sleep(200 * time.Millisecond) // confirmations reach the waiter

	if err := bk1.Release(ctx); err != nil { // wakes W: refused by l
		t.Fatal(err)
	}
	waitMarkedOnAQuorum(t, nodes, "l")
	bk2, err := b.TryAcquire(ctx, []string{"k"}, 30*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, b)
	time.Sleep(100 * time.Millisecond)
	if err := cl1.Release(ctx); err != nil { // wakes W: refused by k (bk2)
		t.Fatal(err)
	}
	waitMarkedOnAQuorum(t, nodes, "k")
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	if err := bk2.Release(ctx); err != nil { // the same notice payload as bk1's
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter not woken by the owner's second release (retry delay 20 s): %v", r.err)
	}
	if took := r.at.Sub(released); took > 5*time.Second {
		t.Errorf("waiter took the lock %v after the second release: not woken", took)
	}
	_ = r.l.Release(ctx)
}

// TestWakeReentrantReleaseInOneClient: the same within one Client. Owner
// "o" holds k twice; releasing the first hold deletes nothing (the waiter's
// round is refused), releasing the last deletes k and wakes the waiter
// (retry delay 20 s).
func TestWakeReentrantReleaseInOneClient(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	c := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	owner := redlock.WithOwner("o")
	h1, err := c.TryAcquire(ctx, []string{"k"}, 30*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := c.TryAcquire(ctx, []string{"k"}, 30*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := acquireBG(wctx, c, []string{"k"}, 30*time.Second)
	waitMarked(t, nodes, "k")
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
	time.Sleep(200 * time.Millisecond)
	if err := h1.Release(ctx); err != nil { // one hold of two: k stays
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)      // the waiter's (spurious) round
	if err := h2.Release(ctx); err != nil { // the last hold: k is deleted
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter not woken by the release of the owner's last hold (retry delay 20 s): %v", r.err)
	}
	_ = r.l.Release(ctx)
}

// TestWakeMultiKeyWaiterSwallowsWake: one release of a lock on [k, l]
// reaches a quorum on k and on l. W1 (waiting for [k, l, m], asleep
// first) is woken by k; l's wake passes W1 over and wakes W2, which waits
// for l alone, although W1's round fails on m.
func TestWakeMultiKeyWaiterSwallowsWake(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	h := newClient(t, cl.Clients(t))
	c := newClient(t, cl.Clients(t))
	w := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))

	hkl, err := h.TryAcquire(ctx, []string{"k", "l"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, []string{"m"}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, h)
	waitSettled(t, c)

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got1 := acquireBG(wctx, w, []string{"k", "l", "m"}, 30*time.Second)
	waitMarked(t, nodes, "k")
	time.Sleep(200 * time.Millisecond) // W1 sleeps
	got2 := acquireBG(wctx, w, []string{"l"}, 30*time.Second)
	waitMarked(t, nodes, "l")
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
	time.Sleep(200 * time.Millisecond) // W2 sleeps
	released := time.Now()
	if err := hkl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got2
	if r.err != nil {
		t.Fatalf("W2 (waiting for l alone) not woken by the release of [k, l] within 10 s (retry delay 20 s): %v", r.err)
	}
	t.Logf("W2 took l %v after the release", r.at.Sub(released))
	_ = r.l.Release(ctx)
	cancel()
	<-got1
}

// splitSub sends commands through one client and release-notice
// subscriptions through another.
type splitSub struct {
	redis.UniversalClient
	sub redis.UniversalClient
}

// Subscribe subscribes through sub.
func (s splitSub) Subscribe(ctx context.Context, channels ...string) *redis.PubSub {
	return s.sub.Subscribe(ctx, channels...)
}

// TestWakeReleaseBeforeWatchStretchesWait: a release that lands between
// a waiter's refusal on the nodes and the reply reaching it does not make
// the waiter stretch its 10 ms retry delay to 1 s for notices that have
// come and gone. The replies of the waiter's commands are delayed by 150 ms
// (its subscriptions are not) to widen that window.
func TestWakeReleaseBeforeWatchStretchesWait(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	proxied, proxies := cl.ProxiedClients(t)
	direct := cl.Clients(t)
	wnodes := make([]redis.UniversalClient, len(cl))
	for i := range cl {
		wnodes[i] = splitSub{proxied[i], direct[i]}
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := newClient(t, cl.Clients(t))
	w := newClient(t, wnodes, redlock.WithRetry(constantRetry(10*time.Millisecond)), redlock.WithNodeTimeout(2*time.Second), redlock.WithTracerProvider(tp))

	// Warm-up: the waiter's Client subscribes, for good.
	warm, err := h.TryAcquire(ctx, []string{"warm"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, h)
	dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
	defer dcancel()
	got := acquireBG(dctx, w, []string{"warm"}, 30*time.Second)
	waitMarked(t, nodes, "warm")
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
	time.Sleep(200 * time.Millisecond)
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil {
		t.Fatal(r.err)
	} else if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, p := range proxies {
		p.SetLatencyIn(redlocktest.NodeToClient, 150*time.Millisecond)
	}
	held, err := h.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, h)
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	got = acquireBG(rctx, w, []string{"r"}, 30*time.Second)
	for markedOn(nodes, "r") < 2 { // a quorum refused the waiter
		time.Sleep(time.Millisecond)
	}
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.l.Release(ctx)
	// Reply latency 150 ms: the refusal comes back 150 ms after the marks,
	// the next round takes 150 ms; the retry delay is 10 ms.
	took := r.at.Sub(released)
	t.Logf("waiter took the lock %v after the release", took)
	for _, sp := range rec.Ended() {
		if sp.StartTime().After(released.Add(-time.Second)) && strings.HasPrefix(sp.Name(), "redlock.wait") {
			t.Logf("%s from %v to %v after the release, %v", sp.Name(), sp.StartTime().Sub(released), sp.EndTime().Sub(released), sp.Attributes())
		}
	}
	if took > 900*time.Millisecond {
		t.Errorf("waiter took the lock %v after a release that came before it watched the key: its 10 ms retry delay was stretched to wait for notices already dropped", took)
	}
}

// aclNodes creates on every node the user "locker" with every command and
// key and only the channel rules given, and returns clients logged in as
// that user.
func aclNodes(t *testing.T, cl redlocktest.Cluster, channelRules ...string) []redis.UniversalClient {
	t.Helper()
	var nodes []redis.UniversalClient
	for _, s := range cl {
		args := []any{"ACL", "SETUSER", "locker", "reset", "on", ">secret", "~*", "+@all", "resetchannels"}
		for _, r := range channelRules {
			args = append(args, r)
		}
		if err := s.Client(t).Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: "locker", Password: "secret"})
		t.Cleanup(func() { rdb.Close() })
		nodes = append(nodes, rdb)
	}
	return nodes
}

// aclWake: a holder and a waiter (another Client, retry delay 20 s), both
// logged in as a user whose channel rules are rules, under prefix; the
// waiter must be woken by the release.
func aclWake(t *testing.T, prefix string, rules ...string) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, aclNodes(t, cl, rules...), redlock.WithKeyPrefix(prefix))
	waiter := newClient(t, aclNodes(t, cl, rules...), redlock.WithKeyPrefix(prefix), redlock.WithRetry(slowRetry))
	held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := acquireBG(wctx, waiter, []string{"r"}, 30*time.Second)
	waitMarked(t, nodes, prefix+"r")
	time.Sleep(500 * time.Millisecond) // the subscriptions, if the ACL allows them
	t.Logf("subscriptions per node: %v", listening(t, nodes))
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter whose ACL allows the channels %q (prefix %q) not woken within 10 s (retry delay 20 s): %v", rules, prefix, r.err)
	}
	_ = r.l.Release(ctx)
}

// TestWakeACLBroaderChannelRule: a user whose channel rule is &app:*
// (covering "app:<resource>:released") is woken.
func TestWakeACLBroaderChannelRule(t *testing.T) { aclWake(t, "app:", "&app:*") }

// TestWakeACLDocumentedRuleWithGlobPrefix: the documented rule
// &<prefix>*:released with a prefix that has a glob character.
func TestWakeACLDocumentedRuleWithGlobPrefix(t *testing.T) { aclWake(t, "a*:", "&a*:*:released") }

// TestWakeACLDocumentedRule: the documented rule &<prefix>*:released.
func TestWakeACLDocumentedRule(t *testing.T) { aclWake(t, "app:", "&app:*:released") }

// TestWakeRingNode: a *redis.Ring may stand for one node when the
// resources of a lock hash to one shard (hash tags); a waiter (retry delay
// 20 s) of a hash-tagged resource on any shard is woken by its release.
func TestWakeRingNode(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 2)
	ring := func() redis.UniversalClient {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"s0": cl[0].Addr(), "s1": cl[1].Addr()}})
		t.Cleanup(func() { r.Close() })
		return r
	}
	shards := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, []redis.UniversalClient{ring()})
	waiter := newClient(t, []redis.UniversalClient{ring()}, redlock.WithRetry(slowRetry))

	// Start the waiter's subscription: a first wait.
	warm, err := holder.TryAcquire(ctx, []string{"{warm}"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	warmCtx, warmCancel := context.WithCancel(ctx)
	got := acquireBG(warmCtx, waiter, []string{"{warm}"}, 30*time.Second)
	var sub int
	waitFor(t, "the waiter's subscription", func() bool {
		n := listening(t, shards)
		sub = 0
		if n[1] > 0 {
			sub = 1
		}
		return n[0]+n[1] > 0
	})
	warmCancel()
	<-got
	_ = warm.Release(ctx)
	t.Logf("the subscription is on shard %d", sub)

	// A hash-tagged resource on the other shard.
	var res string
	for i := range 100 {
		res = "{job" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "}"
		l, err := holder.TryAcquire(ctx, []string{res}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		on := shards[1-sub].Exists(ctx, res).Val() == 1
		_ = l.Release(ctx)
		if on {
			break
		}
	}
	held, err := holder.TryAcquire(ctx, []string{res}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got = acquireBG(wctx, waiter, []string{res}, 30*time.Second)
	waitMarked(t, shards[1-sub:2-sub], res)
	time.Sleep(200 * time.Millisecond)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter for %s on ring shard %d (subscription on shard %d) not woken within 10 s (retry delay 20 s): %v", res, 1-sub, sub, r.err)
	}
	_ = r.l.Release(ctx)
}

// TestWakeCloseWhileIdleSubscriberReconnects: a Client whose Acquire
// waited once, and that waits for nothing now, closes within its 200 ms
// ctx although node 2 restarted behind a network that accepts connections
// and drops their traffic.
func TestWakeCloseWhileIdleSubscriberReconnects(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	subs, proxies := cl.ProxiedClients(t)
	direct := cl.Clients(t)
	nodes := make([]redis.UniversalClient, len(cl))
	for i := range cl {
		nodes[i] = splitSub{direct[i], subs[i]}
	}
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	c, err := redlock.New(nodes, redlock.WithRetry(constantRetry(50*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	got := acquireBG(ctx, c, []string{"r"}, 30*time.Second)
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, cl.Clients(t)), 1) })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	// No Acquire waits now.
	proxies[2].Blackhole(true)
	cl[2].Restart(t)
	time.Sleep(100 * time.Millisecond) // a subscriber, if one ran, would reconnect now
	cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer ccancel()
	start := time.Now()
	err = c.Close(cctx)
	took := time.Since(start)
	t.Logf("Close(200ms ctx) = %v after %v", err, took)
	if took > time.Second {
		t.Errorf("Close of a Client with no waiting Acquire took %v (200 ms ctx): it waited for an idle subscriber's reconnection", took)
	}
}

// TestWakeCloseRacesFirstWait: Close concurrently with Acquire calls
// that wait for the first time; no goroutine outlives Close, no data race,
// and the Acquire calls end (they may sleep out their retry delay: Close
// does not wake them).
func TestWakeCloseRacesFirstWait(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	if _, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	for i := range 30 {
		c, err := redlock.New(cl.Clients(t), redlock.WithRetry(constantRetry(50*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 4)
		for range 4 {
			go func() {
				_, err := c.Acquire(ctx, []string{"r"}, 30*time.Second)
				done <- err
			}()
		}
		time.Sleep(time.Duration(i%6) * time.Millisecond)
		start := time.Now()
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("round %d: Close took %v", i, took)
		}
		for range 4 {
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("acquired a held lock")
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: an Acquire did not end within 5 s of Close", i)
			}
		}
	}
}

// TestWakeNoticesResumeAfterRestart: after node 2 restarted (killed,
// started again without its data), a release whose notices come from nodes
// 1 and 2 only (node 0 frozen) wakes a waiter of another Client (retry
// delay 20 s).
func TestWakeNoticesResumeAfterRestart(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(200*time.Millisecond))
	waiter := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry), redlock.WithNodeTimeout(200*time.Millisecond))
	wakeOnce := func(res string) {
		t.Helper()
		held, err := holder.TryAcquire(ctx, []string{res}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		waitSettled(t, holder)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got := acquireBG(wctx, waiter, []string{res}, 30*time.Second)
		waitMarked(t, nodes, res)
		waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
		time.Sleep(200 * time.Millisecond)
		cl[0].Stop(t)
		defer cl[0].Cont(t)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("waiter for %s not woken by the notices of nodes 1 and 2: %v", res, r.err)
		}
		cl[0].Cont(t)
		_ = r.l.Release(ctx)
		waitSettled(t, waiter)
	}
	wakeOnce("a")
	cl[2].Restart(t)
	wakeOnce("b")
}

// TestWakeManyWaitersChain: 6 waiters in each of two Clients (retry
// delay 20 s) wait for one key; each takes it, holds it 20 ms and releases
// it. Every release must wake the next waiter: all 12 get the lock within
// 15 s.
func TestWakeManyWaitersChain(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	clients := []*redlock.Client{
		newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry)),
		newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry)),
	}
	held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	done := make(chan error, 12)
	for i := range 12 {
		c := clients[i%2]
		go func() {
			l, err := c.Acquire(wctx, []string{"r"}, 30*time.Second)
			if err == nil {
				time.Sleep(20 * time.Millisecond)
				err = l.Release(context.Background())
			}
			done <- err
		}()
	}
	waitMarked(t, nodes, "r")
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		if err := <-done; err != nil {
			t.Errorf("waiter %d of 12 (after %v): %v", i+1, time.Since(start), err)
		}
	}
	t.Logf("12 waiters done %v after the first release", time.Since(start))
}

// TestWakeEmptyPrefixBesidePrefixedClient: a Client with the empty
// prefix and one with prefix "p:" share the nodes
// and the key "p:x" (resource "p:x" of the one, "x" of the other); each
// one's release wakes the other's waiter (retry delay 20 s).
func TestWakeEmptyPrefixBesidePrefixedClient(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	e := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	p := newClient(t, cl.Clients(t), redlock.WithKeyPrefix("p:"), redlock.WithRetry(slowRetry))
	for _, tc := range []struct {
		name                 string
		holder, waiter       *redlock.Client
		holderRes, waiterRes string
	}{
		{"prefixed holder, empty-prefix waiter", p, e, "x", "p:x"},
		{"empty-prefix holder, prefixed waiter", e, p, "p:x", "x"},
	} {
		held, err := tc.holder.TryAcquire(ctx, []string{tc.holderRes}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		waitSettled(t, tc.holder)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		got := acquireBG(wctx, tc.waiter, []string{tc.waiterRes}, 30*time.Second)
		waitMarked(t, nodes, "p:x")
		waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
		time.Sleep(300 * time.Millisecond)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		cancel()
		if r.err != nil {
			t.Fatalf("%s: waiter not woken: %v", tc.name, r.err)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waitSettled(t, tc.waiter)
	}
}

// TestWakeCanceledWaiterSwallowsWake: W1 and W2 of one Client wait for r
// (retry delay 20 s), W1 first. The holder releases, and W1's ctx is
// cancelled within a millisecond of it: the release wakes W1, which ends
// without the lock and passes the wake on to W2. 40 iterations with
// different timings of the cancel.
func TestWakeCanceledWaiterSwallowsWake(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	w := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	misses := 0
	for i := range 40 {
		held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		waitSettled(t, holder)
		c1, cancel1 := context.WithCancel(ctx)
		got1 := acquireBG(c1, w, []string{"r"}, 30*time.Second)
		waitMarked(t, nodes, "r")
		time.Sleep(50 * time.Millisecond) // W1 sleeps first
		c2, cancel2 := context.WithTimeout(ctx, 2*time.Second)
		got2 := acquireBG(c2, w, []string{"r"}, 30*time.Second)
		waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
		time.Sleep(100 * time.Millisecond) // W2 sleeps
		go func() {
			time.Sleep(time.Duration(i%8) * 100 * time.Microsecond)
			cancel1()
		}()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r1, r2 := <-got1, <-got2
		cancel2()
		if r1.err == nil {
			_ = r1.l.Release(ctx)
		}
		if r2.err == nil {
			_ = r2.l.Release(ctx)
		} else if r1.err != nil {
			misses++
			t.Logf("iteration %d: W1 ended by its ctx, the lock was free, W2 was not woken: %v", i, r2.err)
		}
		waitSettled(t, w)
	}
	if misses > 0 {
		t.Errorf("in %d of 40 releases the wake went to a waiter whose ctx ended and no other waiter was woken", misses)
	}
}

// TestWakeCloseWithStoppedNode: a Client whose subscribers are
// connected closes promptly while a node is frozen (SIGSTOP) and nothing
// is queued for it: closing the PubSub ends the blocked receive.
func TestWakeCloseWithStoppedNode(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	held, err := holder.TryAcquire(ctx, []string{"r"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	c, err := redlock.New(cl.Clients(t), redlock.WithRetry(slowRetry))
	if err != nil {
		t.Fatal(err)
	}
	got := acquireBG(ctx, c, []string{"r"}, 30*time.Second)
	waitFor(t, "subscriptions", func() bool { return allAtLeast(listening(t, nodes), 1) })
	time.Sleep(200 * time.Millisecond)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := c.Close(cctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close with a frozen node took %v", took)
	}
	cl[2].Cont(t)
}

// TestSplitVoteRetriesSoon: after a round split between holders that each
// have a minority (here two foreign keys on two of three nodes), the
// resource is free once they undo, and no release notice will come: the
// waiter retries after a short random delay, not its retry delay (20 s
// here), which left a chain of waiters stalled.
func TestSplitVoteRetriesSoon(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	admins := cl.Clients(t)
	for i, v := range []string{"minority-holder-1", "minority-holder-2"} {
		if err := admins[i].Set(ctx, "r", v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A generous node timeout: a node that misses it (a loaded machine)
	// might hold a holder's key that makes a quorum, so its round is no
	// split vote and waits the 20 s retry delay.
	c := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry), redlock.WithNodeTimeout(time.Second))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(wctx, []string{"r"}, time.Second)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // a few split rounds
	for _, a := range admins[:2] {
		if err := a.Del(ctx, "r").Err(); err != nil { // the minority holders undo
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire after a split vote cleared: %v", err)
	}
}

// TestLastingSplitIsNotPolled: minority keys that stay (a contender that
// crashed leaves them to their TTL) make every round a split vote; the
// delay doubles with each one, so a waiter does not poll every few
// milliseconds until they expire.
func TestLastingSplitIsNotPolled(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	admins := cl.Clients(t)
	for i, v := range []string{"crashed-1", "crashed-2"} {
		if err := admins[i].Set(ctx, "r", v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c := newClient(t, cl.Clients(t), redlock.WithRetry(slowRetry))
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.Acquire(wctx, []string{"r"}, time.Second)
	m := regexp.MustCompile(`after (\d+) attempts`).FindStringSubmatch(fmt.Sprint(err))
	if m == nil {
		t.Fatalf("Acquire = %v, want a failure after several attempts", err)
	}
	if n, _ := strconv.Atoi(m[1]); n < 3 || n > 15 {
		t.Errorf("%d attempts in 2 s of split votes, want 3 to 15 (a delay doubling from 15 ms)", n)
	}
}
