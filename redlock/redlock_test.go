package redlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// fastRetry retries every 0-2 ms, forever (ctx bounds it).
func fastRetry() backoff.BackOff {
	return redlock.FullJitter(backoff.NewConstantBackOff(2 * time.Millisecond))
}

// countingRetry wraps a policy and calls hook before each wait.
type countingRetry struct {
	backoff.BackOff
	n    *atomic.Int32
	hook func()
}

func (c countingRetry) NextBackOff() time.Duration {
	c.n.Add(1)
	if c.hook != nil {
		c.hook()
	}
	return c.BackOff.NextBackOff()
}

func newClient(t *testing.T, nodes []redis.UniversalClient, opts ...redlock.Option) *redlock.Client {
	t.Helper()
	c, err := redlock.New(nodes, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { closeClient(t, c) })
	return c
}

// closeClient closes c, failing t if that takes more than 10 s.
func closeClient(t testing.TB, c *redlock.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// waitSettled waits until every command c has queued was answered:
// Release returns on a quorum, before the other nodes have answered.
func waitSettled(t *testing.T, c *redlock.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := redlock.Flush(c, ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// totalKeys returns the number of keys over all servers.
func totalKeys(t *testing.T, cl redlocktest.Cluster) int {
	t.Helper()
	n := 0
	for _, keys := range cl.Keys(t) {
		n += len(keys)
	}
	return n
}

// waitNoKeys polls until no server holds a key, up to limit.
func waitNoKeys(t *testing.T, cl redlocktest.Cluster, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for totalKeys(t, cl) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("keys still present after %v: %q", limit, cl.Keys(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReleaseReturnsOnQuorum: Release returns once a quorum has deleted
// the keys, without waiting for a stopped node; its script for that node
// runs when the node comes back, and Client.Wait waits for it.
func TestReleaseReturnsOnQuorum(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	// A node timeout far above go-redis's 5 s read timeout: a Release
	// that waited for the stopped node would take at least 5 s.
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(20*time.Second))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := redlock.Flush(c, ctx); err != nil { // node 2's grant too
		t.Fatal(err)
	}
	cl[2].Stop(t)
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release with 1 of 3 stopped: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Release took %v, want it to return on the quorum (well under 1s)", d)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := redlock.Flush(c, short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait while node 2's release is on its way = %v, want DeadlineExceeded", err)
	}
	cl[2].Cont(t)
	if err := redlock.Flush(c, ctx); err != nil {
		t.Fatal(err)
	}
	for i, keys := range cl.Keys(t) {
		if len(keys) != 0 {
			t.Errorf("node %d keeps %q after Wait", i, keys)
		}
	}
}

func TestMutualExclusionUnderContention(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	const workers, cycles = 8, 200
	var inside, overlaps, done atomic.Int32
	var wg sync.WaitGroup
	ctx := context.Background()
	for w := range workers {
		// Each worker has its own clients and Client, as separate
		// processes would.
		// A generous node timeout: this test is about exclusion, and the
		// race detector on a loaded 2-core machine stretches round trips.
		c := newClient(t, cl.Clients(t), redlock.WithRetry(fastRetry), redlock.WithNodeTimeout(500*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cycles {
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				l, err := c.Acquire(actx, []string{"shared"}, 3*time.Second)
				cancel()
				if err != nil {
					t.Errorf("worker %d: Acquire: %v", w, err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				if time.Now().After(l.Until()) {
					t.Errorf("worker %d: held past Until", w)
				}
				inside.Add(-1)
				// A release that no quorum confirmed in time (ErrUnavailable)
				// still runs on the nodes; the key check below catches any
				// that did not.
				if err := l.Release(ctx); err != nil && !errors.Is(err, redlock.ErrUnavailable) {
					t.Errorf("worker %d: Release: %v", w, err)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := overlaps.Load(); got != 0 {
		t.Errorf("overlapping critical sections = %d, want 0", got)
	}
	if got := done.Load(); got != workers*cycles {
		t.Errorf("completed cycles = %d, want %d", got, workers*cycles)
	}
	waitNoKeys(t, cl, 2*time.Second)
}

func TestStoppedMinorityIsBoundedByNodeTimeout(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	const nodeTimeout = 300 * time.Millisecond
	// The clients keep go-redis defaults (5 s read timeout, no
	// ContextTimeoutEnabled): the bound must come from redlock itself.
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(nodeTimeout))
	ctx := context.Background()
	cl[2].Stop(t)
	bound := nodeTimeout + 700*time.Millisecond // far below the 5 s read timeout

	start := time.Now()
	l, err := c.Acquire(ctx, []string{"r"}, 5*time.Second)
	if err != nil {
		t.Fatalf("Acquire with 1 of 3 stopped: %v", err)
	}
	if d := time.Since(start); d > bound {
		t.Errorf("Acquire took %v, want at most %v", d, bound)
	}
	start = time.Now()
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend with 1 of 3 stopped: %v", err)
	}
	if d := time.Since(start); d > bound {
		t.Errorf("Extend took %v, want at most %v", d, bound)
	}
	start = time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release with 1 of 3 stopped: %v", err)
	}
	if d := time.Since(start); d > bound {
		t.Errorf("Release took %v, want at most %v", d, bound)
	}
	for i, s := range cl[:2] {
		if keys := s.Keys(t); len(keys) != 0 {
			t.Errorf("running node %d keeps %q after Release", i, keys)
		}
	}
	cl[2].Cont(t)
	// The queued acquire reaches node 2 after the release: the late-grant
	// handler deletes it long before its 5 s TTL.
	waitNoKeys(t, cl, 2*time.Second)
}

func TestStoppedMajorityFailsWithQuorumErrorAndLeavesNoKey(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(200*time.Millisecond))
	cl[1].Stop(t)
	cl[2].Stop(t)
	_, err := c.TryAcquire(context.Background(), []string{"r"}, 10*time.Second)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) {
		t.Fatalf("TryAcquire with 2 of 3 stopped = %v, want a *QuorumError", err)
	}
	if !errors.Is(err, redlock.ErrNotAcquired) || !errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("error %v does not match ErrNotAcquired and ErrUnavailable", err)
	}
	for _, i := range []int{1, 2} {
		r := qerr.Nodes[i]
		if r.Outcome != redlock.OutcomeTimeout || r.Addr != cl[i].Addr() {
			t.Errorf("node %d: outcome %v at %s, want timeout at %s", i, r.Outcome, r.Addr, cl[i].Addr())
		}
		if !strings.Contains(err.Error(), cl[i].Addr()) {
			t.Errorf("error text does not name stopped node %s: %v", cl[i].Addr(), err)
		}
	}
	if r := qerr.Nodes[0]; r.Outcome != redlock.OutcomeOK {
		t.Errorf("node 0 outcome = %v, want ok", r.Outcome)
	}
	// The undo does not wait: it goes out at once on node 0.
	for deadline := time.Now().Add(2 * time.Second); len(cl[0].Keys(t)) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("node 0 keeps %q 2s after the failed attempt", cl[0].Keys(t))
		}
	}
	cl[1].Cont(t)
	cl[2].Cont(t)
	// The SETs queued on the stopped nodes land now; they must be cleaned
	// up well before their 10 s TTL.
	waitNoKeys(t, cl, 3*time.Second)
}

func TestAcquireRetriesUntilRivalExpires(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rival := newClient(t, cl.Clients(t))
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	if _, err := rival.TryAcquire(ctx, []string{"r"}, time.Second); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int32
	retry := redlock.WithRetry(func() backoff.BackOff {
		return countingRetry{BackOff: redlock.DefaultRetry(), n: &attempts}
	})
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	const ttl = time.Second
	l, err := c.Acquire(actx, []string{"r"}, ttl, retry)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer l.Release(ctx)
	if n := attempts.Load(); n < 2 {
		t.Errorf("failed attempts before success = %d, want several", n)
	}
	// Validity comes from the successful attempt, not the first one.
	if left := time.Until(l.Until()); left < ttl/2 {
		t.Errorf("Until() is %v away, want more than %v", left, ttl/2)
	}
}

func TestFailedAttemptsLeaveNoKeyOfOurs(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	// A rival briefly holds the key on nodes 1 and 2 only: our first
	// attempts win node 0 alone.
	for _, s := range cl[1:] {
		if err := s.Client(t).Set(ctx, "r", "rival", 300*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
	}
	node0 := cl[0]
	var attempts atomic.Int32
	var leftovers atomic.Int32
	retry := redlock.WithRetry(func() backoff.BackOff {
		return countingRetry{
			BackOff: redlock.FullJitter(backoff.NewConstantBackOff(40 * time.Millisecond)),
			n:       &attempts,
			hook: func() {
				// Called after each failed attempt, before the wait, once
				// its undo (which does not wait) has gone out.
				waitSettled(t, c)
				if keys := node0.Keys(t); len(keys) != 0 {
					leftovers.Add(1)
				}
			},
		}
	})
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := c.Acquire(actx, []string{"r"}, time.Second, retry)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if attempts.Load() == 0 {
		t.Fatal("first attempt succeeded; the rival should have blocked it")
	}
	if n := leftovers.Load(); n != 0 {
		t.Errorf("%d of %d failed attempts left our key on node 0", n, attempts.Load())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCancelWhileWaiting(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	held, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(150*time.Millisecond, cancel)
	l, err := c.Acquire(wctx, []string{"r"}, time.Second)
	if l != nil || !errors.Is(err, redlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire cancelled while waiting = %v, %v; want ErrNotAcquired and context.Canceled", l, err)
	}
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Count(redlock.OutcomeHeld) < 2 {
		t.Errorf("error %v does not carry the last round's held outcomes", err)
	}
	// Already cancelled: no round at all.
	if _, err := c.TryAcquire(wctx, []string{"other"}, time.Second); !errors.Is(err, context.Canceled) || !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("TryAcquire with a cancelled ctx = %v", err)
	}
}

func TestReleaseOfExpiredLockLeavesSuccessorAlone(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	old := newClient(t, cl.Clients(t))
	next := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l1, err := old.TryAcquire(ctx, []string{"r"}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	l2, err := next.TryAcquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatalf("successor TryAcquire: %v", err)
	}
	if err := l1.Release(ctx); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("old holder's Release = %v, want ErrLockLost", err)
	}
	if err := l1.Extend(ctx, time.Second); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("old holder's Extend = %v, want ErrLockLost", err)
	}
	// The successor's TryAcquire returned at a quorum: its third SET may
	// still be on its way.
	waitSettled(t, next)
	for i, s := range cl {
		if ttl := s.Client(t).PTTL(ctx, "r").Val(); ttl < 5*time.Second {
			t.Errorf("node %d: successor's key PTTL = %v after the old Release, want about 10s", i, ttl)
		}
	}
	if err := l2.Release(ctx); err != nil {
		t.Errorf("successor Release = %v", err)
	}
}

func TestExtendAfterDeadlineNeverRecreatesKeys(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	// 300 ms: a grant must leave half its TTL, which a 50 ms TTL may not
	// under load; then past Until and the nodes' expiry.
	l, err := c.TryAcquire(ctx, []string{"r"}, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(l.Until()) + 150*time.Millisecond)
	if err := l.Extend(ctx, 10*time.Second); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Extend after Until = %v, want ErrLockLost", err)
	}
	if n := totalKeys(t, cl); n != 0 {
		t.Errorf("keys after a late Extend = %q, want none", cl.Keys(t))
	}
}

func TestExtendSurvivesOneFailingNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	cl[0].Kill(t)
	before := l.Until()
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatalf("Extend with node 0 down: %v", err)
	}
	if !l.Until().After(before) {
		t.Errorf("Until did not move: %v -> %v", before, l.Until())
	}
	for i, s := range cl[1:] {
		if ttl := s.Client(t).PTTL(ctx, "r").Val(); ttl < 5*time.Second {
			t.Errorf("node %d: PTTL = %v, want about 10s", i+1, ttl)
		}
	}
}

