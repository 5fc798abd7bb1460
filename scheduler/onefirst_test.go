package scheduler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// TestHighWaterFirstTrade: the run lock's rounds ask one node first
// (redlock.WithHighWaterFirst). A loser sends one script, to that node.
// When the instance that took a scheduled time there fails on every
// other node (its links to them are black holes), the others, refused on
// the first node, do not try the rest: the scheduled time is then run by
// one of them (it reached the first node between the failing winner's
// undo and its retry) or reported missed, once, by the next run: never
// both, never neither.
func TestHighWaterFirstTrade(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var missed []time.Time
	opts := func(id string) []scheduler.LockerOption {
		return []scheduler.LockerOption{scheduler.WithClock(clock), scheduler.WithInstanceID(id), scheduler.WithLockJitter(0),
			scheduler.WithMissedHandler(func(_ string, at time.Time) {
				mu.Lock()
				missed = append(missed, at)
				mu.Unlock()
			})}
	}
	wNodes, wProx := ctxTimeoutProxied(t, cl)
	w, err := scheduler.NewLocker(newRedlock(t, wNodes), opts("W")...)
	if err != nil {
		t.Fatal(err)
	}
	hooks := make([]*commandCounter, len(cl))
	var bNodes []redis.UniversalClient
	for i, s := range cl {
		hooks[i] = &commandCounter{}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
		rdb.AddHook(hooks[i])
		t.Cleanup(func() { _ = rdb.Close() })
		bNodes = append(bNodes, rdb)
	}
	b, err := scheduler.NewLocker(newRedlock(t, bNodes), opts("B")...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sent := func() []int32 {
		n := make([]int32, len(hooks))
		for i, h := range hooks {
			n[i] = h.n.Load()
		}
		return n
	}
	// lose runs B's Lock of a scheduled time W took, and returns the one
	// node it sent to.
	lose := func(what string) int {
		t.Helper()
		before := sent()
		_, err := b.Lock(ctx, "job")
		if !errors.Is(err, scheduler.ErrHeldElsewhere) {
			t.Fatalf("%s: B's Lock = %v, want ErrHeldElsewhere", what, err)
		}
		node := -1
		for i, n := range sent() {
			switch d := n - before[i]; {
			case d == 1 && node < 0:
				node = i
			case d != 0:
				t.Fatalf("%s: B sent %d scripts to node %d, want one script to one node", what, d, i)
			}
		}
		if node < 0 {
			t.Fatalf("%s: B sent nothing", what)
		}
		return node
	}
	if lk, err := b.Lock(ctx, "warm"); err == nil { // B reads the fleet's pauses once
		_ = lk.Unlock(ctx)
	}

	lk, err := w.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	first := lose("t0")
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	clock.Advance(time.Second)
	t1 := clock.Now()
	for i, p := range wProx {
		if i != first {
			p.Blackhole(true)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.Lock(ctx, "job")
		done <- err
	}()
	waitFor(t, 5*time.Second, func() bool { return cl[first].Client(t).Exists(ctx, "schedlock:job:job").Val() == 1 })
	ranT1 := false
	if lk, err := b.Lock(ctx, "job"); err == nil {
		ranT1 = true // between W's undo and its retry
		_ = lk.Unlock(ctx)
	} else if !errors.Is(err, scheduler.ErrHeldElsewhere) {
		t.Fatalf("t1: B's Lock = %v, want ErrHeldElsewhere or a run", err)
	}
	if err := <-done; !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("t1: W's Lock with two nodes black holes = %v, want ErrUnavailable", err)
	}
	for _, p := range wProx {
		p.Heal()
	}
	waitFor(t, 5*time.Second, func() bool { return cl[first].Client(t).Exists(ctx, "schedlock:job:job").Val() == 0 })

	clock.Advance(time.Second)
	lk, err = b.Lock(ctx, "job")
	if err != nil {
		t.Fatalf("t2: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case ranT1 && len(missed) != 0:
		t.Errorf("t1 ran on B and reported missed %v", missed)
	case !ranT1 && (len(missed) != 1 || !missed[0].Equal(t1)):
		t.Errorf("t1 (%v) ran nowhere; missed reported %v, want it once", t1, missed)
	}
}

// TestRestartWithAStableIDIsNoDuplicate: a record with this Locker's
// instance ID written by another process before this Locker started is a
// restarted instance's previous process: ErrHeldElsewhere, not
// ErrDuplicateInstance (it used to warn of a live duplicate at every
// restart that met its previous process's record, e.g. a catch-up). A
// record written after it started is a live duplicate.
func TestRestartWithAStableIDIsNoDuplicate(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	mk := func() *scheduler.Locker {
		l, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithClock(clock),
			scheduler.WithInstanceID("pod-0"), scheduler.WithLockJitter(0))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx := context.Background()
	old := mk()
	lk, err := old.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100 * time.Millisecond) // the same scheduled time
	restarted := mk()
	if _, err := restarted.Lock(ctx, "job"); !errors.Is(err, scheduler.ErrHeldElsewhere) || errors.Is(err, scheduler.ErrDuplicateInstance) {
		t.Errorf("the previous process's record: %v; want ErrHeldElsewhere, not ErrDuplicateInstance", err)
	}
	clock.Advance(time.Second) // the next scheduled time, taken by a live process with the same ID
	lk, err = old.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	if _, err := restarted.Lock(ctx, "job"); !errors.Is(err, scheduler.ErrDuplicateInstance) {
		t.Errorf("a record written after this Locker started: %v; want ErrDuplicateInstance", err)
	}
}
