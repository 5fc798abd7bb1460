package redlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestHighWaterFirstLosersAskOneNode: contenders for the same mark, one
// after the other: the first wins on every node, every later one is
// refused by the mark on the node asked first and asks no other; the
// refusal names the winner as a quorum's would, and matches neither
// ErrUnavailable nor anything but ErrNotAcquired.
func TestHighWaterFirstLosersAskOneNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	nodes, hooks := countedClients(t, cl)
	c := newClient(t, nodes)
	first := redlock.FirstAsked(c, "job")
	l, err := c.TryAcquire(ctx, []string{"job"}, 10*time.Second, redlock.WithMetadata("winner"),
		redlock.WithHighWaterFirst("taken", 100, time.Minute))
	must(t, err)
	defer l.Release(ctx)
	waitSettled(t, c)
	if got := counts(hooks); !slices.Equal(got, []int32{1, 1, 1}) {
		t.Fatalf("commands per node after the winner %v, want one each", got)
	}
	for i, at := range []int64{100, 99} { // the same mark, and an earlier one
		_, err := c.TryAcquire(ctx, []string{"job"}, 10*time.Second, redlock.WithHighWaterFirst("taken", at, time.Minute))
		var q *redlock.QuorumError
		if !errors.As(err, &q) || !errors.Is(err, redlock.ErrNotAcquired) || errors.Is(err, redlock.ErrUnavailable) {
			t.Fatalf("loser %d: %v; want a *QuorumError matching ErrNotAcquired only", i, err)
		}
		if md, ok := q.HolderMetadata(); !ok || md != "winner" {
			t.Errorf("loser %d: HolderMetadata() = %q, %v; want the winner's", i, md, ok)
		}
		if r := q.Nodes[first]; r.Outcome != redlock.OutcomeHeld || r.HolderMark != 100 || r.Resource != "taken" {
			t.Errorf("loser %d: node %d asked first: %+v; want refused by mark 100 of taken", i, first, r)
		}
		for j, r := range q.Nodes {
			if j != first && r.Outcome != redlock.OutcomePending {
				t.Errorf("loser %d: node %d: %v, want pending (not asked)", i, j, r.Outcome)
			}
		}
		if !strings.Contains(err.Error(), "not asked") {
			t.Errorf("loser %d: error %q does not say the other nodes were not asked", i, err)
		}
	}
	waitSettled(t, c)
	want := []int32{1, 1, 1}
	want[first] += 2
	if got := counts(hooks); !slices.Equal(got, want) {
		t.Errorf("commands per node after two losers %v, want %v (one each on the node asked first, no undo)", got, want)
	}
}

// TestHighWaterFirstAsksTheRest: on any answer of the node asked first
// but a refusal by the mark (another's lock key there, a killed node, a
// silent node: the hedge), the round asks the others and is granted by
// them.
func TestHighWaterFirstAsksTheRest(t *testing.T) {
	for _, fault := range []string{"lock key", "killed", "stopped", "known down"} {
		t.Run(fault, func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			ctx := context.Background()
			c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
			first := redlock.FirstAsked(c, "job")
			switch fault {
			case "lock key": // as an earlier failed attempt of another's left it
				must(t, cl[first].Client(t).Set(ctx, "job", "someone else's", 10*time.Second).Err())
			case "killed":
				cl[first].Kill(t)
			case "stopped", "known down":
				cl[first].Stop(t)
				defer cl[first].Cont(t)
				if fault == "known down" {
					redlock.MarkDown(c, first)
				}
			}
			start := time.Now()
			l, err := c.TryAcquire(ctx, []string{"job"}, 20*time.Second, redlock.WithHighWaterFirst("taken", 7, time.Minute))
			if err != nil {
				t.Fatalf("node %d asked first (%s): %v; want granted by the other two", first, fault, err)
			}
			if d := time.Since(start); fault == "known down" && d > time.Second {
				t.Errorf("with the node asked first known down, the round took %v; want every node asked at once, not the hedge at 1s", d)
			}
			if fault == "stopped" || fault == "known down" {
				cl[first].Cont(t)
			}
			must(t, l.Release(ctx))
		})
	}
}

