package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestHighWaterRefusesAtOrBelow: a mark refuses every later acquisition at
// or below it, also after the lock is released, names itself and its mark
// in the refusal, and a granted acquisition above it reports the mark it
// replaced.
func TestHighWaterRefusesAtOrBelow(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, 5*time.Second, redlock.WithHighWater("mark", 100, time.Minute),
		redlock.WithMetadata("a"))
	must(t, err)
	if got := l.PreviousMark(); got != 0 {
		t.Errorf("PreviousMark of the first raise = %d, want 0", got)
	}
	must(t, l.Release(ctx))
	for _, at := range []int64{100, 50} {
		_, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("mark", at, time.Minute))
		checkRefusedByMark(t, at, err)
	}
	l, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("mark", 101, time.Minute))
	if err != nil {
		t.Fatalf("acquire above the mark: %v", err)
	}
	if got := l.PreviousMark(); got != 100 {
		t.Errorf("PreviousMark = %d, want 100", got)
	}
	// The lock's own keys refuse a higher mark while it is held; the mark
	// does not move then.
	_, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("mark", 200, time.Minute))
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Nodes[0].Resource != "run" {
		t.Fatalf("acquire of a held lock with a higher mark: %v, want refused by the lock key", err)
	}
	if at101 := marksAt(t, cl, "101", "200"); at101 < 2 {
		t.Errorf("the mark is 101 on %d nodes after a refused raise, want a quorum", at101)
	}
	_ = l.Release(ctx)
}

// checkRefusedByMark fails the test unless err, of an acquisition at at
// below the mark 100 that "a" raised, is a refusal by that mark on a
// quorum. The first acquisition's call to the third node may still be on
// its way (another connection), so that node may grant and undo.
func checkRefusedByMark(t *testing.T, at int64, err error) {
	t.Helper()
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Count(redlock.OutcomeHeld) < 2 || errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("acquire at %d below the mark 100: %v, want held on a quorum", at, err)
	}
	for _, r := range qerr.Nodes {
		if r.Outcome == redlock.OutcomeHeld && (r.Resource != "mark" || r.Holder != "a" || r.HolderMark != 100 || r.HolderTTL <= 0) {
			t.Errorf("at %d, node %d: refused by %q (holder %q, mark %d, TTL %v), want the mark 100 of a with a TTL",
				at, r.Node, r.Resource, r.Holder, r.HolderMark, r.HolderTTL)
		}
	}
}

// marksAt returns on how many nodes of cl the mark "mark" is want, and
// fails the test for each node where it is never.
func marksAt(t *testing.T, cl redlocktest.Cluster, want, never string) int {
	t.Helper()
	n := 0
	for i, s := range cl {
		switch m := s.Client(t).HGet(context.Background(), "mark", "m").Val(); m {
		case want:
			n++
		case never:
			t.Errorf("node %d: mark %s after a refused raise", i, never)
		}
	}
	return n
}

// TestHighWaterUndoPutsTheMarkBack: an attempt that raised the mark on a
// minority of nodes puts back the mark before its own there, so that a
// failed attempt takes nothing.
func TestHighWaterUndoPutsTheMarkBack(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, 5*time.Second, redlock.WithHighWater("mark", 100, time.Minute),
		redlock.WithMetadata("a"))
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	// Another owner holds "run" on nodes 0 and 1: the raise to 200 is
	// granted on node 2 alone and undone there.
	for _, s := range cl[:2] {
		s.Client(t).Set(ctx, "run", "ffffffffffffffffffffffffffffffff-other", time.Minute)
	}
	if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("mark", 200, time.Minute)); err == nil {
		t.Fatal("acquired with 2 of 3 nodes held by another owner")
	}
	deadline := time.Now().Add(5 * time.Second)
	for cl[2].Client(t).HGet(ctx, "mark", "m").Val() != "100" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if m := cl[2].Client(t).HGet(ctx, "mark", "m").Val(); m != "100" {
		t.Fatalf("node 2: mark %q after the undo, want 100 put back", m)
	}
	for _, s := range cl[:2] {
		s.Client(t).Del(ctx, "run")
	}
	l, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("mark", 200, time.Minute))
	if err != nil {
		t.Fatalf("acquire at 200 after the undo: %v", err)
	}
	if got := l.PreviousMark(); got != 100 {
		t.Errorf("PreviousMark = %d, want 100", got)
	}
	_ = l.Release(ctx)
}

