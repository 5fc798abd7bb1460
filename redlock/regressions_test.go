package redlock_test

// Regression tests for the exclusion and liveness holes that feature
// interactions opened (issue 17), each against real redis-server nodes.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// nodesExpiry returns, for every node, the latest time at which key may
// expire there, read off its PTTL: the node counted the TTL down at some
// moment before its reply came, so the reply's arrival (plus 1 ms, as PTTL
// is in whole milliseconds) bounds it from above. An estimate from the
// moment the request was sent instead can be short by the round trip,
// which on a loaded machine is several milliseconds.
func nodesExpiry(t *testing.T, cl redlocktest.Cluster, key string) []time.Time {
	t.Helper()
	var at []time.Time
	for _, s := range cl {
		pttl := s.Client(t).PTTL(context.Background(), key).Val()
		at = append(at, time.Now().Add(pttl+time.Millisecond))
	}
	return at
}

// TestConcurrentExtendsKeepUntilWithinTheNodes: Extend calls on one Lock
// run one after the other, so Until is never later than what a quorum of
// nodes holds, whichever call the nodes ran last (two concurrent Extends,
// of 20 s and 300 ms, once left Until 20 s ahead of keys that expired in
// 300 ms, and another Client acquired the resource).
func TestConcurrentExtendsKeepUntilWithinTheNodes(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.Acquire(ctx, []string{"r"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		var wg sync.WaitGroup
		for _, ttl := range []time.Duration{20 * time.Second, 300 * time.Millisecond} {
			wg.Go(func() {
				if err := l.Extend(ctx, ttl); err != nil {
					t.Errorf("Extend(%v): %v", ttl, err)
				}
			})
		}
		wg.Wait()
		waitSettled(t, c)
		until := l.Until()
		holding := 0
		var left []time.Duration
		for _, at := range nodesExpiry(t, cl, "r") {
			left = append(left, time.Until(at).Round(time.Millisecond))
			if !at.Before(until) {
				holding++
			}
		}
		if holding < c.Quorum() {
			t.Fatalf("round %d: Until is %v away, the nodes hold the key for %v: fewer than a quorum cover Until",
				i, time.Until(until).Round(time.Millisecond), left)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestExtendObeysTheRestartGate: Extend rejects a TTL above the restart
// gate's maximum, as Acquire does (it accepted one, and after a node
// restart two holders were possible).
func TestExtendObeysTheRestartGate(t *testing.T) {
	_, nodes := miniNodes(t, 1)
	const gate = 100 * time.Millisecond
	c := newClient(t, nodes, redlock.WithRestartGating(gate))
	ctx := context.Background()
	var l *redlock.Lock
	for deadline := time.Now().Add(5 * time.Second); l == nil; time.Sleep(20 * time.Millisecond) {
		l, _ = c.TryAcquire(ctx, []string{"r"}, gate) // the fresh node is gated first
		if time.Now().After(deadline) {
			t.Fatal("never acquired after the gate")
		}
	}
	err := l.Extend(ctx, 2*gate)
	if !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "restart gate") {
		t.Errorf("Extend(%v) with a %v gate = %v, want ErrInvalidArgument naming the restart gate", 2*gate, gate, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFencingTokensRiseAfterAFrozenAndAnEmptyNode: with restart gating,
// the next token is larger even when the next quorum is a node that
// missed the last token's record (frozen meanwhile) and a node that
// restarted without its data: tokens also rise with the nodes' clocks
// (they went backwards: each node proposed 1 + its stale counter).
func TestFencingTokensRiseAfterAFrozenAndAnEmptyNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	const gate = time.Second
	c := newClient(t, cl.Clients(t), redlock.WithRestartGating(gate), redlock.WithFencing(true))
	ctx := context.Background()
	acquire := func(what string) uint64 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			l, err := c.TryAcquire(ctx, []string{"r"}, gate)
			if err == nil {
				tok := l.FencingToken()
				_ = l.Release(ctx)
				waitSettledOn(t, c)
				return tok
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	first := acquire("first acquisition") // waits out the fresh nodes' gate
	cl[2].Stop(t)                         // node 2 misses the next record
	second := acquire("with node 2 frozen")
	cl[2].Cont(t)
	cl[0].Kill(t) // node 0 loses everything
	cl[0].Restart(t)
	cl[1].Stop(t) // the next quorum: node 0 (empty) and node 2 (stale)
	third := acquire("on the empty and the stale node")
	cl[1].Cont(t)
	if !(first < second && second < third) {
		t.Errorf("tokens %d, %d, %d: want strictly increasing", first, second, third)
	}
}

// waitSettledOn is waitSettled, tolerating a stopped node: it gives up
// after 1 s.
func waitSettledOn(t *testing.T, c *redlock.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = redlock.Flush(c, ctx)
}

// TestSplitVoteDoesNotWaitForAHolder: after a round in which no holder
// refused on a quorum (here two owners hold one node each), a waiting
// Acquire retries at the split-vote pace (a random 1-15 ms, doubling with
// each split in a row): it does not sleep until a refusing key expires (it
// slept up to 1 s after every split vote, which made contention between
// Clients 15-30x slower with release notices on).
func TestSplitVoteDoesNotWaitForAHolder(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	for i, s := range cl[:2] {
		v := fmt.Sprintf("%032x-other owner %d", i, i)
		if err := s.Client(t).Set(ctx, "r", v, 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var attempts atomic.Int32
	c := newClient(t, cl.Clients(t))
	retry := redlock.WithRetry(func() backoff.BackOff {
		return countingRetry{BackOff: backoff.NewConstantBackOff(10 * time.Millisecond), n: &attempts}
	})
	actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(actx, []string{"r"}, time.Second, retry); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("Acquire against a split vote: %v, want ErrNotAcquired", err)
	}
	// At the split-vote pace, doubling up to the policy's 10 ms or the
	// split-vote delay's 16 ms: at least 5 rounds in 500 ms; sleeping
	// until the keys' expiry (at most 1 s) allows one.
	if n := attempts.Load(); n < 5 {
		t.Errorf("%d rounds in 500 ms against a split vote, want the split-vote pace (at least 5)", n)
	}
}

// TestLateGrantOfAFailedAcquireIsDeleted: a grant that a slow node makes
// after its round was decided, while Acquire still retries, is deleted
// once Acquire gives up: the undo of each attempt goes to that node after
// its grant (the key stayed for its whole TTL).
func TestLateGrantOfAFailedAcquireIsDeleted(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	proxies[2].SetLatency(60 * time.Millisecond) // slower than the node timeout
	ctx := context.Background()
	for _, s := range cl[:2] { // another owner holds nodes 0 and 1
		if err := s.Client(t).Set(ctx, "r", fmt.Sprintf("%032x-other", 0), 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c := newClient(t, nodes, redlock.WithNodeTimeout(50*time.Millisecond), redlock.WithRetry(fastRetry))
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(actx, []string{"r"}, 10*time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("Acquire: %v, want ErrNotAcquired", err)
	}
	node2 := cl[2].Client(t)
	for deadline := time.Now().Add(3 * time.Second); node2.Exists(ctx, "r").Val() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node 2 keeps our key 3 s after Acquire gave up (TTL %v)", node2.PTTL(ctx, "r").Val())
		}
	}
}

// TestResourceNamesCannotReachInternalKeys: a resource's counter, holds
// and the gate marker are keys no resource name can address (a fenced lock
// on "a" overwrote a live lock on "a:fencing" with its counter, and {"a",
// "a:holds"} with an owner made every Release fail with WRONGTYPE); names
// with a NUL byte, the namespace's separator, are rejected.
func TestResourceNamesCannotReachInternalKeys(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithRestartGating(time.Second))
	ctx := context.Background()
	acquire := func(res []string, opts ...redlock.LockOption) *redlock.Lock {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			l, err := c.TryAcquire(ctx, res, time.Second, opts...)
			if err == nil {
				return l
			}
			if time.Now().After(deadline) {
				t.Fatalf("TryAcquire %q: %v", res, err)
			}
		}
	}
	plain := acquire([]string{"a:fencing", "restart-gate"})
	fenced := acquire([]string{"a"}, redlock.WithFencing(true))
	reentrant := acquire([]string{"b", "b:holds"}, redlock.WithOwner("o"))
	for _, l := range []*redlock.Lock{reentrant, fenced, plain} {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release %q: %v", l.Resources(), err)
		}
	}
	// The marker of releases before 0.2 survives upgrades: a lock on its
	// name would be refused for as long as it stays.
	for _, bad := range [][]string{{"a\x00fencing"}, {"x\x00"}, {"redlock:restart-gate"}} {
		if _, err := c.TryAcquire(ctx, bad, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("TryAcquire %q = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, err := c.TryAcquire(ctx, []string{"a"}, time.Second, redlock.WithRecord("redlock:restart-gate", time.Second)); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("TryAcquire with the record %q = %v, want ErrInvalidArgument", "redlock:restart-gate", err)
	}
	if _, err := redlock.New(cl.Clients(t), redlock.WithKeyPrefix("p\x00")); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("New with a NUL in the key prefix = %v, want ErrInvalidArgument", err)
	}
}

// TestConcurrentExtendsAfterScriptFlush: with the nodes' script caches
// empty, two Extends (of two locks) at once both succeed on healthy nodes
// (one failed with NOSCRIPT).
func TestConcurrentExtendsAfterScriptFlush(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, nodes)
	ctx := context.Background()
	for i := range 10 {
		var locks []*redlock.Lock
		for j := range 2 {
			l, err := c.TryAcquire(ctx, []string{fmt.Sprint("r", i, j)}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, l)
		}
		waitSettled(t, c)
		for _, rdb := range nodes {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for _, l := range locks {
			wg.Go(func() {
				if err := l.Extend(ctx, 10*time.Second); err != nil {
					t.Errorf("Extend after SCRIPT FLUSH: %v", err)
				}
			})
		}
		wg.Wait()
		for _, l := range locks {
			_ = l.Release(ctx)
		}
	}
}

// TestBadRetryFactoryAndManyResources: a retry factory that returns nil is
// an error, not a panic; the duplicate check is linear (it was quadratic:
// 40k names took seconds before any I/O).
func TestBadRetryFactoryAndManyResources(t *testing.T) {
	_, nodes := miniNodes(t, 1)
	c := newClient(t, nodes)
	ctx := context.Background()
	_, err := c.Acquire(ctx, []string{"r"}, time.Second, redlock.WithRetry(func() backoff.BackOff { return nil }))
	if !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Acquire with a factory returning nil = %v, want ErrInvalidArgument", err)
	}
	names := make([]string, 200_000) // quadratic: 2e10 comparisons
	for i := range names {
		names[i] = fmt.Sprint("n", i)
	}
	names[len(names)-1] = names[0]
	_, err = c.TryAcquire(ctx, names, time.Second)
	if !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), `"n0" is listed twice`) {
		t.Errorf("TryAcquire of %d names with a repeat = %v, want ErrInvalidArgument naming n0", len(names), err)
	}
}

// TestFrozenNodeDoesNotSlowEveryRetry: with one node frozen, a contended
// Acquire waits the node timeout for it once; later rounds do not wait for
// it until it answers again, so the handoff after a release takes about a
// round trip, not a node timeout (each retry waited the full timeout).
// With release notices off the retries did wait it (Acquire's attempts were
// taken for TryAcquire's when nothing was marked for a notice).
func TestFrozenNodeDoesNotSlowEveryRetry(t *testing.T) {
	for _, notices := range []bool{true, false} {
		t.Run(fmt.Sprint("notices=", notices), func(t *testing.T) { testFrozenNodeRetries(t, notices) })
	}
}

func testFrozenNodeRetries(t *testing.T, notices bool) {
	cl := redlocktest.Start(t, 3)
	const nodeTimeout = 2 * time.Second
	holder := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(nodeTimeout))
	waiter := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(nodeTimeout), redlock.WithReleaseNotices(notices),
		redlock.WithRetry(func() backoff.BackOff { return backoff.NewConstantBackOff(10 * time.Millisecond) }))
	ctx := context.Background()
	l, err := holder.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	// A round that waits for node 2 until the node timeout marks it down.
	// The waiter's rounds before the release decide at once (two nodes
	// refuse), so without this one none would: a round that straddles the
	// release (one node released, the other not yet) then waited the node
	// timeout for node 2, now and then under load.
	if _, _, err := waiter.HolderMetadata(ctx, "r"); !errors.Is(err, redlock.ErrUnavailable) && err != nil {
		t.Fatalf("HolderMetadata with node 2 frozen: %v", err)
	}
	if !redlock.Down(waiter, 2) {
		t.Fatal("node 2 is not down after a round that waited the node timeout for it")
	}
	got := make(chan time.Time, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, []string{"r"}, 10*time.Second)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- time.Now()
		if wl != nil {
			_ = wl.Release(ctx)
		}
	}()
	time.Sleep(500 * time.Millisecond) // the waiter's rounds go on
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		if d := at.Sub(released); d > nodeTimeout/2 {
			t.Errorf("handoff took %v with node 2 frozen, want well under the node timeout %v", d, nodeTimeout)
		}
	case <-time.After(3 * nodeTimeout):
		t.Fatal("the waiter never acquired")
	}
}

