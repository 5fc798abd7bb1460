package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// ctxTimeoutClient returns a client of s that applies context deadlines to
// its I/O (ContextTimeoutEnabled), with the given read timeout, closed
// when t ends.
func ctxTimeoutClient(t *testing.T, s *redlocktest.Server, readTimeout time.Duration) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, ReadTimeout: readTimeout})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// workerHook counts the commands go-redis processes, and those of them
// processed in a node's worker goroutine (redlock.(*node).drain on the
// stack) rather than in the caller's.
type workerHook struct{ calls, inWorker atomic.Int32 }

func (h *workerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *workerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count()
		return next(ctx, cmd)
	}
}

func (h *workerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count()
		return next(ctx, cmds)
	}
}

func (h *workerHook) count() {
	buf := make([]byte, 16<<10)
	buf = buf[:runtime.Stack(buf, false)]
	h.calls.Add(1)
	if strings.Contains(string(buf), "redlock.(*node).drain") {
		h.inWorker.Add(1)
	}
}

// TestInlineSendOnOneNode: on a Client of one node whose client applies
// context deadlines, a round on the idle node is sent from the caller's
// goroutine (node.sendInline); with go-redis defaults it goes through the
// node's worker, which bounds the wait for a frozen node.
func TestInlineSendOnOneNode(t *testing.T) {
	verifyNoLeaks(t)
	s := redlocktest.StartServer(t)
	for _, tc := range []struct {
		name       string
		ctxTimeout bool
	}{{"ContextTimeoutEnabled", true}, {"defaults", false}} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: tc.ctxTimeout})
			t.Cleanup(func() { _ = rdb.Close() })
			h := &workerHook{}
			rdb.AddHook(h)
			c := newClient(t, []redis.UniversalClient{rdb})
			ctx := context.Background()
			for range 5 {
				l, err := c.TryAcquire(ctx, []string{"r-" + tc.name}, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitSettled(t, c)
			calls, inWorker := h.calls.Load(), h.inWorker.Load()
			if calls < 10 {
				t.Fatalf("the hook saw %d commands for 5 acquire+release, want at least 10", calls)
			}
			if want := map[bool]int32{true: 0, false: calls}[tc.ctxTimeout]; inWorker != want {
				t.Errorf("%d of %d commands sent from a node worker, want %d", inWorker, calls, want)
			}
		})
	}
}

// TestInlineNodeUnderConcurrency: rounds that queue while a caller sends
// inline go to a worker afterwards, in order: locks on distinct keys all
// succeed, one shared key is never held twice, nothing is left behind.
func TestInlineNodeUnderConcurrency(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 1)
	// A generous node timeout: this test is about the handover, and under
	// -race on a loaded machine a round may take more than 100 ms.
	c := newClient(t, []redis.UniversalClient{ctxTimeoutClient(t, cl[0], 0)}, redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	const workers, cycles = 16, 40
	var holders, overlaps, shared atomic.Int32
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			own := []string{fmt.Sprint("own-", w)}
			for range cycles {
				l, err := c.TryAcquire(ctx, own, 5*time.Second)
				if err != nil {
					errs <- fmt.Errorf("TryAcquire %v: %w", own, err)
					return
				}
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("Release %v: %w", own, err)
					return
				}
				l, err = c.TryAcquire(ctx, []string{"shared"}, 5*time.Second)
				if errors.Is(err, redlock.ErrNotAcquired) && !errors.Is(err, redlock.ErrUnavailable) {
					continue // held by another worker
				}
				if err != nil {
					errs <- fmt.Errorf("TryAcquire shared: %w", err)
					return
				}
				if holders.Add(1) > 1 {
					overlaps.Add(1)
				}
				shared.Add(1)
				holders.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("Release shared: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("the shared lock was held twice at once %d times", n)
	}
	if shared.Load() == 0 {
		t.Error("no worker ever got the shared lock: the test tests nothing")
	}
	waitSettled(t, c)
	if keys := cl[0].Keys(t); len(keys) != 0 {
		t.Errorf("keys left after every lock was released: %q", keys)
	}
}

