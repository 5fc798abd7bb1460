package scheduler_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// firstAsked returns the node that a run lock's rounds ask first
// (redlock.WithHighWaterFirst): FNV-1a of the run lock's key, modulo the
// nodes (redlock/quorumfirst.go, first).
func firstAsked(key string, nodes int) int {
	h := uint32(2166136261)
	for i := range len(key) {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return int(h % uint32(nodes))
}

// leaveDeadWinner leaves on the node asked first for job, and there
// alone, what an instance (id) that died between its grant there and its
// requests to the other nodes leaves: the job's run lock and its record of
// scheduled times raised to at, with that instance's metadata written at
// its clock reading wrote. It returns that node.
func leaveDeadWinner(t *testing.T, cl redlocktest.Cluster, job, id string, at, wrote time.Time) int {
	t.Helper()
	first := firstAsked("schedlock:job:"+job, len(cl))
	alone, err := redlock.New([]redis.UniversalClient{cl[first].Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close(context.Background())
	md := id + "@" + strconv.FormatInt(wrote.UnixMilli(), 10) + "/deadbeef/" + strconv.FormatInt(scheduler.DefaultRecordRetention.Milliseconds(), 10)
	_, err = alone.TryAcquire(context.Background(), []string{"schedlock:job:" + job}, 30*time.Second,
		redlock.WithMetadata(md), redlock.WithHighWater("schedlock:taken:"+job, at.UnixMilli(), scheduler.DefaultRecordRetention))
	if err != nil {
		t.Fatal(err)
	}
	return first
}

// TestAttack7CatchUpRefusedByFirstNodeLeftover: an instance took the
// latest scheduled time of an hourly job on the node its run lock asks
// first and died before it asked the others (docs/scheduling.md's failure
// table: "that scheduled time runs nowhere"). That node alone holds the
// record; the two others still hold the time before. An instance started
// with WithCatchUp must run that time: its catch-up asks every node at
// once. It used to ask that node first, take the leftover record as final
// and skip with ErrHeldElsewhere ("dead" already ran it), and, with the
// dead instance's ID equal to its own (a restarted pod with a stable
// name), with ErrDuplicateInstance too.
func TestAttack7CatchUpRefusedByFirstNodeLeftover(t *testing.T) {
	for _, dead := range []string{"dead", "b"} {
		t.Run(dead, func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			at := time.Now().Truncate(time.Hour)
			leaveDeadWinner(t, cl, "hourly", dead, at, time.Now())
			var mu sync.Mutex
			var ticks []time.Time
			var lockErrs []error
			s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(
				scheduler.WithInstanceID("b"), scheduler.WithCatchUp(2*time.Hour)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Shutdown() })
			if _, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func(ctx context.Context) {
				tick, _ := scheduler.TickFromContext(s.RunContext(ctx))
				mu.Lock()
				ticks = append(ticks, tick)
				mu.Unlock()
			}), gocron.WithName("hourly"), gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				mu.Lock()
				lockErrs = append(lockErrs, err)
				mu.Unlock()
			}))); err != nil {
				t.Fatal(err)
			}
			s.Start()
			waitFor(t, 5*time.Second, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(ticks)+len(lockErrs) > 0
			})
			mu.Lock()
			defer mu.Unlock()
			for _, err := range lockErrs {
				t.Errorf("catch-up of %v: %v (ErrHeldElsewhere %v, ErrDuplicateInstance %v); want it run: only the node asked first holds the dead instance's record",
					at, err, errors.Is(err, scheduler.ErrHeldElsewhere), errors.Is(err, scheduler.ErrDuplicateInstance))
			}
			if len(ticks) != 1 || !ticks[0].Equal(at) {
				t.Errorf("catch-up runs %v, want one, of %v", ticks, at)
			}
		})
	}
}