// TestCloseEndsAWaitingAcquire: an Acquire that waits for a holder when
// the Client closes returns ErrClosed at its next attempt, and Close
// returns once the Client's goroutines have ended.
func TestCloseEndsAWaitingAcquire(t *testing.T) {
	_, nodes := miniNodes(t, 3)
	holder := newClient(t, nodes)
	c, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := holder.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, []string{"r"}, 10*time.Second)
		got <- err
	}()
	time.Sleep(100 * time.Millisecond) // it waits
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, redlock.ErrClosed) || !errors.Is(err, redlock.ErrNotAcquired) {
			t.Errorf("waiting Acquire after Close = %v, want ErrNotAcquired and ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Acquire did not return after Close")
	}
	if _, err := c.TryAcquire(ctx, []string{"s"}, time.Second); !errors.Is(err, redlock.ErrClosed) {
		t.Errorf("TryAcquire after Close = %v, want ErrClosed", err)
	}
}

// TestFailedShorteningExtendKeepsExclusion: an Extend to a shorter TTL
// whose round failed (no answer in time, or the caller's ctx ended) may
// still run on the nodes; no other Client can hold the resource before
// Until. It could, with Until unchanged, when the script set the shorter
// TTL; the nodes now never lower a TTL (scripts/extend.lua).
func TestFailedShorteningExtendKeepsExclusion(t *testing.T) {
	for _, how := range []string{"node timeout", "ctx deadline"} {
		t.Run(how, func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			nodes, proxies := cl.ProxiedClients(t)
			a := newClient(t, nodes)
			b := newClient(t, cl.Clients(t))
			ctx := context.Background()
			l, err := a.Acquire(ctx, []string{"r"}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			ectx, cancel := context.WithCancel(ctx)
			if how == "node timeout" {
				for _, p := range proxies {
					p.SetLatencyIn(redlocktest.ClientToNode, 150*time.Millisecond)
				}
			} else {
				for _, p := range proxies {
					p.SetLatencyIn(redlocktest.ClientToNode, 40*time.Millisecond)
				}
				ectx, cancel = context.WithTimeout(ctx, 15*time.Millisecond)
			}
			err = l.Extend(ectx, 300*time.Millisecond)
			cancel()
			if err == nil {
				t.Fatal("Extend succeeded: the test tests nothing")
			}
			if how == "ctx deadline" && (errors.Is(err, redlock.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded)) {
				t.Errorf("Extend cut short by its ctx on healthy nodes = %v; want the ctx's cause, not ErrUnavailable", err)
			}
			time.Sleep(700 * time.Millisecond) // a 300ms TTL set by the scripts would have run out
			if l2, err := b.TryAcquire(ctx, []string{"r"}, 5*time.Second); err == nil {
				if time.Now().Before(l.Until()) {
					t.Errorf("exclusion broken: another Client holds r while Until is %v ahead", time.Until(l.Until()).Round(time.Millisecond))
				}
				_ = l2.Release(ctx)
			}
		})
	}
}