// TestInlineStoppedNodeIsBoundedByNodeTimeout: a caller that sends inline
// to a frozen node (SIGSTOP) returns at the round's deadline, as go-redis
// applies it to the socket; the read timeout of one minute never comes
// into play.
func TestInlineStoppedNodeIsBoundedByNodeTimeout(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	const nodeTimeout = 200 * time.Millisecond
	c := newClient(t, []redis.UniversalClient{ctxTimeoutClient(t, cl[0], time.Minute)}, redlock.WithNodeTimeout(nodeTimeout))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"warm-up"}, time.Second) // a connection in the pool
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cl[0].Stop(t)
	defer cl[0].Cont(t)

	start := time.Now()
	_, err = c.TryAcquire(ctx, []string{"r"}, time.Second)
	took := time.Since(start)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("TryAcquire on a stopped node = %v, want a *QuorumError matching ErrUnavailable", err)
	}
	if got := qerr.Nodes[0].Outcome; got != redlock.OutcomeTimeout {
		t.Errorf("node outcome = %v, want %v", got, redlock.OutcomeTimeout)
	}
	// A hang detector, not a timing claim: without the deadline on the
	// socket the call would wait for the one-minute read timeout.
	if bound := nodeTimeout + 10*time.Second; took > bound {
		t.Errorf("TryAcquire on a stopped node took %v, want well under the read timeout (bound %v)", took, bound)
	}
}

// TestInlineDoAndWaitingAcquire: on one node sent inline, Do keeps its lock
// past the TTL by extending it from its own goroutine, a rival's TryAcquire
// never wins meanwhile, and a waiting Acquire of another Client gets the
// lock once Do has released it.
func TestInlineDoAndWaitingAcquire(t *testing.T) {
	verifyNoLeaks(t)
	cl := redlocktest.Start(t, 1)
	c := newClient(t, []redis.UniversalClient{ctxTimeoutClient(t, cl[0], 0)})
	rival := newClient(t, []redis.UniversalClient{ctxTimeoutClient(t, cl[0], 0)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 300 * time.Millisecond
	var rivalWins, rivalTries int
	waiterGot := make(chan error, 1)
	var doneAt time.Time
	err := c.Do(ctx, []string{"r"}, ttl, func(runCtx context.Context) error {
		go func() { // on the test's ctx: Do's ends when fn returns
			l, err := rival.Acquire(ctx, []string{"r"}, ttl)
			if err == nil {
				err = l.Release(context.Background())
			}
			waiterGot <- err
		}()
		var err error
		if rivalWins, rivalTries, err = rivalTryAcquire(runCtx, rival, "r", ttl, 3*ttl); err == nil {
			doneAt = time.Now()
		}
		return err
	})
	if err != nil {
		t.Fatalf("Do = %v, want nil", err)
	}
	if rivalWins != 0 || rivalTries < 10 {
		t.Errorf("rival won %d of %d tries while Do ran 3x TTL, want 0 of many", rivalWins, rivalTries)
	}
	if err := <-waiterGot; err != nil {
		t.Errorf("waiting Acquire: %v, want the lock after Do", err)
	}
	if doneAt.IsZero() {
		t.Error("Do's function did not run to its end")
	}
	waitSettled(t, c)
	waitSettled(t, rival)
	if keys := cl[0].Keys(t); len(keys) != 0 {
		t.Errorf("keys left: %q", keys)
	}
}

// TestInlineRoundEndsAtNodeTimeoutInPoolWait: a round sent from the
// caller's goroutine ends at the node timeout also while go-redis waits
// for a pool slot, a wait that watches the context's Done channel, not its
// deadline: the round's context closes Done at its deadline from before
// the call is sent. (Before, its timer was started after the inline call
// returned, and the wait ran to go-redis's PoolTimeout, here a minute.)
func TestInlineRoundEndsAtNodeTimeoutInPoolWait(t *testing.T) {
	s := redlocktest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true,
		PoolSize: 1, PoolTimeout: time.Minute})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(100*time.Millisecond))
	conn := rdb.Conn() // the pool's only connection, held until the end
	if err := conn.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(context.Background(), []string{"r"}, time.Second)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * time.Second): // 200 node timeouts
		_ = conn.Close()
		<-done
		t.Fatal("TryAcquire waited for a pool slot past the node timeout")
	}
	_ = conn.Close()
	var qerr *redlock.QuorumError
	if !errors.Is(err, redlock.ErrUnavailable) || !errors.As(err, &qerr) || qerr.Nodes[0].Outcome != redlock.OutcomeTimeout {
		t.Errorf("TryAcquire = %v; want ErrUnavailable with node 0 timed out", err)
	}
}