// TestAttack7FirstNodeLeftoverHidesTheMiss: an instance that died
// between its grant on the node asked first and its requests to the
// others leaves its record of that scheduled time there alone, and the
// other instances, refused there, do not try the rest (the documented
// trade). The next run does not report that time missed: PreviousMark is
// the highest mark the granting nodes replaced, the leftover. Counting
// only a mark that a quorum of the granting nodes replaced would report
// it, but a round decided at a quorum of grants hears two nodes, so
// every node that missed a raise while it was down would make the next
// run report times that ran as missed (tried and reverted). Documented in
// docs/scheduling.md's failure table as unreported; WithCatchUp at the
// next start runs it (TestAttack7CatchUpRefusedByFirstNodeLeftover).
func TestAttack7FirstNodeLeftoverHidesTheMiss(t *testing.T) {
	t.Skip("known limitation, documented: a scheduled time left unrun by a winner that died after the node asked first is not reported missed")
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var missed []time.Time
	b, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithClock(clock), scheduler.WithInstanceID("b"),
		scheduler.WithLockJitter(0), scheduler.WithMissedHandler(func(_ string, at time.Time) {
			mu.Lock()
			missed = append(missed, at)
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lk, err := b.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	t1 := clock.Now()
	first := leaveDeadWinner(t, cl, "job", "dead", t1, t1)
	if _, err := b.Lock(ctx, "job"); !errors.Is(err, scheduler.ErrHeldElsewhere) || errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("t1: %v; want ErrHeldElsewhere (the documented trade)", err)
	}
	// By the next run the dead instance's run lock has expired (its TTL is
	// below the interval of most jobs); its record stays.
	if err := cl[first].Client(t).Del(ctx, "schedlock:job:job").Err(); err != nil {
		t.Fatal(err)
	}
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
	if len(missed) != 1 || !missed[0].Equal(t1) {
		t.Errorf("t1 (%v) ran nowhere; missed reported %v, want it once", t1, missed)
	}
}

// TestAttack7SkewedFleetUnderFirstNodeFaults: three instances of an
// every-second job with clocks 2 s behind, on time and 3 s ahead, while
// the node that every run lock asks first is frozen (SIGSTOP) past the
// node timeout and thawed, and then another node is killed and restarted
// empty: no scheduled time runs twice. It held (attack7); it asserts no
// duplicates only, since skewed instances lose their times as late.
func TestAttack7SkewedFleetUnderFirstNodeFaults(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	first := firstAsked("schedlock:job:job", len(cl))
	rec := &recorder{}
	for i, off := range []time.Duration{-2 * time.Second, 0, 3 * time.Second} {
		startInstance(t, cl, rec, instanceSpec{id: i, offset: off, def: gocron.CronJob("* * * * * *", true), jobTime: time.Millisecond,
			opts: []scheduler.LockerOption{scheduler.WithInstanceID(strconv.Itoa(i))}})
	}
	time.Sleep(1200 * time.Millisecond)
	cl[first].Stop(t)
	time.Sleep(1500 * time.Millisecond)
	cl[first].Cont(t)
	other := (first + 1) % len(cl)
	time.Sleep(300 * time.Millisecond)
	cl[other].Kill(t)
	time.Sleep(300 * time.Millisecond)
	cl[other].Restart(t)
	time.Sleep(1200 * time.Millisecond)
	runs := rec.snapshot()
	noTwice(t, runs, time.Second)
	if len(runs) == 0 {
		t.Error("no run")
	}
	t.Logf("%d runs:%s", len(runs), describe(runs))
}

// TestAttack7RunNowPassesFirstNodeLeftover: with a dead winner's run lock
// and record on the node asked first alone, a manual run (Job.RunNow),
// which raises no record and asks every node at once, still runs: the
// two other nodes grant it. It held (attack7): RunNow is the operator's
// way past such a leftover.
func TestAttack7RunNowPassesFirstNodeLeftover(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	leaveDeadWinner(t, cl, "hourly", "dead", time.Now().Truncate(time.Hour), time.Now())
	s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(scheduler.WithInstanceID("b")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	ran := make(chan struct{}, 1)
	j, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func() { ran <- struct{}{} }), gocron.WithName("hourly"))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := j.RunNow(); err != nil {
		t.Fatalf("RunNow past a leftover on the node asked first: %v", err)
	}
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("RunNow returned nil but the job did not run")
	}
}

// TestAttack7FinalRefusalByALaterRecordIsLate: a refusal on the node
// asked first by a record of a later scheduled time ends the Lock with
// ErrLate (and redlock.ErrNotAcquired), never ErrHeldElsewhere or
// redlock.ErrUnavailable, and its text names the later time. It held
// (attack7).
func TestAttack7FinalRefusalByALaterRecordIsLate(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	b, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithClock(clock), scheduler.WithInstanceID("b"),
		scheduler.WithLockJitter(0))
	if err != nil {
		t.Fatal(err)
	}
	later := clock.Now().Add(2 * time.Second)
	leaveDeadWinner(t, cl, "job", "ahead", later, later)
	_, err = b.Lock(context.Background(), "job")
	if !errors.Is(err, scheduler.ErrLate) || !errors.Is(err, redlock.ErrNotAcquired) || errors.Is(err, scheduler.ErrHeldElsewhere) ||
		errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("Lock refused by a later record on the node asked first: %v; want ErrLate and ErrNotAcquired only", err)
	}
	if want := `skipped: too late: "ahead" already ran the later scheduled time 2026-01-01T12:00:02Z`; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
}