// TestHighWaterFirstExclusionAndOneRunPerMark: contenders on three
// clients race for each of a run of marks at the same instant; each mark
// is granted to exactly one of them, and no two hold the lock at once.
func TestHighWaterFirstExclusionAndOneRunPerMark(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	clients := make([]*redlock.Client, 3)
	for i := range clients {
		clients[i] = newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
	}
	const marks, contenders = 40, 6
	var holding atomic.Int32
	wins := make([]atomic.Int32, marks+1)
	for m := 1; m <= marks; m++ {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for w := range contenders {
			wg.Go(func() {
				<-start
				l, err := clients[w%3].Acquire(ctx, []string{"job"}, 5*time.Second,
					redlock.WithHighWaterFirst("taken", int64(m), time.Minute), redlock.WithReleaseNotices(false),
					redlock.WithRetryIf(func(_ int, q *redlock.QuorumError) bool {
						_, held := q.HolderMetadata()
						return !held
					}))
				if err != nil {
					if !errors.Is(err, redlock.ErrNotAcquired) {
						t.Errorf("mark %d: %v", m, err)
					}
					return
				}
				if holding.Add(1) > 1 {
					t.Errorf("mark %d: two holders at once", m)
				}
				wins[m].Add(1)
				time.Sleep(time.Millisecond)
				holding.Add(-1)
				must(t, l.Release(ctx))
			})
		}
		close(start)
		wg.Wait()
		if n := wins[m].Load(); n != 1 {
			t.Errorf("mark %d granted %d times, want once", m, n)
		}
	}
}

// TestHighWaterFirstRetryAsksTheRest: a mark on the node asked first
// alone (a failed attempt's, not undone yet) ends a call's first round,
// but not its retry: Acquire's second round asks the others after that
// node's refusal and is granted by them.
func TestHighWaterFirstRetryAsksTheRest(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	nodes := cl.Clients(t)
	c := newClient(t, nodes)
	first := redlock.FirstAsked(c, "job")
	alone := newClient(t, nodes[first:first+1])
	stale, err := alone.TryAcquire(ctx, []string{"job"}, 10*time.Second, redlock.WithHighWater("taken", 5, time.Minute))
	must(t, err)
	_, err = c.TryAcquire(ctx, []string{"job"}, 10*time.Second, redlock.WithHighWaterFirst("taken", 5, time.Minute))
	if !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("first round against the mark on node %d: %v, want refused there", first, err)
	}
	must(t, stale.Release(ctx)) // its lock key goes; its mark stays
	var rounds []int
	l, err := c.Acquire(ctx, []string{"job"}, 10*time.Second, redlock.WithHighWaterFirst("taken", 5, time.Minute),
		redlock.WithReleaseNotices(false), redlock.WithRetryIf(func(n int, _ *redlock.QuorumError) bool {
			rounds = append(rounds, n)
			return n < 2
		}))
	if err != nil {
		t.Fatalf("Acquire with a retry: %v; want the retry granted by the two nodes without the mark", err)
	}
	defer l.Release(ctx)
	if !slices.Equal(rounds, []int{1}) {
		t.Errorf("retry condition called after rounds %v, want after the first only", rounds)
	}
}

// TestHighWaterFirstWithOtherOrders: WithHighWaterFirst's order replaces
// WithQuorumFirst's (a loser sends one command), and WithHighWater given
// after it turns it off (a loser asks every node), as their docs say.
func TestHighWaterFirstWithOtherOrders(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	nodes, hooks := countedClients(t, cl)
	c := newClient(t, nodes, redlock.WithQuorumFirst())
	l, err := c.TryAcquire(ctx, []string{"job"}, 10*time.Second, redlock.WithHighWater("taken", 1, time.Minute))
	must(t, err)
	defer l.Release(ctx)
	sum := func() (n int32) {
		waitSettled(t, c)
		for _, k := range counts(hooks) {
			n += k
		}
		return n
	}
	for _, tc := range []struct {
		name string
		opts []redlock.LockOption
		want int32
	}{
		{"WithHighWaterFirst over New's WithQuorumFirst", []redlock.LockOption{redlock.WithHighWaterFirst("taken", 1, time.Minute)}, 1},
		{"WithHighWater after WithHighWaterFirst", []redlock.LockOption{redlock.WithHighWaterFirst("taken", 1, time.Minute),
			redlock.WithHighWater("taken", 1, time.Minute), redlock.WithQuorumFirst()}, 2},
		{"WithHighWaterFirst after WithHighWater", []redlock.LockOption{redlock.WithHighWater("taken", 1, time.Minute),
			redlock.WithHighWaterFirst("taken", 1, time.Minute)}, 1},
	} {
		before := sum()
		if _, err := c.TryAcquire(ctx, []string{"job"}, time.Second, tc.opts...); !errors.Is(err, redlock.ErrNotAcquired) {
			t.Fatalf("%s: %v, want refused", tc.name, err)
		}
		if got := sum() - before; got != tc.want {
			t.Errorf("%s: the refused round sent %d commands, want %d", tc.name, got, tc.want)
		}
	}
}