// TestHighWaterFirstUndoDeletes: the undo of the first raise deletes the
// mark.
func TestHighWaterFirstUndoDeletes(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	for _, s := range cl[:2] {
		s.Client(t).Set(ctx, "run", "ffffffffffffffffffffffffffffffff-other", time.Minute)
	}
	if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("mark", 5, time.Minute)); err == nil {
		t.Fatal("acquired with 2 of 3 nodes held by another owner")
	}
	deadline := time.Now().Add(5 * time.Second)
	for cl[2].Client(t).Exists(ctx, "mark").Val() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := cl[2].Client(t).Exists(ctx, "mark").Val(); n != 0 {
		t.Fatal("node 2: the mark of an undone first raise is still there")
	}
}

// TestHighWaterArguments: bad marks are rejected before any I/O.
func TestHighWaterArguments(t *testing.T) {
	nodes := redlocktest.Start(t, 1).Clients(t)
	c := newClient(t, nodes)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []redlock.LockOption
	}{
		{"empty name", []redlock.LockOption{redlock.WithHighWater("", 1, time.Second)}},
		{"a resource", []redlock.LockOption{redlock.WithHighWater("run", 1, time.Second)}},
		{"the record", []redlock.LockOption{redlock.WithRecord("r", time.Second), redlock.WithHighWater("r", 1, time.Second)}},
		{"zero mark", []redlock.LockOption{redlock.WithHighWater("m", 0, time.Second)}},
		// Lua reads 2^53 and 2^53+1 as the same double: the second would be
		// refused by the first although it is higher.
		{"mark above 2^53", []redlock.LockOption{redlock.WithHighWater("m", 1<<53+1, time.Second)}},
		{"first, mark above 2^53", []redlock.LockOption{redlock.WithHighWaterFirst("m", 1<<53+1, time.Second)}},
		{"no TTL", []redlock.LockOption{redlock.WithHighWater("m", 1, 0)}},
		{"with an owner", []redlock.LockOption{redlock.WithOwner("o"), redlock.WithHighWater("m", 1, time.Second)}},
	} {
		if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, tc.opts...); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

// TestHighWaterAt2To53: the highest mark WithHighWater takes, 2^53, is
// taken, refuses itself, and is exact on the nodes (PreviousMark).
func TestHighWaterAt2To53(t *testing.T) {
	c := newClient(t, redlocktest.Start(t, 3).Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("m", 1<<53-1, time.Minute))
	must(t, err)
	must(t, l.Release(ctx))
	l, err = c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("m", 1<<53, time.Minute))
	must(t, err)
	if got := l.PreviousMark(); got != 1<<53-1 {
		t.Errorf("PreviousMark = %d, want %d", got, int64(1<<53-1))
	}
	must(t, l.Release(ctx))
	if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second, redlock.WithHighWater("m", 1<<53, time.Minute)); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("the same mark again: %v, want ErrNotAcquired", err)
	}
}

