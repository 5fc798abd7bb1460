package redlock_test

// Close with frozen nodes: its bound (ctx + one go-redis read timeout)
// and concurrent calls, against real redis-server nodes (issue 17, item 4;
// found by an adversarial review).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestCloseWithSubscriberConnectingToFrozenNode: a waiting Acquire's
// release-notice subscriber for a frozen node is still connecting (HELLO
// read) when Close is called: Close returns within ctx + one read timeout.
// It took 2-4 read timeouts: the subscriber started receiving (and
// reconnecting) after Close, and the node senders were stopped only after
// the subscribers, retrying their reads meanwhile.
func TestCloseWithSubscriberConnectingToFrozenNode(t *testing.T) {
	for _, ctxTimeout := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "ContextTimeoutEnabled"}[ctxTimeout], func(t *testing.T) {
			testCloseWithSubscriberConnecting(t, ctxTimeout)
		})
	}
}

func testCloseWithSubscriberConnecting(t *testing.T, ctxTimeout bool) {
	verifyNoLeaks(t)
	const readTimeout = time.Second
	cl := redlocktest.Start(t, 3)
	nodes := readTimeoutClients(t, cl, readTimeout, ctxTimeout)
	holder, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	ctx := context.Background()
	if _, err := holder.TryAcquire(ctx, []string{"r"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	w, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	closeDuringWait(t, w, 50*time.Millisecond, readTimeout) // first round refused by 0,1; subscribers start
}

// closeDuringWait starts an Acquire of "r" (held by another Client) on w,
// waits settle for its first round to be refused and its release-notice
// subscribers to start, then closes w with a 100 ms ctx: Close returns
// within that ctx + one read timeout, and the Acquire within 5 s after.
func closeDuringWait(t *testing.T, w *redlock.Client, settle, readTimeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	defer acancel()
	done := make(chan error, 1)
	go func() { _, err := w.Acquire(actx, []string{"r"}, 10*time.Second); done <- err }()
	time.Sleep(settle)
	const grace = 100 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	start := time.Now()
	err := w.Close(cctx)
	took := time.Since(start)
	t.Logf("Close = %v after %v", err, took)
	if took > grace+readTimeout+300*time.Millisecond {
		t.Errorf("Close returned after %v; want within ctx (%v) + one read timeout (%v)", took, grace, readTimeout)
	}
	select {
	case err := <-done:
		t.Logf("Acquire = %v", err)
	case <-time.After(5 * time.Second):
		t.Errorf("Acquire still running 5s after Close")
	}
}

// TestConcurrentCloseHonoursItsOwnCtx: a second Close with a short ctx,
// called while a first Close(context.Background()) drains releases queued
// for a frozen node, returns within its ctx + one read timeout, with ctx's
// error. It waited for the first (5 s) and returned nil.
func TestConcurrentCloseHonoursItsOwnCtx(t *testing.T) {
	verifyNoLeaks(t)
	const readTimeout = 500 * time.Millisecond
	cl := redlocktest.Start(t, 3)
	nodes := readTimeoutClients(t, cl, readTimeout, false)
	c, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var locks []*redlock.Lock
	for i := range 4 {
		l, err := c.TryAcquire(ctx, []string{fmt.Sprint("r", i)}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	waitSettled(t, c)
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	for _, l := range locks {
		if err := l.Release(ctx); err != nil { // quorum of 0,1; node 2's calls queue up
			t.Fatal(err)
		}
	}
	first := make(chan error, 1)
	go func() { first <- c.Close(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	const grace = 100 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	start := time.Now()
	err = c.Close(cctx)
	took := time.Since(start)
	t.Logf("second Close = %v after %v", err, took)
	if took > grace+readTimeout*3/2 {
		t.Errorf("second Close returned after %v; want within its ctx (%v) + one read timeout (%v)", took, grace, readTimeout)
	}
	if err == nil && took > grace {
		t.Errorf("second Close returned nil after its ctx ended (%v)", took)
	}
	t.Logf("first Close = %v after %v", <-first, time.Since(start))
}

// TestCloseUnderLoadFrozenNode: many goroutines acquire and release
// (pipelines to every node) while node 2 is frozen; three Close calls with
// the same short ctx race; every call must return within ctx + one read
// timeout, later calls get ErrClosed and nothing leaks or panics.
func TestCloseUnderLoadFrozenNode(t *testing.T) {
	for _, ctxTimeout := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "ContextTimeoutEnabled"}[ctxTimeout], func(t *testing.T) {
			verifyNoLeaks(t)
			const readTimeout = time.Second
			cl := redlocktest.Start(t, 3)
			nodes := readTimeoutClients(t, cl, readTimeout, ctxTimeout)
			c, err := redlock.New(nodes, redlock.WithReleaseNotices(false))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						l, err := c.TryAcquire(ctx, []string{fmt.Sprint("r", g, "-", i%4)}, 5*time.Second)
						if err == nil {
							_ = l.Release(ctx)
						} else if errors.Is(err, redlock.ErrClosed) {
							return
						}
					}
				})
			}
			time.Sleep(200 * time.Millisecond)
			cl[2].Stop(t)
			defer cl[2].Cont(t)
			time.Sleep(300 * time.Millisecond)
			const grace = 100 * time.Millisecond
			cctx, cancel := context.WithTimeout(ctx, grace)
			defer cancel()
			start := time.Now()
			var cw sync.WaitGroup
			for range 3 {
				cw.Go(func() {
					err := c.Close(cctx)
					took := time.Since(start)
					t.Logf("Close = %v after %v", err, took)
					if took > grace+readTimeout*3/2 {
						t.Errorf("Close returned after %v; want within ctx (%v) + one read timeout (%v)", took, grace, readTimeout)
					}
				})
			}
			cw.Wait()
			close(stop)
			wg.Wait()
			if _, err := c.TryAcquire(ctx, []string{"x"}, time.Second); !errors.Is(err, redlock.ErrClosed) {
				t.Errorf("TryAcquire after Close = %v", err)
			}
			if _, _, err := c.HolderMetadata(ctx, "x"); !errors.Is(err, redlock.ErrClosed) {
				t.Errorf("HolderMetadata after Close = %v", err)
			}
			if err := c.Wait(ctx); err != nil {
				t.Errorf("Wait after Close = %v", err)
			}
		})
	}
}

