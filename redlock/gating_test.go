package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// overlapAfterEmptyRestart builds the redis.io "delayed restarts" hazard: A
// holds the lock on nodes 0 and 1 only (node 2 was frozen during its
// acquisition), then node 0 restarts without its data. It returns B's
// attempt on the same resource.
func overlapAfterEmptyRestart(t *testing.T, cl redlocktest.Cluster, opts ...redlock.Option) error {
	t.Helper()
	a := newClient(t, cl.Clients(t), opts...)
	b := newClient(t, cl.Clients(t), opts...)
	ctx := context.Background()
	cl[2].Stop(t)
	l, err := a.TryAcquire(ctx, []string{"r"}, 2*time.Second)
	if err != nil {
		t.Fatalf("A: %v", err)
	}
	defer l.Release(ctx)
	cl[2].Cont(t)
	// A's queued call may still land on node 2 (or fail: its EVAL fallback
	// runs past its deadline); delete any key it left, as if A's cleanup
	// had won.
	time.Sleep(100 * time.Millisecond)
	if err := cl[2].Client(t).Del(ctx, "r").Err(); err != nil {
		t.Fatal(err)
	}
	cl[0].Kill(t)
	cl[0].Restart(t)
	_, err = b.TryAcquire(ctx, []string{"r"}, 2*time.Second)
	return err
}

func TestEmptyRestartWithoutGatingAllowsOverlap(t *testing.T) {
	// Negative control: the hazard is real.
	cl := redlocktest.Start(t, 3)
	if err := overlapAfterEmptyRestart(t, cl); err != nil {
		t.Fatalf("B = %v; without gating B should (wrongly) get the lock A holds", err)
	}
}

func TestRestartGatingPreventsOverlap(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	const gate = 2 * time.Second
	arm := newClient(t, cl.Clients(t), redlock.WithRestartGating(gate))
	// Fresh nodes are gated too: the first acquisition waits the gate.
	_, err := arm.TryAcquire(context.Background(), []string{"warmup"}, gate)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Count(redlock.OutcomeGated) < 2 || !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("first acquisition on fresh gated nodes = %v; want gated nodes (at least 2), ErrUnavailable", err)
	}
	time.Sleep(gate + 100*time.Millisecond)

	err = overlapAfterEmptyRestart(t, cl, redlock.WithRestartGating(gate))
	if !errors.As(err, &qerr) {
		t.Fatalf("B after node 0 restarted empty = %v; want refused", err)
	}
	if qerr.Nodes[0].Outcome != redlock.OutcomeGated {
		t.Errorf("node 0 outcome = %v, want gated", qerr.Nodes[0].Outcome)
	}
}

func TestRestartGatingWithAppendOnlyDoesNotGate(t *testing.T) {
	cl := redlocktest.Start(t, 3, redlocktest.WithAppendOnlyFsyncAlways())
	const gate = 500 * time.Millisecond
	c := newClient(t, cl.Clients(t), redlock.WithRestartGating(gate))
	ctx := context.Background()
	_, _ = c.TryAcquire(ctx, []string{"warmup"}, gate) // arms the markers
	time.Sleep(gate + 100*time.Millisecond)
	cl[0].Kill(t)
	cl[0].Restart(t)
	l, err := c.TryAcquire(ctx, []string{"r"}, gate)
	if err != nil {
		t.Fatalf("TryAcquire after an AOF restart = %v; the marker survived, no gate expected", err)
	}
	_ = l.Release(ctx)
}

func TestRestartGatingRejectsLongerTTLs(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	c := newClient(t, cl.Clients(t), redlock.WithRestartGating(time.Second))
	if _, err := c.TryAcquire(context.Background(), []string{"r"}, 2*time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("TTL above the gate = %v, want ErrInvalidArgument", err)
	}
}