// TestEvalRunsOnEveryNode: Eval runs a script on every node with the
// Client's key prefix, returns each node's reply in node order once a
// quorum answered, and says ErrUnavailable, with the replies, when fewer
// than a quorum answered.
func TestEvalRunsOnEveryNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithKeyPrefix("p:"))
	ctx := context.Background()
	push := redlock.NewScript(`redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('LLEN', KEYS[1])`)
	replies, err := c.Eval(ctx, push, []string{"list"}, "x")
	must(t, err)
	answered := 0
	for i, r := range replies {
		if r.Node != i || r.Err == nil && r.Val != int64(1) {
			t.Errorf("reply %d = %+v, want node %d, 1", i, r, i)
		}
		if r.Err == nil {
			answered++
		}
	}
	if answered < 2 {
		t.Errorf("%d replies, want a quorum", answered)
	}
	waitListLen(t, cl, "p:list", 1) // the call to a node not waited for still goes out
	cl[1].Kill(t)
	cl[2].Kill(t)
	replies, err = c.Eval(ctx, push, []string{"list"}, "y")
	if !errors.Is(err, redlock.ErrUnavailable) || len(replies) != 3 || replies[0].Val != int64(2) || replies[1].Err == nil {
		t.Errorf("Eval with 2 of 3 nodes down = %+v, %v; want node 0's reply and ErrUnavailable", replies, err)
	}
	if _, err := c.Eval(ctx, nil, nil); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Eval of a nil script: %v, want ErrInvalidArgument", err)
	}
}

// TestReleaseAbandonedDeletesOnlyItsMetadata: ReleaseAbandoned deletes a
// lock whose metadata is exactly the one given, and no other.
func TestReleaseAbandonedDeletesOnlyItsMetadata(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, 10*time.Second, redlock.WithMetadata("me@1/n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, md := range []string{"me@1", "me@1/n/x", "other"} {
		if n, err := c.ReleaseAbandoned(ctx, "run", md, ""); n != 0 || err != nil {
			t.Errorf("ReleaseAbandoned(%q) = %d, %v; want 0, nil", md, n, err)
		}
	}
	if n, err := c.ReleaseAbandoned(ctx, "run", "me@1/n", ""); n < 2 || err != nil {
		t.Errorf("ReleaseAbandoned of the lock's metadata = %d, %v; want a quorum", n, err)
	}
	if _, err := c.TryAcquire(ctx, []string{"run"}, time.Second); err != nil {
		t.Errorf("acquire after ReleaseAbandoned: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Release of the abandoned lock: %v, want ErrLockLost", err)
	}
	if _, err := c.ReleaseAbandoned(ctx, "run", "", ""); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("ReleaseAbandoned with no metadata: %v, want ErrInvalidArgument", err)
	}
}

