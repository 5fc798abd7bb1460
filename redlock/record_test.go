package redlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestRecordOutlivesTheLock: a record is written with the lock in one
// round, refuses later acquisitions (and says so in NodeResult.Resource)
// until its own TTL ends, and is neither released nor extended with the
// lock.
func TestRecordOutlivesTheLock(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	// The record's TTL is long enough for a loaded machine to get through
	// the checks below before it ends.
	const recordTTL = 2 * time.Second
	start := time.Now()
	l, err := c.TryAcquire(ctx, []string{"run"}, 5*time.Second, redlock.WithRecord("tick:1", recordTTL),
		redlock.WithMetadata("a"))
	must(t, err)
	must(t, l.Extend(ctx, 10*time.Second))
	waitSettled(t, c) // both returned at a quorum: the last node too
	for i, s := range cl {
		if p := s.Client(t).PTTL(ctx, "tick:1").Val(); p <= 0 || p > recordTTL {
			t.Errorf("node %d: record PTTL %v after Extend, want its own TTL (<= %v)", i, p, recordTTL)
		}
	}
	must(t, l.Release(ctx))
	for i, s := range cl {
		if n := s.Client(t).Exists(ctx, "tick:1").Val(); n != 1 {
			t.Errorf("node %d: record gone after Release", i)
		}
	}
	// The lock's resource is free; the record still refuses, first.
	_, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithRecord("tick:1", time.Second))
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Count(redlock.OutcomeHeld) < 2 {
		t.Fatalf("acquire with the same record: %v, want held on a quorum", err)
	}
	for _, r := range qerr.Nodes {
		if r.Outcome == redlock.OutcomeHeld && (r.Resource != "tick:1" || r.Holder != "a") {
			t.Errorf("node %d: refused by %q (holder %q), want the record tick:1 of holder a", r.Node, r.Resource, r.Holder)
		}
	}
	// Another record passes, and the record expires on its own.
	l2, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithRecord("tick:2", time.Second))
	must(t, err)
	_ = l2.Release(ctx)
	for i, s := range cl {
		for s.Client(t).Exists(ctx, "tick:1").Val() == 1 {
			if time.Since(start) > recordTTL+5*time.Second {
				t.Fatalf("node %d: record still there %v after it was written with TTL %v", i, time.Since(start), recordTTL)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithRecord("tick:1", time.Second)); err != nil {
		t.Fatalf("acquire after the record expired: %v", err)
	}
}

// TestRecordRefusedByHeldResource: a round refused by a held resource
// writes no record anywhere, and names the resource.
func TestRecordRefusedByHeldResource(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	_, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithRecord("tick:1", time.Second))
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) {
		t.Fatalf("err %v, want a *QuorumError", err)
	}
	if qerr.Count(redlock.OutcomeHeld) < 2 {
		t.Fatalf("err %v, want held on a quorum", err)
	}
	for _, r := range qerr.Nodes {
		if r.Outcome == redlock.OutcomeHeld && r.Resource != "run" {
			t.Errorf("node %d: %v by %q, want held by run", r.Node, r.Outcome, r.Resource)
		}
	}
	for i, s := range cl {
		if n := s.Client(t).Exists(ctx, "tick:1").Val(); n != 0 {
			t.Errorf("node %d: a refused round wrote its record", i)
		}
	}
}

// TestRecordUndoneWithAFailedAttempt: an attempt that wins only a minority
// of nodes deletes its record there with its lock keys, so the record
// does not outlive an acquisition that never happened.
func TestRecordUndoneWithAFailedAttempt(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	// Another holder has "run" on nodes 1 and 2: only node 0 grants.
	for _, s := range cl[1:] {
		if err := s.Client(t).Set(ctx, "run", "someone else's lock value.........", 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithRecord("tick:1", 5*time.Second)); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("err %v, want ErrNotAcquired", err)
	}
	waitSettled(t, c)
	if keys := cl[0].Keys(t); len(keys) != 0 {
		t.Errorf("node 0 keeps %q after the undo", keys)
	}
}

