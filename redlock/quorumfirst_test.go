package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// countedClients returns clients of cl's nodes with a scriptHook each.
func countedClients(t *testing.T, cl redlocktest.Cluster) ([]redis.UniversalClient, []*scriptHook) {
	nodes := cl.Clients(t)
	hooks := make([]*scriptHook, len(nodes))
	for i, n := range nodes {
		hooks[i] = &scriptHook{}
		n.(*redis.Client).AddHook(hooks[i])
	}
	return nodes, hooks
}

// counts returns each hook's count.
func counts(hooks []*scriptHook) []int32 {
	n := make([]int32, len(hooks))
	for i, h := range hooks {
		n[i] = h.n.Load()
	}
	return n
}

// lastAsked returns the node that a round with WithQuorumFirst asks last
// for resource on 3 nodes.
func lastAsked(c *redlock.Client, resource string) int {
	return slices.Index(redlock.AskedFirst(c, resource), false)
}

func TestQuorumFirstLoserAsksAQuorumOnly(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	holder := newClient(t, cl.Clients(t))
	l, err := holder.TryAcquire(ctx, []string{"r"}, 10*time.Second, redlock.WithMetadata("holder"))
	must(t, err)
	defer l.Release(ctx)
	nodes, hooks := countedClients(t, cl)
	c := newClient(t, nodes)
	last := lastAsked(c, "r")
	for range 5 {
		_, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithQuorumFirst())
		var q *redlock.QuorumError
		if !errors.As(err, &q) || !errors.Is(err, redlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held resource: %v", err)
		}
		if md, ok := q.HolderMetadata(); !ok || md != "holder" {
			t.Errorf("HolderMetadata() = %q, %v; want the holder", md, ok)
		}
		if r := q.Nodes[last]; r.Outcome != redlock.OutcomePending || !strings.Contains(err.Error(), "not asked") {
			t.Errorf("node %d, asked last: %v; error %q, want pending and said not asked", last, r.Outcome, err)
		}
	}
	// And so does a patient Acquire stopped by its retry condition, as
	// package scheduler's losers are.
	stop := redlock.WithRetryIf(func(int, *redlock.QuorumError) bool { return false })
	for range 5 {
		if _, err := c.Acquire(ctx, []string{"r"}, time.Second, stop, redlock.WithQuorumFirst(), redlock.WithPatientRounds(),
			redlock.WithReleaseNotices(false)); !errors.Is(err, redlock.ErrNotAcquired) {
			t.Fatalf("Acquire of a held resource: %v", err)
		}
	}
	waitSettled(t, c)
	got := counts(hooks)
	for i, n := range got {
		if want := int32(10); i == last {
			want = 0
			if n != want {
				t.Errorf("node %d (asked last) got %d commands from 10 lost rounds, want %d", i, n, want)
			}
		} else if n != want {
			t.Errorf("node %d (asked first) got %d commands from 10 lost rounds, want %d (no undo)", i, n, want)
		}
	}
}

func TestQuorumFirstWinnerHoldsEveryNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	nodes, hooks := countedClients(t, cl)
	c := newClient(t, nodes)
	l, err := c.Acquire(ctx, []string{"r"}, 10*time.Second, redlock.WithQuorumFirst())
	must(t, err)
	waitSettled(t, c)
	for i, keys := range cl.Keys(t) {
		if !slices.Contains(keys, "r") {
			t.Errorf("node %d keys %q after a quorum-first grant; want the lock key on every node", i, keys)
		}
	}
	must(t, l.Release(ctx))
	waitSettled(t, c)
	for i, keys := range cl.Keys(t) {
		if len(keys) != 0 {
			t.Errorf("node %d keys %q after Release, want none", i, keys)
		}
	}
	if got := counts(hooks); !slices.Equal(got, []int32{2, 2, 2}) {
		t.Errorf("commands per node %v, want one acquire and one release each", got)
	}
}