func TestScriptFlushBetweenCalls(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	flush := func() {
		for _, s := range cl {
			if err := s.Client(t).ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	flush()
	if err := l.Extend(ctx, time.Second); err != nil {
		t.Errorf("Extend after SCRIPT FLUSH: %v", err)
	}
	flush()
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release after SCRIPT FLUSH: %v", err)
	}
	flush()
	l, err = c.TryAcquire(ctx, []string{"r"}, time.Second)
	if err != nil {
		t.Errorf("TryAcquire after SCRIPT FLUSH: %v", err)
	} else {
		_ = l.Release(ctx)
	}
	waitSettled(t, c)
	if n := totalKeys(t, cl); n != 0 {
		t.Errorf("keys left = %q", cl.Keys(t))
	}
}

// TestReleaseWithCancelledContextStillDeletes: Release runs on the
// caller's values but neither its cancellation nor its deadline (a
// cleanup bounded by the node timeout).
func TestReleaseWithCancelledContextStillDeletes(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for name, ctx := range map[string]context.Context{"cancelled": cancelled, "deadline passed": expired} {
		// A new resource each: a key left by one case fails only that case.
		l, err := c.TryAcquire(context.Background(), []string{name}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release with a ctx whose %s = %v, want nil", name, err)
		}
		waitSettled(t, c)
		if n := totalKeys(t, cl); n != 0 {
			t.Errorf("%s: keys left = %q", name, cl.Keys(t))
		}
	}
}

// TestRoundOnCancelledContextSendsNothing: a round whose caller's ctx has
// already ended hands no command to go-redis, on one node (sent from the
// caller's goroutine) as on three, and fails.
func TestRoundOnCancelledContextSendsNothing(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			cl := redlocktest.Start(t, n)
			var clients []redis.UniversalClient
			hook := &commandHook{}
			for _, s := range cl {
				rdb := ctxTimeoutClient(t, s, 0)
				rdb.AddHook(hook)
				clients = append(clients, rdb)
			}
			c := newClient(t, clients)
			l, err := c.TryAcquire(context.Background(), []string{"r"}, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background())
			waitSettled(t, c)
			before := hook.calls.Load()
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			for range 20 {
				if err := l.Extend(ctx, 10*time.Second); !errors.Is(err, context.Canceled) || errors.Is(err, redlock.ErrUnavailable) {
					t.Fatalf("Extend on a cancelled ctx = %v, want context.Canceled, not ErrUnavailable", err)
				}
			}
			waitSettled(t, c)
			if sent := hook.calls.Load() - before; sent != 0 {
				t.Errorf("%d calls went to go-redis for rounds on a cancelled ctx, want 0", sent)
			}
		})
	}
}

