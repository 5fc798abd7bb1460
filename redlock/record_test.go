package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
	l, err := c.TryAcquire(ctx, []string{"run"}, 5*time.Second, redlock.WithRecord("tick:1", 400*time.Millisecond),
		redlock.WithMetadata("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for i, s := range cl {
		if p := s.Client(t).PTTL(ctx, "tick:1").Val(); p <= 0 || p > 400*time.Millisecond {
			t.Errorf("node %d: record PTTL %v after Extend, want its own TTL (<= 400ms)", i, p)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	_ = l2.Release(ctx)
	time.Sleep(450 * time.Millisecond)
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
	if _, err := redlock.New(cl.Clients(t), redlock.WithRecord("rec", time.Second)); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("New(WithRecord): err %v, want ErrInvalidArgument", err)
	}
}
