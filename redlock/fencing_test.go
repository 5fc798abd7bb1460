package redlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestFencingTokensIncreaseAcrossHandoffsAndARestart: 200 handoffs between
// 4 clients while a node is killed and restarted: once with appendonly +
// fsync always (the node comes back with its keys), once without
// persistence but with restart gating (the node comes back empty and stays
// out of quorums for the maximum TTL).
func TestFencingTokensIncreaseAcrossHandoffsAndARestart(t *testing.T) {
	t.Run("appendonly", func(t *testing.T) {
		cl := redlocktest.Start(t, 3, redlocktest.WithAppendOnlyFsyncAlways())
		fencedHandoffs(t, cl)
	})
	t.Run("restart gating", func(t *testing.T) {
		cl := redlocktest.Start(t, 3)
		gate := redlock.WithRestartGating(time.Second)
		// Arm the gate markers, and let them age past the gate.
		_, _ = newClient(t, cl.Clients(t), gate).TryAcquire(context.Background(), []string{"arm"}, time.Second)
		time.Sleep(1100 * time.Millisecond)
		fencedHandoffs(t, cl, gate)
	})
}

func fencedHandoffs(t *testing.T, cl redlocktest.Cluster, opts ...redlock.Option) {
	const clients, handoffs = 4, 200
	var cs []*redlock.Client
	for range clients {
		cs = append(cs, newClient(t, cl.Clients(t), append(opts, redlock.WithFencing(true), redlock.WithRetry(fastRetry))...))
	}
	ctx := context.Background()
	var mu sync.Mutex // guards tokens, appended in the order holders acquire
	var tokens []uint64
	var wg sync.WaitGroup
	per := handoffs / clients
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				l, err := c.Acquire(actx, []string{"fenced"}, time.Second)
				cancel()
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				mu.Lock()
				tokens = append(tokens, l.FencingToken())
				mu.Unlock()
				// While node 1 is down, a lock held on it and one other
				// node cannot confirm a quorum release: that is
				// ErrUnavailable, not a failure of the test.
				if err := l.Release(ctx); err != nil && !errors.Is(err, redlock.ErrUnavailable) {
					t.Errorf("client %d: Release: %v", i, err)
				}
			}
		}()
	}
	// Kill one node in the middle and restart it empty.
	for {
		mu.Lock()
		n := len(tokens)
		mu.Unlock()
		if n >= handoffs/2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cl[1].Kill(t)
	time.Sleep(50 * time.Millisecond)
	cl[1].Restart(t)
	wg.Wait()
	if len(tokens) != handoffs {
		t.Fatalf("%d handoffs, want %d", len(tokens), handoffs)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("token %d = %d after %d: not strictly increasing", i, tokens[i], tokens[i-1])
		}
	}
	if tokens[0] == 0 {
		t.Error("first token is 0 with fencing on")
	}
}

func TestConcurrentFencedAttemptsNeverShareAToken(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	seen := map[uint64]int{}
	var mu sync.Mutex
	for round := range 30 {
		var wg sync.WaitGroup
		for range 8 {
			c := newClient(t, cl.Clients(t), redlock.WithFencing(true))
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := c.TryAcquire(ctx, []string{"race"}, time.Second)
				if err != nil {
					return
				}
				mu.Lock()
				seen[l.FencingToken()]++
				mu.Unlock()
				_ = l.Release(ctx)
			}()
		}
		wg.Wait()
		_ = round
	}
	for tok, n := range seen {
		if n > 1 {
			t.Errorf("token %d handed out %d times", tok, n)
		}
	}
	if len(seen) == 0 {
		t.Error("no attempt won in 30 rounds")
	}
}

func TestFencingCountersExpire(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithFencing(true), redlock.WithFencingRetention(2*time.Second))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	waitSettled(t, c) // the fence round, like Release, returns on a quorum
	for i, s := range cl {
		ttl := s.Client(t).PTTL(ctx, "r\x00fencing").Val()
		if ttl <= 0 || ttl > 2*time.Second {
			t.Errorf("node %d: fencing counter PTTL = %v, want the 2s retention", i, ttl)
		}
	}
}

// TestHolderUnknownWithAFailedNode: Holder answers ErrUnavailable, not
// "not held", when a failed node could complete a quorum for the lock the
// others report: node 0 holds it, node 1 lost its key, node 2 (which holds
// it too) is stopped. It answered not held before, and elector.Leader no
// leader, while the lock held on 2 of 3 nodes. With no lock reported by the
// answering nodes, one failed node leaves the answer known: not held.
func TestHolderUnknownWithAFailedNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, nodes, redlock.WithNodeTimeout(200*time.Millisecond))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, redlock.WithMetadata("a"))
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	if err := nodes[1].Del(ctx, "r").Err(); err != nil {
		t.Fatal(err)
	}
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	if md, held, err := c.HolderMetadata(ctx, "r"); held || !errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("Holder with node 2 stopped = %q, %v, %v; want ErrUnavailable (node 2 may complete the quorum)", md, held, err)
	}
	cl[2].Cont(t)
	if md, held, err := c.HolderMetadata(ctx, "r"); err != nil || !held || md != "a" {
		t.Errorf("Holder with node 2 back = %q, %v, %v; want a, true, nil", md, held, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	cl[2].Stop(t)
	if md, held, err := c.HolderMetadata(ctx, "r"); held || err != nil {
		t.Errorf("Holder of a free resource with node 2 stopped = %q, %v, %v; want not held, nil", md, held, err)
	}
	cl[2].Cont(t)
}

func TestMetadataAndHolder(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	if _, held, err := c.HolderMetadata(ctx, "r"); held || err != nil {
		t.Fatalf("Holder of a free resource = %v, %v; want not held", held, err)
	}
	l, err := c.TryAcquire(ctx, []string{"r"}, 5*time.Second, redlock.WithMetadata("instance-a"))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Metadata(); got != "instance-a" {
		t.Errorf("Metadata() = %q", got)
	}
	md, held, err := c.HolderMetadata(ctx, "r")
	if err != nil || !held || md != "instance-a" {
		t.Errorf("Holder = %q, %v, %v; want instance-a, true, nil", md, held, err)
	}
	_, err = c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithMetadata("instance-b"))
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) {
		t.Fatalf("contended TryAcquire = %v", err)
	}
	if h, ok := qerr.HolderMetadata(); !ok || h != "instance-a" {
		t.Errorf("QuorumError.Holder() = %q, %v; want instance-a", h, ok)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, redlock.MaxMetadata+1)
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithMetadata(string(big))); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("oversized metadata = %v, want ErrInvalidArgument", err)
	}
}