// TestCallsQueuedWhenCloseGivesUpAreErrClosed: a round whose calls were
// still queued behind a frozen node's when Close gave up fails with
// ErrClosed, not ErrUnavailable: the nodes did not fail, Close dropped the
// calls. They were counted as node failures.
func TestCallsQueuedWhenCloseGivesUpAreErrClosed(t *testing.T) {
	const readTimeout = time.Second
	cl := redlocktest.Start(t, 3)
	c, err := redlock.New(readTimeoutClients(t, cl, readTimeout, false))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cl[1].Stop(t)
	defer cl[1].Cont(t)
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	// Nodes 1 and 2 read this round's calls until the read timeout.
	if _, err := c.TryAcquire(ctx, []string{"a"}, 10*time.Second); !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("TryAcquire with 2 of 3 nodes frozen = %v, want ErrUnavailable", err)
	}
	done := make(chan error, 1)
	go func() { // its calls to nodes 1 and 2 queue behind those
		_, err := c.TryAcquire(ctx, []string{"b"}, 10*time.Second, redlock.WithNodeTimeout(10*time.Second))
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := c.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want DeadlineExceeded (it gave up on the queued calls)", err)
	}
	err = <-done
	if !errors.Is(err, redlock.ErrClosed) || errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("TryAcquire whose calls Close dropped = %v, want ErrClosed and not ErrUnavailable", err)
	}
	t.Logf("TryAcquire = %v", err)
}

// TestCloseWithSubscriberDialingAnUnreachableNode: a waiting Acquire's
// release-notice subscriber is still dialing a node whose host drops
// packets (the dial would last go-redis's DialTimeout) when Close is
// called: Close returns within its ctx + one read timeout. The dial ran
// on a context Close could not end, so Close waited the DialTimeout
// (found by an adversarial helper).
func TestCloseWithSubscriberDialingAnUnreachableNode(t *testing.T) {
	verifyNoLeaks(t)
	const readTimeout = time.Second
	const dialTimeout = 5 * time.Second
	cl := redlocktest.Start(t, 3)
	nodes := readTimeoutClients(t, cl, readTimeout, false)
	holder := newClient(t, nodes)
	ctx := context.Background()
	if _, err := holder.TryAcquire(ctx, []string{"r"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, holder)
	// Node 2's client can run commands on its first connection, but every
	// later dial (the subscriber's) hangs until DialTimeout or its ctx ends.
	var dials atomic.Int32
	unreachable := redis.NewClient(&redis.Options{Addr: cl[2].Addr(), ReadTimeout: readTimeout, DialTimeout: dialTimeout,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) == 1 {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
			select {
			case <-time.After(dialTimeout):
				return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}})
	t.Cleanup(func() { _ = unreachable.Close() })
	if err := unreachable.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	w, err := redlock.New([]redis.UniversalClient{nodes[0], nodes[1], unreachable})
	if err != nil {
		t.Fatal(err)
	}
	closeDuringWait(t, w, 300*time.Millisecond, readTimeout) // refused; the subscribers dial
	t.Logf("%d dials of node 2", dials.Load())
}