// TestReleaseAbandonedLeavesReentrantLocks: ReleaseAbandoned deletes
// plain locks only, as its doc says. It deleted a WithOwner lock's key and
// left the holds beside it, a state no script expects (found by the
// attacker pass on issue 32).
func TestReleaseAbandonedLeavesReentrantLocks(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, 10*time.Second, redlock.WithOwner("o"), redlock.WithMetadata("me@1/n"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.ReleaseAbandoned(ctx, "run", "me@1/n", ""); n != 0 || err != nil {
		t.Errorf("ReleaseAbandoned of a reentrant lock = %d, %v; want 0, nil (plain locks only)", n, err)
	}
	waitSettled(t, c)
	for i, keys := range cl.Keys(t) {
		if !slices.Contains(keys, "run") {
			t.Errorf("node %d keys %q: the reentrant lock's key was deleted", i, keys)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("the owner's Release: %v", err)
	}
	waitSettled(t, c)
	for i, keys := range cl.Keys(t) {
		if len(keys) != 0 {
			t.Errorf("node %d keys %q after the owner's Release, want none", i, keys)
		}
	}
}

// TestReleaseLogWritesBesideTheRelease: WithReleaseLog pushes its entries
// in the release's own script on each node, keeps the list's newest
// entries and sets its TTL; bad arguments send nothing.
func TestReleaseLogWritesBesideTheRelease(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	for round := range 3 {
		l, err := c.TryAcquire(ctx, []string{"run"}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx, redlock.WithReleaseLog("log", 2, time.Minute, fmt.Sprint("a", round), fmt.Sprint("b", round))); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range cl {
		// Release returns at a quorum: a node's script may come later.
		deadline := time.Now().Add(5 * time.Second)
		for s.Client(t).LIndex(ctx, "log", 0).Val() != "b2" && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := s.Client(t).LRange(ctx, "log", 0, -1).Val(); len(got) != 2 || got[0] != "b2" || got[1] != "a2" {
			t.Errorf("node %d: log %q, want the newest two entries [b2 a2]", i, got)
		}
		if ttl := s.Client(t).PTTL(ctx, "log").Val(); ttl <= 0 || ttl > time.Minute {
			t.Errorf("node %d: log TTL %v, want up to 1m", i, ttl)
		}
		if n := s.Client(t).Exists(ctx, "run").Val(); n != 0 {
			t.Errorf("node %d: the lock is still there", i)
		}
	}
	badReleaseLogs(t, c)
}

// TestReleaseLogOnAnotherKeyKeepsTheLock: a release log whose list name
// holds another type of value (another key has its name) fails the
// Release before it deletes anything, as a misconfiguration that names
// the cause, so that its error is true: the lock is kept (the push used to
// fail with WRONGTYPE after the lock keys were deleted).
func TestReleaseLogOnAnotherKeyKeepsTheLock(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	for _, s := range cl {
		must(t, s.Client(t).Set(ctx, "log", "a string", 0).Err())
	}
	l, err := c.TryAcquire(ctx, []string{"run"}, 10*time.Second)
	must(t, err)
	err = l.Release(ctx, redlock.WithReleaseLog("log", 2, time.Minute, "entry"))
	if !errors.Is(err, redlock.ErrMisconfigured) || !strings.Contains(err.Error(), "release log list holds a string") {
		t.Fatalf("Release with a log on a string key: %v, want ErrMisconfigured naming the string", err)
	}
	waitSettled(t, c) // the acquire and the release both ran on the node that answered last
	for i, s := range cl {
		if n := s.Client(t).Exists(ctx, "run").Val(); n != 1 {
			t.Errorf("node %d: the lock's key is gone after a Release that failed", i)
		}
		if v := s.Client(t).Get(ctx, "log").Val(); v != "a string" {
			t.Errorf("node %d: the other key under the log's name is %q", i, v)
		}
	}
	must(t, l.Release(ctx))
}

// badReleaseLogs checks that a Release with a bad release log fails with
// ErrInvalidArgument.
func badReleaseLogs(t *testing.T, c *redlock.Client) {
	t.Helper()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"run"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]redlock.ReleaseOption{
		"a log of length 0":        {redlock.WithReleaseLog("log", 0, time.Minute)},
		"a log on the lock's key":  {redlock.WithReleaseLog("run", 2, time.Minute, "x")},
		"a log on a reserved name": {redlock.WithReleaseLog("redlock:restart-gate", 2, time.Minute, "x")},
		"two logs":                 {redlock.WithReleaseLog("log", 2, time.Minute, "x"), redlock.WithReleaseLog("log2", 2, time.Minute, "y")},
	} {
		if err := l.Release(ctx, opts...); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("Release with %s: %v, want ErrInvalidArgument", name, err)
		}
	}
	_ = l.Release(ctx)
}

// waitListLen waits up to 5 s until the list key has want entries on every
// node of cl, and fails the test for each node where it has not.
func waitListLen(t *testing.T, cl redlocktest.Cluster, key string, want int64) {
	t.Helper()
	ctx := context.Background()
	for i, s := range cl {
		deadline := time.Now().Add(5 * time.Second)
		for s.Client(t).LLen(ctx, key).Val() != want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := s.Client(t).LLen(ctx, key).Val(); n != want {
			t.Errorf("node %d: %s has %d entries, want %d", i, key, n, want)
		}
	}
}