// TestCallsAfterCloseAreErrClosed: Extend, Release and HolderMetadata on
// a closed Client fail with ErrClosed, not with an error that reads as
// "Redis down" (found by an adversarial review).
func TestCallsAfterCloseAreErrClosed(t *testing.T) {
	_, nodes := miniNodes(t, 3)
	c, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Acquire(ctx, []string{"r"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, herr := c.HolderMetadata(ctx, "r")
	for name, err := range map[string]error{"Extend": l.Extend(ctx, 5*time.Second), "HolderMetadata": herr, "Release": l.Release(ctx)} {
		if !errors.Is(err, redlock.ErrClosed) || errors.Is(err, redlock.ErrUnavailable) {
			t.Errorf("%s after Close = %v; want ErrClosed, not ErrUnavailable", name, err)
		}
	}
}

// TestCloseWithFrozenNodeEndsWithinReadTimeout: a release still going out
// to a frozen node when Close's ctx ends keeps Close waiting for its read
// at most the go-redis read timeout. go-redis retried the timed-out call
// (MaxRetries) on a context that Close had not ended: Close took 2 read
// timeouts, more than Close's doc allows.
func TestCloseWithFrozenNodeEndsWithinReadTimeout(t *testing.T) {
	verifyNoLeaks(t)
	const readTimeout = 2 * time.Second
	cl := redlocktest.Start(t, 3)
	// The release waits for its reply the node timeout once sent: as long
	// as the read timeout, so that it is still waiting when Close gives up.
	c, err := redlock.New(readTimeoutClients(t, cl, readTimeout, true), redlock.WithNodeTimeout(readTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	start := time.Now()
	if err := l.Release(ctx); err != nil { // a quorum answers; node 2's call waits for its read
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v; want the ctx's DeadlineExceeded (the release to node 2 was cancelled)", err)
	}
	if took := time.Since(start); took > readTimeout*3/2 {
		t.Errorf("Close returned %v after the release; want within the %v read timeout (no retry)", took, readTimeout)
	}
}

// TestSplitHoldersWithoutMetadataNameNoHolder: two locks without metadata,
// each held on one node of three, refuse a third Client's round; its
// QuorumError names no holder. Votes were counted by metadata, so the two
// locks' "" made a quorum for one holder.
func TestSplitHoldersWithoutMetadataNameNoHolder(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	all := cl.Clients(t)
	ctx := context.Background()
	for i := range 2 { // lock "r" on node i alone, by a Client of that node
		c := newClient(t, all[i:i+1])
		if _, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second); err != nil {
			t.Fatalf("lock on node %d: %v", i, err)
		}
	}
	c := newClient(t, all)
	_, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	var q *redlock.QuorumError
	if !errors.As(err, &q) || q.Count(redlock.OutcomeHeld) != 2 {
		t.Fatalf("TryAcquire = %v, want a QuorumError with 2 nodes held", err)
	}
	if md, ok := q.HolderMetadata(); ok {
		t.Errorf("HolderMetadata() = %q, true for two locks on one node each; want no holder", md)
	}
}

// TestKeepFollowsAShorteningExtend: an Extend of the caller's that
// shortens a kept lock moves Keep's schedule with it. Keep slept on the
// Until it had read, so the lock expired while the kept context was live,
// and another Client took it (found by an adversarial helper).
func TestKeepFollowsAShorteningExtend(t *testing.T) {
	for _, viaDo := range []bool{false, true} {
		t.Run(map[bool]string{false: "Keep", true: "Do"}[viaDo], func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			a, b := newClient(t, cl.Clients(t)), newClient(t, cl.Clients(t))
			ctx := context.Background()
			work := func(kctx context.Context) error {
				l, _ := redlock.FromContext(kctx)
				// Shortened to 1 s (not less: Keep now really extends by
				// it, and a loaded machine must keep it), for 3 of its TTLs.
				if err := l.Extend(kctx, time.Second); err != nil {
					return err
				}
				for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && kctx.Err() == nil; time.Sleep(20 * time.Millisecond) {
					l2, err := b.TryAcquire(ctx, []string{"r"}, time.Second)
					if err != nil {
						continue
					}
					if kctx.Err() == nil {
						t.Errorf("another Client acquired r while the kept context was live, %v after Until",
							time.Since(l.Until()).Round(time.Millisecond))
					}
					_ = l2.Release(ctx)
					return nil
				}
				if left := time.Until(l.Until()); kctx.Err() == nil && (left <= 0 || left > time.Second) {
					t.Errorf("after 3 s kept at a 1 s TTL, Until is %v away, want within the 1 s TTL", left.Round(time.Millisecond))
				}
				return nil
			}
			if viaDo {
				if err := a.Do(ctx, []string{"r"}, 6*time.Second, work); err != nil {
					t.Errorf("Do = %v", err)
				}
				return
			}
			l, err := a.Acquire(ctx, []string{"r"}, 6*time.Second)
			must(t, err)
			kctx, stop := l.Keep(ctx)
			if err := work(kctx); err != nil {
				t.Error(err)
			}
			if err := stop(); err != nil {
				t.Errorf("stop = %v, want nil (Keep kept the lock)", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release = %v", err)
			}
		})
	}
}

// TestReleaseUnderKeepIsNotALoss: a Release while Keep runs ends the
// extensions and cancels the kept context; stop returns nil. Keep's next
// extension found the lock "already released" and reported a loss (found
// by an adversarial helper).
func TestReleaseUnderKeepIsNotALoss(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.Acquire(ctx, []string{"r"}, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := l.Keep(ctx)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-kctx.Done()
	if cause := context.Cause(kctx); errors.Is(cause, redlock.ErrLockLost) {
		t.Errorf("kept context's cause after Release = %v, want no loss", cause)
	}
	if err := stop(); err != nil {
		t.Errorf("stop after Release = %v, want nil", err)
	}
}

// TestShortWaitsDoNotMarkNodesDown: a round that waits less than the
// Client's node timeout (a call's own shorter WithNodeTimeout, an extend
// round cut at Until) says nothing about the nodes, and marks none down.
// Every node was marked down, so the retrying Acquires of the same Client
// then decided their rounds at once, counting the nodes failed before they
// could answer (found by an adversarial helper).
func TestShortWaitsDoNotMarkNodesDown(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	for range 5 {
		_, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithNodeTimeout(time.Microsecond))
		if !errors.Is(err, redlock.ErrUnavailable) {
			t.Fatalf("TryAcquire with a 1µs node timeout = %v, want ErrUnavailable", err)
		}
		for i := range c.Nodes() {
			if redlock.Down(c, i) {
				t.Fatalf("node %d is marked down after a round that waited 1µs for it", i)
			}
		}
	}
}

// TestOneFrozenNodeEndsAtTheNodeTimeout: on a Client of one node, a round
// sent to the idle node by its caller (an inline call) still ends within
// the node timeout when the node is frozen, with and without go-redis's
// ContextTimeoutEnabled (without it go-redis reads until its ReadTimeout,
// here 3 s, so the call must go through the sender and the round stop
// waiting at the node timeout).
func TestOneFrozenNodeEndsAtTheNodeTimeout(t *testing.T) {
	for _, ctxTimeout := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeout), func(t *testing.T) {
			s := redlocktest.StartServer(t)
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: ctxTimeout,
				ReadTimeout: 3 * time.Second, MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(100*time.Millisecond))
			ctx := context.Background()
			l, err := c.TryAcquire(ctx, []string{"frozen"}, 10*time.Second)
			must(t, err)
			must(t, l.Release(ctx))
			time.Sleep(300 * time.Millisecond) // the node's sender ends: the next call finds it idle
			s.Stop(t)
			defer s.Cont(t)
			start := time.Now()
			_, err = c.TryAcquire(ctx, []string{"frozen"}, 10*time.Second)
			if took := time.Since(start); took > time.Second {
				t.Errorf("TryAcquire on the frozen node took %v (err %v), want about the 100ms node timeout", took, err)
			}
			if !errors.Is(err, redlock.ErrNotAcquired) {
				t.Errorf("TryAcquire on the frozen node: %v, want ErrNotAcquired", err)
			}
		})
	}
}