// TestRecordInvalid: bad records are ErrInvalidArgument, named.
func TestRecordInvalid(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	for name, opts := range map[string][]redlock.LockOption{
		"empty":        {redlock.WithRecord("", time.Second)},
		"nul":          {redlock.WithRecord("a\x00b", time.Second)},
		"a resource":   {redlock.WithRecord("run", time.Second)},
		"ttl":          {redlock.WithRecord("rec", 0)},
		"with owner":   {redlock.WithRecord("rec", time.Second), redlock.WithOwner("o")},
		"negative ttl": {redlock.WithRecord("rec", -time.Second)},
	} {
		if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, opts...); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("%s: err %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestNodeTimeoutPerCall: WithNodeTimeout given to a call sets the node
// timeout of that Lock's rounds (acquire, extend, release), not the
// Client's.
func TestNodeTimeoutPerCall(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	for _, p := range proxies {
		p.SetLatency(60 * time.Millisecond) // each way: 120 ms a round trip
	}
	c := newClient(t, nodes, redlock.WithNodeTimeout(50*time.Millisecond))
	ctx := context.Background()
	if _, err := c.TryAcquire(ctx, []string{"short"}, time.Second); !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("with the Client's 50ms node timeout: %v, want ErrUnavailable", err)
	}
	// 3 s: the first call's timed-out commands closed their connections,
	// and its undo goes first on each node, so this call may wait for two
	// dials through the slow links (about 3 round trips each) and its own
	// round trip: about 900 ms, and more on a loaded machine.
	l, err := c.TryAcquire(ctx, []string{"long"}, 5*time.Second, redlock.WithNodeTimeout(3*time.Second))
	if err != nil {
		t.Fatalf("with a 3s node timeout for the call: %v", err)
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Errorf("Extend of that Lock: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release of that Lock: %v", err)
	}
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithNodeTimeout(0)); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("WithNodeTimeout(0) on a call: %v, want ErrInvalidArgument", err)
	}
}

// TestLostTryAcquireSendsNoNeedlessUndo: a TryAcquire refused by a quorum
// waits for the last node's answer, so that it undoes nothing where every
// node refused (a fleet's losers each sent an undo to the node that had not
// answered yet when the round was decided).
func TestLostTryAcquireSendsNoNeedlessUndo(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	holder := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := holder.TryAcquire(ctx, []string{"r"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	nodes, proxies := cl.ProxiedClients(t)
	proxies[2].SetLatency(30 * time.Millisecond) // answers last
	h := &scriptHook{}
	for _, n := range nodes {
		n.(*redis.Client).AddHook(h)
	}
	// A node timeout well above the slow node's answer time, also on a
	// loaded machine: a node that timed out is rightly sent an undo.
	c := newClient(t, nodes, redlock.WithNodeTimeout(2*time.Second))
	// Warm up: connections dialled through the slow link.
	_, _ = c.TryAcquire(ctx, []string{"r"}, time.Second)
	waitSettled(t, c)
	h.n.Store(0)
	for range 5 {
		if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held resource: %v", err)
		}
	}
	waitSettled(t, c)
	if n := h.n.Load(); n != 5*3 {
		t.Errorf("5 refused TryAcquires sent %d commands, want 15 (no undo)", n)
	}
	// Patient rounds (WithPatientRounds: package scheduler's losers,
	// which stop after a refusal) settle too, also with a node that is
	// down and in a retry, which otherwise does not wait for it.
	h.n.Store(0)
	twice := redlock.WithRetryIf(func(n int, _ *redlock.QuorumError) bool {
		redlock.MarkDown(c, 2) // as after a call that timed out there
		return n < 2
	})
	for range 5 {
		if _, err := c.Acquire(ctx, []string{"r"}, time.Second, twice, redlock.WithPatientRounds(),
			redlock.WithReleaseNotices(false), redlock.WithRetry(constantRetry(time.Millisecond))); !errors.Is(err, redlock.ErrNotAcquired) {
			t.Fatalf("Acquire of a held resource: %v", err)
		}
	}
	waitSettled(t, c)
	if n := h.n.Load(); n != 5*2*3 {
		t.Errorf("5 patient Acquires refused in 2 rounds each sent %d commands, want 30 (no undo)", n)
	}
}

// scriptHook counts the scripts and SET commands sent (not go-redis's
// connection set-up).
type scriptHook struct{ n atomic.Int32 }

func (h *scriptHook) count(cmd redis.Cmder) {
	switch cmd.Name() {
	case "eval", "evalsha", "set":
		h.n.Add(1)
	}
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}