// TestTTLIsSentInMilliseconds: the nodes get the TTL in whole
// milliseconds, and Until and TTL use it rounded down so (they used the
// fraction the keys do not have).
func TestTTLIsSentInMilliseconds(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	start := time.Now()
	l, err := c.TryAcquire(ctx, []string{"r"}, 1500*time.Millisecond+999*time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if got := l.TTL(); got != 1500*time.Millisecond {
		t.Errorf("TTL() = %v after TryAcquire with 1.500999s, want 1.5s", got)
	}
	if u := l.Until(); u.After(start.Add(1500 * time.Millisecond)) {
		t.Errorf("Until() is %v after the call's start, want at most 1.5s", u.Sub(start))
	}
	if err := l.Extend(ctx, 1400*time.Millisecond+500*time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if got := l.TTL(); got != 1400*time.Millisecond {
		t.Errorf("TTL() = %v after Extend with 1.4005s, want 1.4s", got)
	}
	if err := l.Extend(ctx, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for i, s := range cl {
		// The round was decided at two grants; the third may still land.
		var ttl time.Duration
		for range 100 {
			if ttl = s.Client(t).PTTL(ctx, "r").Val(); ttl > 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if ttl <= time.Second || ttl > 1500*time.Millisecond {
			t.Errorf("node %d: PTTL = %v, want about 1500ms (at most 1500)", i, ttl)
		}
	}
}

func TestSingleNode(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("second TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// rivalTryAcquire has rival TryAcquire resource every 20 ms for d (each
// win released at once) and returns its wins and tries, or ctx's cause if
// ctx ends first (the run context of a Do that lost its lock).
func rivalTryAcquire(ctx context.Context, rival *redlock.Client, resource string, ttl, d time.Duration) (wins, tries int, err error) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ctx.Err() != nil {
			return wins, tries, context.Cause(ctx)
		}
		tries++
		if l, err := rival.TryAcquire(ctx, []string{resource}, ttl); err == nil {
			wins++
			_ = l.Release(ctx)
		}
	}
	return wins, tries, nil
}

// verifyNoLeaks fails t if goroutines started during t outlive it and its
// cleanups (servers, clients). Call it first, so its check runs last.
func verifyNoLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

func TestDoExtendsWhileRunning(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	rival := newClient(t, cl.Clients(t))
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	var rivalWins, rivalTries int
	err := c.Do(ctx, []string{"r"}, ttl, func(ctx context.Context) error {
		var err error
		rivalWins, rivalTries, err = rivalTryAcquire(ctx, rival, "r", ttl, 3*ttl)
		return err
	})
	if err != nil {
		t.Fatalf("Do = %v, want nil", err)
	}
	if rivalWins != 0 || rivalTries < 10 {
		t.Errorf("rival won %d of %d tries while Do ran 3x TTL, want 0 of many", rivalWins, rivalTries)
	}
	waitSettled(t, c)
	if n := totalKeys(t, cl); n != 0 {
		t.Errorf("keys after Do = %q", cl.Keys(t))
	}
}

func TestDoCancelsBeforeUntilWhenMajorityStops(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(100*time.Millisecond))
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	var cancelledAt, until time.Time
	var cause error
	err := c.Do(ctx, []string{"r"}, ttl, func(ctx context.Context) error {
		l, ok := redlock.FromContext(ctx)
		if !ok {
			return errors.New("no lock in fn's ctx")
		}
		cl[1].Stop(t)
		cl[2].Stop(t)
		select {
		case <-ctx.Done():
		case <-time.After(5 * ttl):
			return errors.New("fn's ctx was never cancelled")
		}
		cancelledAt, until, cause = time.Now(), l.Until(), context.Cause(ctx)
		return nil
	})
	if !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Do = %v, want ErrLockLost", err)
	}
	if !errors.Is(cause, redlock.ErrLockLost) {
		t.Errorf("fn's ctx cause = %v, want ErrLockLost", cause)
	}
	if !cancelledAt.Before(until) {
		t.Errorf("fn's ctx cancelled at %v, not before Until %v", cancelledAt, until)
	}
	// Calls abandoned on the stopped nodes end once the nodes answer;
	// verifyNoLeaks checks that nothing else remains.
	cl[1].Cont(t)
	cl[2].Cont(t)
}

// TestNoScriptLoadsInSteadyState: scripts go out as EVALSHA; EVAL (the
// NOSCRIPT fallback) runs only while a node does not know a script yet.
// TryAcquire of a plain lock sends SET NX GET, no script.
func TestNoScriptLoadsInSteadyState(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, nodes)
	ctx := context.Background()
	cycle := func() {
		t.Helper()
		l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// First use: every node learns both scripts (EVAL after NOSCRIPT, or
	// SCRIPT LOAD when the NOSCRIPT came after the node timeout). How
	// many EVALs that takes is not fixed: a node lagging behind the
	// quorum can get several ops of one script in one pipeline, each
	// answered NOSCRIPT, and an op whose deadline passes while queued is
	// never sent. So warm up until every node has cached both scripts,
	// then measure.
	waitFor(t, "both scripts cached on every node", func() bool {
		cycle()
		waitSettled(t, c)
		for _, rdb := range nodes {
			if cachedScripts(t, rdb) < 2 {
				return false
			}
		}
		return true
	})
	resetStats(t, nodes)
	for range 50 {
		cycle()
	}
	waitSettled(t, c)
	// Each cycle sends at most two EVALSHAs per node (Extend, Release)
	// and a SET for the TryAcquire.
	for i, rdb := range nodes {
		info := rdb.Info(ctx, "commandstats").Val()
		evals, evalshas, sets := cmdCalls(info, "eval"), cmdCalls(info, "evalsha"), cmdCalls(info, "set")
		if evals > 0 {
			t.Errorf("node %d: %d EVAL calls in steady state, want none", i, evals)
		}
		if evalshas == 0 || evalshas > 100 {
			t.Errorf("node %d: %d EVALSHA calls for 50 Extends and Releases, want 1-100 (TryAcquire sends no script)", i, evalshas)
		}
		if sets == 0 {
			t.Errorf("node %d: no SET calls, want one per TryAcquire", i)
		}
	}
}

// cachedScripts returns number_of_cached_scripts of INFO memory.
func cachedScripts(t *testing.T, rdb redis.UniversalClient) int {
	t.Helper()
	info := rdb.Info(context.Background(), "memory").Val()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "number_of_cached_scripts:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("number_of_cached_scripts: %v", err)
			}
			return n
		}
	}
	t.Fatalf("INFO memory has no number_of_cached_scripts: %q", info)
	return 0
}

