package redlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestAttack7HighWaterFirstMixedExclusionUnderFaults: contenders mixing
// one-node-first rounds (WithHighWaterFirst), broadcast rounds with the
// same mark (WithHighWater) and plain rounds on the same resource race
// for a mark that moves on every 25 ms, while the node asked first is
// frozen (SIGSTOP, longer than a node timeout, then thawed), another
// node is killed, losing its data, and restarted behind the restart gate,
// and the third is frozen in turn: a grant never comes while another
// holder's validity has not ended, and no mark is granted twice. It held
// (attack7).
func TestAttack7HighWaterFirstMixedExclusionUnderFaults(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	gate := 2 * time.Second
	for _, s := range cl { // the nodes have voted for longer than the gate
		must(t, s.Client(t).Set(ctx, "\x00restart-gate", "0", 0).Err())
	}
	opts := []redlock.Option{redlock.WithNodeTimeout(150 * time.Millisecond), redlock.WithRestartGating(gate)}
	clients := []*redlock.Client{
		newClient(t, readTimeoutClients(t, cl, 0, true), opts...),
		newClient(t, readTimeoutClients(t, cl, time.Second, false), opts...),
		newClient(t, readTimeoutClients(t, cl, 0, true), opts...),
	}
	first := redlock.FirstAsked(clients[0], "job")
	others := []int{(first + 1) % 3, (first + 2) % 3}
	begin := time.Now()
	mark := func() int64 { return int64(time.Since(begin)/(25*time.Millisecond)) + 1 }

	var mu sync.Mutex
	var holder *redlock.Lock
	var until time.Time
	wins := map[int64]int{}
	var granted, byFirst atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 9 {
		wg.Go(func() {
			c := clients[w%len(clients)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				m := mark()
				lopts := []redlock.LockOption{redlock.WithRetry(constantRetry(5 * time.Millisecond)), redlock.WithReleaseNotices(false)}
				switch w % 4 {
				case 0, 2:
					lopts = append(lopts, redlock.WithHighWaterFirst("taken", m, time.Minute))
				case 1:
					lopts = append(lopts, redlock.WithHighWater("taken", m, time.Minute))
				}
				actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				l, err := c.Acquire(actx, []string{"job"}, time.Second, lopts...)
				cancel()
				if err != nil {
					if !errors.Is(err, redlock.ErrNotAcquired) {
						t.Errorf("worker %d: %v, want an error matching ErrNotAcquired", w, err)
					}
					continue
				}
				mu.Lock()
				if holder != nil && time.Now().Before(until) {
					t.Errorf("granted to worker %d while another holder is valid for %v more", w, time.Until(until))
				}
				holder, until = l, l.Until()
				if w%4 != 3 {
					if wins[m]++; wins[m] > 1 {
						t.Errorf("mark %d granted %d times", m, wins[m])
					}
				}
				mu.Unlock()
				granted.Add(1)
				if w%2 == 0 {
					byFirst.Add(1)
				}
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				if holder == l {
					holder = nil
				}
				mu.Unlock()
				_ = l.Release(ctx)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	cl[first].Stop(t)
	time.Sleep(400 * time.Millisecond)
	cl[others[0]].Kill(t)
	time.Sleep(200 * time.Millisecond)
	cl[first].Cont(t)
	time.Sleep(300 * time.Millisecond)
	cl[others[0]].Restart(t)
	cl[others[1]].Stop(t)
	time.Sleep(400 * time.Millisecond)
	cl[others[1]].Cont(t)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if granted.Load() == 0 {
		t.Fatal("no contender ever held the lock")
	}
	t.Logf("%d grants (%d one node first), %d marks", granted.Load(), byFirst.Load(), len(wins))
}

// TestAttack7CloseBeforeTheHedge: Client.Close while a one-node-first
// round waits for its frozen first node, before its hedge (half the node
// timeout) fires: the call ends with ErrClosed (never a grant, never
// ErrUnavailable), the hedge that fires later asks nothing, and no key
// is left on the two nodes never asked. goleak (TestMain) finds no
// goroutine left. It held (attack7).
func TestAttack7CloseBeforeTheHedge(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	c, err := redlock.New(readTimeoutClients(t, cl, 0, true), redlock.WithNodeTimeout(time.Second))
	must(t, err)
	first := redlock.FirstAsked(c, "job")
	cl[first].Stop(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(ctx, []string{"job"}, 10*time.Second, redlock.WithHighWaterFirst("taken", 1, time.Minute))
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- c.Close(cctx) }()
	time.Sleep(700 * time.Millisecond) // past the hedge at 500 ms
	cl[first].Cont(t)
	if err := <-done; err == nil || !errors.Is(err, redlock.ErrClosed) || errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("TryAcquire cut by Close: %v; want ErrClosed, not ErrUnavailable", err)
	}
	<-closed
	for i, keys := range cl.Keys(t) {
		if i != first && len(keys) != 0 {
			t.Errorf("node %d, never asked, has keys %q", i, keys)
		}
	}
}