func TestQuorumFirstAsksTheRestWhenTheFirstSplit(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	nodes, hooks := countedClients(t, cl)
	c := newClient(t, nodes)
	// Another's key on one of the nodes asked first, as a contender's
	// minority left it.
	first := slices.Index(redlock.AskedFirst(c, "r"), true)
	must(t, cl[first].Client(t).Set(ctx, "r", "someone else's", 10*time.Second).Err())
	l, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second, redlock.WithQuorumFirst())
	must(t, err)
	defer l.Release(ctx)
	waitSettled(t, c)
	if got := counts(hooks); !slices.Equal(got, []int32{1, 1, 1}) {
		t.Errorf("commands per node %v, want one acquire each", got)
	}
}

func TestQuorumFirstAsksTheRestWhenAFirstNodeFails(t *testing.T) {
	for _, fault := range []string{"killed", "stopped"} {
		t.Run(fault, func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			ctx := context.Background()
			c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
			first := slices.Index(redlock.AskedFirst(c, "r"), true)
			if fault == "killed" {
				cl[first].Kill(t) // refuses connections: an error at once
			} else {
				// Silent: the hedge asks the third node at half the node
				// timeout, which leaves it the other half to answer.
				cl[first].Stop(t)
				defer cl[first].Cont(t)
			}
			l, err := c.TryAcquire(ctx, []string{"r"}, 20*time.Second, redlock.WithQuorumFirst())
			if err != nil {
				t.Fatalf("TryAcquire with node %d %s: %v; want granted by the other two", first, fault, err)
			}
			if fault == "stopped" {
				cl[first].Cont(t)
			}
			must(t, l.Release(ctx))
		})
	}
}

// TestQuorumFirstHedge: a node asked first is silent and the other
// refused; the hedge asks the third node at half the node timeout, so the
// round hears it within the node timeout.
func TestQuorumFirstHedge(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
	asked := redlock.AskedFirst(c, "r")
	silent, refusing, last := slices.Index(asked, true), slices.Index(asked[1:], true)+1, lastAsked(c, "r")
	if silent == refusing {
		refusing = slices.Index(asked[silent+1:], true) + silent + 1
	}
	must(t, cl[refusing].Client(t).Set(ctx, "r", "someone else's", 10*time.Second).Err())
	cl[silent].Stop(t)
	defer cl[silent].Cont(t)
	_, err := c.TryAcquire(ctx, []string{"r"}, 20*time.Second, redlock.WithQuorumFirst())
	var q *redlock.QuorumError
	if !errors.As(err, &q) {
		t.Fatalf("TryAcquire: %v, want a *QuorumError", err)
	}
	if r := q.Nodes[last]; r.Outcome != redlock.OutcomeOK {
		t.Errorf("node %d, asked last: %v (%v); want it asked by the hedge and granted (then undone): %v", last, r.Outcome, r.Err, err)
	}
	if !q.HolderUnknown() {
		t.Errorf("HolderUnknown() = false, want true: %v", err)
	}
}

// TestQuorumFirstExclusion runs contenders with and without
// WithQuorumFirst on the same resources and checks that no two hold one
// at once, each holder seeing the keys of its own value on a quorum.
func TestQuorumFirstExclusion(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	clients := make([]*redlock.Client, 3)
	for i := range clients {
		clients[i] = newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
	}
	var holders [4]atomic.Int32
	var granted atomic.Int32
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			for i := range 40 {
				res := fmt.Sprintf("r%d", i%len(holders))
				opts := []redlock.LockOption{redlock.WithRetry(constantRetry(time.Millisecond)), redlock.WithPatientRounds()}
				if w%2 == 0 {
					opts = append(opts, redlock.WithQuorumFirst())
				}
				actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				l, err := c.Acquire(actx, []string{res}, 2*time.Second, opts...)
				cancel()
				if err != nil {
					continue
				}
				h := &holders[i%len(holders)]
				if n := h.Add(1); n != 1 {
					t.Errorf("%d holders of %s at once", n, res)
				}
				granted.Add(1)
				time.Sleep(time.Millisecond)
				h.Add(-1)
				_ = l.Release(ctx) // a failed Release leaves keys to their TTL: not exclusion's concern
			}
		}()
	}
	wg.Wait()
	if granted.Load() == 0 {
		t.Fatal("no contender ever held a lock")
	}
}