// resetStats runs CONFIG RESETSTAT on every node.
func resetStats(t *testing.T, nodes []redis.UniversalClient) {
	t.Helper()
	for i, rdb := range nodes {
		if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
			t.Fatalf("CONFIG RESETSTAT on node %d: %v", i, err)
		}
	}
}

// cmdCalls returns calls= of cmdstat_<name> in INFO commandstats output.
func cmdCalls(info, name string) int {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":calls=")
		if !ok {
			continue
		}
		n := 0
		for _, ch := range rest {
			if ch < '0' || ch > '9' {
				break
			}
			n = n*10 + int(ch-'0')
		}
		return n
	}
	return 0
}

// TestServerWithoutSetNXGet: a node that rejects SET NX GET as a syntax
// error (Redis before 7.0) gets the acquire script from then on, and in the
// same round while that round is undecided (not after: a Release or undo
// may follow a decided round at once, and the grant must not pass it).
func TestServerWithoutSetNXGet(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	old := newRejectHook(isSetGet, syntaxError{}) // as Redis 6 answers SET NX GET
	nodes[0].(*redis.Client).AddHook(old)
	c := newClient(t, nodes)
	ctx := context.Background()

	// Concurrent first rounds: some reach node 0 in one pipeline.
	var wg sync.WaitGroup
	locks := make([]*redlock.Lock, 16)
	errs := make([]error, len(locks))
	for i := range locks {
		wg.Go(func() { locks[i], errs[i] = c.TryAcquire(ctx, []string{fmt.Sprint("k", i)}, time.Minute) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("TryAcquire k%d: %v", i, err)
		}
	}
	if err := redlock.Flush(c, ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(cl[0].Keys(t)); got == 0 {
		t.Errorf("node 0 holds none of %d keys: an undecided round must send it the script", len(locks))
	}
	if old.rejected.Load() == 0 {
		t.Fatal("the hook rejected nothing: the test does not test the fallback")
	}
	for _, l := range locks {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rejected := old.rejected.Load()
	for range 10 {
		l, err := c.TryAcquire(ctx, []string{"r"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		waitSettled(t, c)
		if n := nodes[0].Exists(ctx, "r").Val(); n != 1 {
			t.Errorf("node 0 did not get the lock's key")
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := old.rejected.Load(); got != rejected {
		t.Errorf("node 0 got SET NX GET %d more times after rejecting it, want 0", got-rejected)
	}
}

// rejectHook is a go-redis hook that, while on, answers each command whose
// arguments match with err, without sending it, alone or in a pipeline;
// rejected counts them.
type rejectHook struct {
	match    func(args []any) bool
	err      error
	on       atomic.Bool
	rejected atomic.Int32
}

// newRejectHook returns a rejectHook that is on.
func newRejectHook(match func(args []any) bool, err error) *rejectHook {
	h := &rejectHook{match: match, err: err}
	h.on.Store(true)
	return h
}

func (h *rejectHook) reject(cmd redis.Cmder) bool {
	if !h.on.Load() || !h.match(cmd.Args()) {
		return false
	}
	h.rejected.Add(1)
	cmd.SetErr(h.err)
	return true
}

func (h *rejectHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *rejectHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.reject(cmd) {
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (h *rejectHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		rest := slices.DeleteFunc(slices.Clone(cmds), h.reject)
		if len(rest) == 0 {
			return nil
		}
		return next(ctx, rest)
	}
}

// isSetGet matches SET ... GET, which Redis before 7.0 answers with a
// syntax error when it also has NX.
func isSetGet(args []any) bool {
	return len(args) >= 2 && strings.EqualFold(fmt.Sprint(args[0]), "set") && strings.EqualFold(fmt.Sprint(args[len(args)-1]), "get")
}

type syntaxError struct{}

func (syntaxError) Error() string { return "ERR syntax error" }
func (syntaxError) RedisError()   {}

// TestNodeSlowerThanNodeTimeoutIsCleaned: on a node whose link is slower
// than the node timeout every first EVALSHA answers NOSCRIPT after its
// round's deadline, when no EVAL may follow. The script is loaded then, so
// that later releases and late-grant cleanups delete the keys there
// (without it the node kept every key until its TTL).
func TestNodeSlowerThanNodeTimeoutIsCleaned(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	proxies[2].SetLatencyIn(redlocktest.ClientToNode, 150*time.Millisecond)
	c := newClient(t, nodes, redlock.WithNodeTimeout(50*time.Millisecond))
	ctx := context.Background()
	for i := range 2 {
		l, err := c.TryAcquire(ctx, []string{"r"}, time.Minute)
		if err != nil {
			t.Fatalf("cycle %d: TryAcquire: %v", i, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
		waitSettled(t, c)
	}
	for i, keys := range cl.Keys(t) {
		if len(keys) != 0 {
			t.Errorf("node %d keeps %q after two cycles and Wait", i, keys)
		}
	}
}

// TestCancelledRoundIsNotUnavailable: a round that the caller's ctx cuts
// short, on healthy nodes, fails with ErrNotAcquired and ctx's cause, not
// with ErrUnavailable ("Redis is down"): the nodes did not fail, the
// caller gave up (a regression: every cut-short call counted as a node
// timeout, and a scheduler Shutdown read as an outage).
func TestCancelledRoundIsNotUnavailable(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	for _, p := range proxies {
		p.SetLatency(100 * time.Millisecond)
	}
	c := newClient(t, nodes, redlock.WithNodeTimeout(2*time.Second))
	for _, call := range []string{"TryAcquire", "Acquire"} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		var err error
		if call == "TryAcquire" {
			_, err = c.TryAcquire(ctx, []string{"r-" + call}, time.Minute)
		} else {
			_, err = c.Acquire(ctx, []string{"r-" + call}, time.Minute)
		}
		if !errors.Is(err, redlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Errorf("%s cancelled mid-round: %v; want ErrNotAcquired and context.Canceled", call, err)
		}
		if errors.Is(err, redlock.ErrUnavailable) {
			t.Errorf("%s cancelled mid-round: %v matches ErrUnavailable; every node is healthy", call, err)
		}
		cancel()
	}
	waitSettled(t, c)
}

// TestErrorReplyToSetNXGet: TryAcquire's SET NX GET goes out with its
// reply read raw (pipeline.go, cook). An error reply that go-redis does
// not retry (here OOM, from a node over its maxmemory) reaches the caller
// as go-redis's would, and the command is not sent again; one that
// go-redis retries (READONLY, from a replica) is sent again with Do, which
// retries it.
func TestErrorReplyToSetNXGet(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	rdb := cl.Clients(t)[0]
	// A generous node timeout: go-redis's retries of READONLY (backoff 8
	// ms and up) must fit, also under -race on a loaded machine.
	c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	failed := func(err error, prefix string) {
		t.Helper()
		var qerr *redlock.QuorumError
		if !errors.As(err, &qerr) {
			t.Fatalf("TryAcquire: %v, want a *QuorumError", err)
		}
		if r := qerr.Nodes[0]; r.Outcome != redlock.OutcomeError || !redis.HasErrorPrefix(r.Err, prefix) {
			t.Errorf("node 0: outcome %v, error %v; want %v with the node's %s error reply", r.Outcome, r.Err, redlock.OutcomeError, prefix)
		}
	}
	rejected := func() int {
		return cmdStat(rdb.Info(ctx, "commandstats").Val(), "set", "rejected_calls")
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	resetStats(t, []redis.UniversalClient{rdb})
	// One alone (sendOne), then several at once (some in one pipeline).
	_, err := c.TryAcquire(ctx, []string{"r"}, time.Minute)
	failed(err, "OOM")
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = c.TryAcquire(ctx, []string{fmt.Sprint("r", i)}, time.Minute) })
	}
	wg.Wait()
	for _, err := range errs {
		failed(err, "OOM")
	}
	waitSettled(t, c)
	if got := rejected(); got != n+1 {
		t.Errorf("SET rejected %d times for %d TryAcquires, want %d: OOM is not sent again", got, n+1, n+1)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}

	// A replica of a master that is not there: writes answer READONLY.
	if err := rdb.SlaveOf(ctx, "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	resetStats(t, []redis.UniversalClient{rdb})
	_, err = c.TryAcquire(ctx, []string{"r"}, time.Minute)
	failed(err, "READONLY")
	waitSettled(t, c)
	if got := rejected(); got < 2 {
		t.Errorf("SET rejected %d times for a TryAcquire on a replica, want at least 2: READONLY goes again with Do", got)
	}
	if err := rdb.SlaveOf(ctx, "no", "one").Err(); err != nil {
		t.Fatal(err)
	}

	l, err := c.TryAcquire(ctx, []string{"r"}, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire on the node as it was: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestProxyErrorAfterSetNXGetRan: an error reply to a SET NX GET that ran
// (as a proxy sends when its upstream times out) is not sent again, as
// with Do: the node counts as failed, and the undo deletes the key. Only
// error replies that say the command did not run are sent again.
func TestProxyErrorAfterSetNXGetRan(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	rdb := cl.Clients(t)[0]
	proxy := &proxyError{key: "p"}
	rdb.(*redis.Client).AddHook(proxy)
	c := newClient(t, []redis.UniversalClient{rdb})
	ctx := context.Background()
	_, err := c.TryAcquire(ctx, []string{"p"}, time.Minute)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Nodes[0].Outcome != redlock.OutcomeError {
		t.Fatalf("TryAcquire: %v, want a *QuorumError with node 0 %v", err, redlock.OutcomeError)
	}
	if !proxy.done.Load() {
		t.Fatal("the hook replaced no reply: the test tests nothing")
	}
	waitSettled(t, c)
	if v, err := rdb.Get(ctx, "p").Result(); err == nil {
		t.Errorf("key p left on the node (%q, TTL %v)", v, rdb.PTTL(ctx, "p").Val())
	}
}

// proxyError is a go-redis hook that lets the first SET of key run and
// then replaces its raw reply with a proxy's error reply.
type proxyError struct {
	key  string
	done atomic.Bool
}

func (h *proxyError) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *proxyError) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); len(a) > 1 && a[0] == "set" && a[1] == h.key && h.done.CompareAndSwap(false, true) {
			err = proxyReply("ERR proxy: upstream timed out")
			cmd.SetErr(err)
		}
		return err
	}
}

// proxyReply is an error reply, as a proxy in front of a node sends.
type proxyReply string

func (e proxyReply) Error() string { return string(e) }
func (proxyReply) RedisError()     {}

func (h *proxyError) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSetNXGetSentAgainByGoRedis: go-redis sends a command again after a
// connection error, also one that ran: the SET NX GET whose reply was lost
// then answers the lock's own value, which is a grant, not another holder.
// Read as a refusal, the node would be skipped by the undo, and the key
// would stay until its TTL with nobody holding the lock.
func TestSetNXGetSentAgainByGoRedis(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	var cut atomic.Bool
	rdb := redis.NewClient(&redis.Options{Addr: cl.Addrs()[0],
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &cutAfterWrite{Conn: c, match: []byte("\r\nset\r\n$1\r\ne\r\n"), cut: &cut}, nil
		}})
	t.Cleanup(func() { rdb.Close() })
	c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"e"}, time.Minute)
	if !cut.Load() {
		t.Fatal("no connection was cut after the SET: the test tests nothing")
	}
	if err != nil {
		t.Fatalf("TryAcquire whose SET NX GET ran and was sent again: %v, want the lock", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, "e").Val(); n != 0 {
		t.Errorf("key e left after Release")
	}
}

// cutAfterWrite is a connection that, the first time a write contains
// match, lets the write reach the server and then fails every read with
// io.EOF, as a connection lost before the reply.
type cutAfterWrite struct {
	net.Conn
	match []byte
	cut   *atomic.Bool
	dead  atomic.Bool
}

func (c *cutAfterWrite) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if bytes.Contains(b, c.match) && c.cut.CompareAndSwap(false, true) {
		time.Sleep(30 * time.Millisecond) // the server runs the command
		c.dead.Store(true)
	}
	return n, err
}

func (c *cutAfterWrite) Read(b []byte) (int, error) {
	if c.dead.Load() {
		c.Conn.Close()
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// TestResentAcquireNeverPassesItsUndo: an acquire that a node asks to get
// in another form (the script after SET NX GET rejected as by a server
// before 7.0, EVAL after NOSCRIPT) goes again behind the rest of its
// pipeline only when no later op there names its key: the undo queued
// behind it must run after it, or the re-sent acquire would set a key that
// nothing deletes before its TTL. An acquire kept out after NOSCRIPT has
// its script loaded instead, so that the node knows it next time.
func TestResentAcquireNeverPassesItsUndo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noscript bool
		opts     []redlock.LockOption
	}{
		// SET NX GET (TryAcquire only) is not here: a lost TryAcquire
		// waits for every answer, the re-sent script's included, before it
		// queues its undo (untilSettled, round.go), so the two never share a
		// pipeline; TestLostTryAcquireSendsNoNeedlessUndo covers the wait.
		{"NOSCRIPT", true, []redlock.LockOption{redlock.WithOwner("o")}}, // a reentrant lock gets the script
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			nodes := cl.Clients(t)
			hook := &busyThenReject{slow: "x", reject: "r", noscript: tc.noscript}
			nodes[2].(*redis.Client).AddHook(hook)
			c := newClient(t, nodes, redlock.WithNodeTimeout(2*time.Second))
			ctx := context.Background()
			// Another owner holds r on nodes 0 and 1, so a round for r is
			// decided without node 2, while node 2's worker is still busy
			// with x: the acquire of r and its undo reach node 2 in one
			// pipeline.
			for _, rdb := range nodes[:2] {
				if err := rdb.Set(ctx, "r", "another owner's value", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// x is released only at the end: a release queued meanwhile
			// would join its SET on node 2 in one pipeline.
			// One attempt of Acquire, which decides at the quorum without
			// waiting for node 2's answer, so that its undo joins the
			// acquire's pipeline there.
			once := append([]redlock.LockOption{redlock.WithRetry(func() backoff.BackOff { return &backoff.StopBackOff{} })}, tc.opts...)
			whileBusy(t, c, hook, func() {
				if _, err := c.Acquire(ctx, []string{"r"}, time.Minute, once...); !errors.Is(err, redlock.ErrNotAcquired) {
					t.Fatalf("Acquire r: %v, want ErrNotAcquired", err)
				}
			})
			if !hook.rejected.Load() || !hook.shared.Load() {
				t.Fatalf("the hook rejected the acquire of r in a pipeline: %v, with a later command on r: %v; both must be true, or the test tests nothing",
					hook.rejected.Load(), hook.shared.Load())
			}
			if v, err := nodes[2].Get(ctx, "r").Result(); err == nil {
				t.Errorf("key r left on node 2 (%q, TTL %v) by an acquire sent again after its undo", v, nodes[2].PTTL(ctx, "r").Val())
			}
			// The node learns the script kept out: the next acquisition
			// there is granted.
			l, err := c.TryAcquire(ctx, []string{"next"}, time.Minute, tc.opts...)
			if err != nil {
				t.Fatalf("TryAcquire after the kept-out acquire: %v", err)
			}
			waitSettled(t, c)
			if n := nodes[2].Exists(ctx, "next").Val(); n != 1 {
				t.Errorf("node 2 did not grant the next acquisition")
			}
			_ = l.Release(ctx)
		})
	}
}

// TestResentReleasePassesLaterAcquire: a release that a node asks to get
// as EVAL (NOSCRIPT) goes again behind the rest of its pipeline even when a
// later op there names its key: an acquire of another lock there is then
// refused, as if it had come a moment sooner, and the key is deleted; kept
// out, the release would leave the key until its TTL.
func TestResentReleasePassesLaterAcquire(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	hook := &busyThenReject{slow: "x", reject: "r", noscript: true}
	nodes[2].(*redis.Client).AddHook(hook)
	c := newClient(t, nodes, redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	a, err := c.TryAcquire(ctx, []string{"r"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	var b *redlock.Lock
	whileBusy(t, c, hook, func() {
		// A's release returns on nodes 0 and 1; B then gets r there. On
		// node 2 both queue behind x, A's release first.
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if b, err = c.TryAcquire(ctx, []string{"r"}, time.Minute); err != nil {
			t.Fatalf("TryAcquire by B after A's release: %v", err)
		}
	})
	if !hook.rejected.Load() || !hook.shared.Load() {
		t.Fatalf("the hook rejected the release of r in a pipeline: %v, with a later command on r: %v; both must be true, or the test tests nothing",
			hook.rejected.Load(), hook.shared.Load())
	}
	if v, err := nodes[2].Get(ctx, "r").Result(); err == nil {
		t.Errorf("key r left on node 2 (%q, TTL %v): A's release was not sent again", v, nodes[2].PTTL(ctx, "r").Val())
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestQueuedCallDroppedAfterCallerEnds: a call still queued for a busy
// node after its round was decided without it is dropped, never sent, once
// the caller's ctx ends (as when the round's context derived from ctx),
// rather than sent until the round's deadline: load the caller gave up on.
func TestQueuedCallDroppedAfterCallerEnds(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	hook := &busyThenReject{slow: "x"} // busy for 1 s with x; rejects nothing
	nodes[2].(*redis.Client).AddHook(hook)
	c := newClient(t, nodes, redlock.WithNodeTimeout(5*time.Second))
	bg := context.Background()
	var l *redlock.Lock
	whileBusy(t, c, hook, func() {
		ctx, cancel := context.WithCancel(bg)
		var err error
		l, err = c.TryAcquire(ctx, []string{"r"}, time.Minute) // decided on nodes 0 and 1
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	})
	if n := nodes[2].Exists(bg, "r").Val(); n != 0 {
		t.Errorf("r set on node 2 after its caller's ctx ended: the queued call was sent, want it dropped")
	}
	if err := l.Release(bg); err != nil {
		t.Fatal(err)
	}
}

// TestHeldLockKeepsNoCallerContext: a lock acquired after a failed
// attempt does not keep the Acquire's ctx (and its values) reachable
// through that attempt's results, which live in the round's state.
func TestHeldLockKeepsNoCallerContext(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	c := newClient(t, cl.Clients(t))
	a, err := c.TryAcquire(context.Background(), []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	type key struct{}
	big := new([1 << 20]byte)
	wp := weak.Make(big)
	ctx := context.WithValue(context.Background(), key{}, big)
	time.AfterFunc(100*time.Millisecond, func() { _ = a.Release(context.Background()) })
	l, err := c.Acquire(ctx, []string{"r"}, 10*time.Second) // fails until a's release
	if err != nil {
		t.Fatal(err)
	}
	ctx, big = nil, nil
	_, _ = ctx, big
	waitSettled(t, c) // the failed attempts' undo calls, which carry their ctx, are done
	for range 5 {
		runtime.GC()
	}
	if wp.Value() != nil {
		t.Error("the Acquire's ctx value is reachable while the lock is held")
	}
	runtime.KeepAlive(l)
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
}

// whileBusy runs fn while node 2's worker is held by a TryAcquire of
// hook.slow (busyThenReject keeps it 1 s), then waits for that acquire,
// releases its lock and lets c settle: what fn queues for node 2 meanwhile
// goes there in one pipeline.
func whileBusy(t *testing.T, c *redlock.Client, hook *busyThenReject, fn func()) {
	t.Helper()
	ctx := context.Background()
	var x *redlock.Lock
	var wg sync.WaitGroup
	wg.Go(func() { x, _ = c.TryAcquire(ctx, []string{hook.slow}, time.Minute) })
	waitFor(t, "node 2 busy with "+hook.slow, hook.busy.Load)
	fn()
	wg.Wait()
	if x != nil {
		_ = x.Release(ctx)
	}
	waitSettled(t, c)
}

// busyThenReject is a go-redis hook that holds a command or pipeline on
// key slow for 1 s, and answers the first acquire of key reject within a pipeline
// without running it: its SET NX GET as a server before 7.0 does, or with
// noscript its script with NOSCRIPT. shared records that a later command
// of that pipeline names the key too.
type busyThenReject struct {
	slow, reject string
	noscript     bool
	busy         atomic.Bool
	rejected     atomic.Bool
	shared       atomic.Bool
}

func (h *busyThenReject) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *busyThenReject) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[1] == h.slow && h.busy.CompareAndSwap(false, true) {
			time.Sleep(time.Second)
		}
		return next(ctx, cmd)
	}
}

// target reports whether a is the command to reject: SET of the reject
// key, or with noscript a script call on it.
func (h *busyThenReject) target(a []any) bool {
	if h.noscript {
		return len(a) > 3 && (a[0] == "evalsha" || a[0] == "eval") && a[3] == h.reject
	}
	return a[0] == "set" && a[1] == h.reject
}

// fake returns the command sent instead of c, which fails as a server
// that rejects c would, and the step that gives c its reply.
func (h *busyThenReject) fake(ctx context.Context, c *redis.Cmd) (redis.Cmder, func()) {
	reply := "return redis.error_reply('ERR syntax error')"
	if h.noscript {
		reply = "return redis.error_reply('NOSCRIPT No matching script. Please use EVAL.')"
	}
	fake := redis.NewCmd(ctx, "eval", reply, 0)
	return fake, func() { c.SetVal(fake.Val()); c.SetErr(fake.Err()) }
}

func (h *busyThenReject) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if a := cmd.Args(); len(a) > 1 && a[1] == h.slow && h.busy.CompareAndSwap(false, true) {
				time.Sleep(time.Second)
			}
		}
		send := slices.Clone(cmds)
		var after func()
		for i, cmd := range cmds {
			if !h.target(cmd.Args()) || !h.rejected.CompareAndSwap(false, true) {
				continue
			}
			if c, ok := cmd.(*redis.Cmd); ok {
				send[i], after = h.fake(ctx, c)
			}
			for _, later := range cmds[i+1:] {
				if slices.Contains(later.Args(), any(h.reject)) {
					h.shared.Store(true)
				}
			}
		}
		err := next(ctx, send)
		if after != nil {
			after()
		}
		return err
	}
}

// cmdStat returns the field (calls, rejected_calls, ...) of cmdstat_<name>
// in INFO commandstats output, 0 when absent.
func cmdStat(info, name, field string) int {
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
	}
	return 0
}
