package redlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/schedlock/schedlock/redlock"
)

// TestRetryIfStopsAcquire: the retry condition sees each failed round and
// its QuorumError, and ends Acquire when it says so, with that round's
// error.
func TestRetryIfStopsAcquire(t *testing.T) {
	c, held, _ := heldOnMiniNodes(t, redlock.WithMetadata("holder"))
	ctx := context.Background()
	defer held.Release(ctx)
	var rounds []int
	_, err := c.Acquire(ctx, []string{"r"}, time.Minute, redlock.WithRetryIf(func(n int, q *redlock.QuorumError) bool {
		rounds = append(rounds, n)
		if md, ok := q.HolderMetadata(); !ok || md != "holder" {
			t.Errorf("round %d: holder %q, %v; want \"holder\"", n, md, ok)
		}
		return n < 3
	}))
	var q *redlock.QuorumError
	switch {
	case !errors.Is(err, redlock.ErrNotAcquired) || !errors.As(err, &q):
		t.Fatalf("err = %v; want ErrNotAcquired with a *QuorumError", err)
	case !strings.Contains(err.Error(), "the retry condition (WithRetryIf) stopped it") || !strings.Contains(err.Error(), "after 3 attempts"):
		t.Errorf("err = %q; want it to say the retry condition stopped it after 3 attempts", err)
	case len(rounds) != 3 || rounds[0] != 1 || rounds[2] != 3:
		t.Errorf("condition called for rounds %v; want [1 2 3]", rounds)
	}
}

// TestRetryIfCanClearTheWay: a condition that returns true lets the retry
// policy go on, and may do I/O first (here: the holder releases).
func TestRetryIfCanClearTheWay(t *testing.T) {
	c, held, _ := heldOnMiniNodes(t)
	ctx := context.Background()
	calls := 0
	l, err := c.Acquire(ctx, []string{"r"}, time.Minute, redlock.WithRetryIf(func(n int, _ *redlock.QuorumError) bool {
		calls++
		return held.Release(ctx) == nil
	}))
	if err != nil {
		t.Fatalf("Acquire after the holder released: %v", err)
	}
	defer l.Release(ctx)
	if calls != 1 {
		t.Errorf("condition called %d times; want 1", calls)
	}
}

// TestMetadataFuncIsReadEachAttempt: each attempt writes the metadata f
// gives at its start; the Lock reports the granted attempt's, and a result
// over MaxMetadata ends the call with ErrInvalidArgument.
func TestMetadataFuncIsReadEachAttempt(t *testing.T) {
	c, held, _ := heldOnMiniNodes(t)
	ctx := context.Background()
	n := 0
	next := func() string { n++; return "attempt-" + strconv.Itoa(n) }
	l, err := c.Acquire(ctx, []string{"r"}, time.Minute, redlock.WithMetadata("static"), redlock.WithMetadataFunc(next),
		redlock.WithRetryIf(func(int, *redlock.QuorumError) bool { return held.Release(ctx) == nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	md, ok, err := c.HolderMetadata(ctx, "r")
	if err != nil || !ok || md != "attempt-2" || l.Metadata() != "attempt-2" {
		t.Errorf("holder metadata %q (%v, %v), Lock.Metadata %q; want attempt-2 (the granted attempt's)", md, ok, err, l.Metadata())
	}

	long := func() string { return strings.Repeat("x", redlock.MaxMetadata+1) }
	_, err = c.Acquire(ctx, []string{"s"}, time.Minute, redlock.WithMetadataFunc(long))
	if !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "WithMetadataFunc") {
		t.Errorf("too long metadata: err = %v; want ErrInvalidArgument naming WithMetadataFunc", err)
	}
	if _, held, _ := c.HolderMetadata(ctx, "s"); held {
		t.Error("an attempt with too long metadata was sent")
	}
}

// TestReleaseNoticesOffForOneCall: an Acquire given WithReleaseNotices(false)
// marks no holder's key, so the holder's release publishes nothing for it;
// one with notices on marks it.
func TestReleaseNoticesOffForOneCall(t *testing.T) {
	c, held, ms := heldOnMiniNodes(t)
	ctx := context.Background()
	defer held.Release(ctx)
	waitSettled(t, c) // every node has the holder's key
	before, _ := ms[0].Get("r")
	once := redlock.WithRetryIf(func(int, *redlock.QuorumError) bool { return false })
	if _, err := c.Acquire(ctx, []string{"r"}, time.Minute, once, redlock.WithReleaseNotices(false)); err == nil {
		t.Fatal("acquired a held lock")
	}
	waitSettled(t, c) // the round returned at a quorum: node 0's call may still be on its way
	if after, _ := ms[0].Get("r"); after != before {
		t.Errorf("notices off: the holder's value changed from %q to %q (marked for a notice)", before, after)
	}
	if _, err := c.Acquire(ctx, []string{"r"}, time.Minute, once); err == nil {
		t.Fatal("acquired a held lock")
	}
	waitSettled(t, c)
	if after, _ := ms[0].Get("r"); after == before {
		t.Error("notices on: the holder's value was not marked for a notice; the test above proves nothing")
	}
}

// heldOnMiniNodes returns a Client on 3 miniredis nodes that retries every
// millisecond, and a Lock of resource "r" acquired with opts (1 min TTL).
func heldOnMiniNodes(t *testing.T, opts ...redlock.LockOption) (*redlock.Client, *redlock.Lock, []*miniredis.Miniredis) {
	t.Helper()
	ms, nodes := miniNodes(t, 3)
	c, err := redlock.New(nodes, redlock.WithRetry(constantRetry(time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	held, err := c.Acquire(context.Background(), []string{"r"}, time.Minute, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, held, ms
}
