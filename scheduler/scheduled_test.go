package scheduler_test

// Regression tests of the scheduler issue "each scheduled time runs once":
// every failure it lists, on real redis-server nodes with several
// instances. Each failed on the design where a tick was the instance's
// clock reading on a 1-second grid, kept in a record of about 3 s.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// noTwice fails t when a scheduled time ran twice, or a run served a time
// that is not a multiple of every; it returns the scheduled times run.
func noTwice(t *testing.T, runs []run, every time.Duration) map[time.Time]int {
	t.Helper()
	byTick := map[time.Time]int{}
	for _, r := range runs {
		byTick[r.tick]++
		if r.tick.Truncate(every) != r.tick {
			t.Errorf("instance %d ran %s, not a scheduled time of a job every %v", r.instance, r.tick.Format("15:04:05.000"), every)
		}
	}
	for tick, n := range byTick {
		if n > 1 {
			t.Errorf("scheduled time %s ran %d times; runs: %s", tick.Format("15:04:05.000"), n, describe(runs))
		}
	}
	return byTick
}

// TestQueuedRunsKeepTheirScheduledTime: cron jobs every 2 s under
// gocron.WithLimitConcurrentJobs(1, LimitModeWait) wait about 0.9 s in the
// queue behind another job on one instance. The queued run took the next
// 1-second tick, which no other instance claimed: its scheduled time ran
// twice (on time elsewhere, and late here), half or more of the slots.
func TestQueuedRunsKeepTheirScheduledTime(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	rec := &recorder{}
	// A definition each: gocron's NewJob writes into a cron definition.
	every := func() gocron.JobDefinition { return gocron.CronJob("*/2 * * * * *", true) }
	// Instance 0 runs a 0.9 s job first, so that its run of "job" waits.
	s0 := startInstance(t, cl, rec, instanceSpec{id: 0, def: every(), jobTime: time.Millisecond,
		opts:       []scheduler.LockerOption{scheduler.WithLockJitter(0)},
		gocronOpts: []gocron.SchedulerOption{gocron.WithLimitConcurrentJobs(1, gocron.LimitModeWait)}})
	if _, err := s0.NewJob(every(), gocron.NewTask(func() { time.Sleep(900 * time.Millisecond) }), gocron.WithName("blocker")); err != nil {
		t.Fatal(err)
	}
	startInstance(t, cl, rec, instanceSpec{id: 1, def: every(), jobTime: time.Millisecond,
		opts: []scheduler.LockerOption{scheduler.WithLockJitter(0)}})
	time.Sleep(9 * time.Second)
	byTick := noTwice(t, rec.snapshot(), 2*time.Second)
	if len(byTick) < 3 {
		t.Errorf("%d scheduled times ran in 9 s, want at least 3", len(byTick))
	}
}

// TestStartImmediatelyRunsTheLatestScheduledTimeOnce: a duration job with
// gocron.WithStartImmediately on instances started late in the period ran
// every tick twice, about a period apart. Its immediate run serves the
// latest scheduled time, only if no instance ran it.
func TestStartImmediatelyRunsTheLatestScheduledTimeOnce(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	rec := &recorder{}
	const every = 6 * time.Second
	// Start late in a period: 4.4 s and 5.2 s into it.
	time.Sleep(time.Until(time.Now().Truncate(every).Add(every + 4400*time.Millisecond)))
	for i := range 2 {
		startInstance(t, cl, rec, instanceSpec{id: i, def: gocron.DurationJob(every), jobTime: time.Millisecond,
			jobOpts: []gocron.JobOption{gocron.WithStartAt(gocron.WithStartImmediately())}})
		time.Sleep(800 * time.Millisecond)
	}
	time.Sleep(13 * time.Second)
	byTick := noTwice(t, rec.snapshot(), every)
	if len(byTick) < 2 {
		t.Errorf("%d scheduled times ran in about 3 periods, want at least 2", len(byTick))
	}
}

// TestClockAheadRunsEachScheduledTimeAtMostOnce: one instance's clock 3 s
// or 6 s ahead. Every scheduled time ran twice, with no warning at all
// (records lived 2.75 s, and the clock check needed two records to
// overlap). Now each runs at most once, and the instance that finds the
// other's record warns clock_skew with the offset it measured.
func TestClockAheadRunsEachScheduledTimeAtMostOnce(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{3 * time.Second, 6 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			cl := redlocktest.Start(t, 3)
			rec := &recorder{}
			logs := &logRecorder{}
			for i, off := range []time.Duration{0, skew} {
				startInstance(t, cl, rec, instanceSpec{id: i, offset: off, def: gocron.CronJob("*/2 * * * * *", true), jobTime: time.Millisecond,
					opts: []scheduler.LockerOption{scheduler.WithLogger(slog.New(logs))}})
			}
			time.Sleep(9 * time.Second)
			runs := rec.snapshot()
			noTwice(t, runs, 2*time.Second)
			if len(runs) < 3 {
				t.Errorf("%d runs in 9 s, want at least 3", len(runs))
			}
			w := logs.warnings("clock_skew")
			if len(w) != 1 {
				t.Fatalf("%d clock_skew warnings, want 1", len(w))
			}
			if got := w[0]["offset"].Duration(); got < skew-300*time.Millisecond || got > skew+300*time.Millisecond {
				t.Errorf("warned offset %v, want about %v", got, skew)
			}
		})
	}
}

// TestOwnOrphanedRunLockDoesNotBlockTheJob: a run lock that an instance's
// own failed attempt left on 2 of 3 nodes (its grant reached them after
// its undo) blocked the job for the lock's whole TTL, and the instance
// reported that its "previous run is still running" on itself. Now its
// next Lock deletes it and runs; nothing says a run is in progress.
func TestOwnOrphanedRunLockDoesNotBlockTheJob(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	l, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithClock(clock), scheduler.WithInstanceID("a"),
		scheduler.WithLockJitter(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lk, err := l.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	// The metadata this Locker writes: "a@<clock>/<nonce>/<retention>",
	// on a quorum of nodes at least.
	var v string
	for _, s := range cl {
		if v == "" {
			v = s.Client(t).Get(ctx, "schedlock:job:job").Val()
		}
	}
	i := strings.Index(v, "a@")
	if i < 0 {
		t.Fatalf("run lock value %q: no metadata of instance a", v)
	}
	md := v[i:]
	nonce := strings.Split(md, "/")[1]
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// An earlier attempt's grant, on 2 of 3 nodes.
	orphan := "0123456789abcdef0123456789abcdef-a@1767268799000/" + nonce + "/2592000000"
	for _, s := range cl[:2] {
		s.Client(t).Set(ctx, "schedlock:job:job", orphan, 10*time.Second)
	}
	clock.Advance(time.Second)
	lk, err = l.Lock(ctx, "job")
	if err != nil {
		t.Fatalf("Lock with an orphaned run lock of this instance: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i, s := range cl {
		if n := s.Client(t).Exists(ctx, "schedlock:job:job").Val(); n != 0 {
			t.Errorf("node %d still holds a run lock", i)
		}
	}
}

// TestMissedScheduledTimesAreReportedOnce: while every instance is
// stopped (a deploy), scheduled times run nowhere. The first run after
// finds them: each is passed to WithMissedHandler once, and the run
// record holds one missed entry for them. The runs that found none, on
// the other instance, report nothing.
func TestMissedScheduledTimesAreReportedOnce(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	var mu sync.Mutex
	missed := map[time.Time]int{}
	start := func(id int) *scheduler.Scheduler {
		s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(
			scheduler.WithInstanceID(fmt.Sprint("i", id)),
			scheduler.WithMissedHandler(func(job string, at time.Time) {
				mu.Lock()
				missed[at]++
				mu.Unlock()
			})))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {}), gocron.WithName("job")); err != nil {
			t.Fatal(err)
		}
		s.Start()
		return s
	}
	first := []*scheduler.Scheduler{start(0), start(1)}
	time.Sleep(2500 * time.Millisecond)
	for _, s := range first {
		_ = s.Shutdown()
	}
	stopped := time.Now()
	time.Sleep(3 * time.Second)
	second := []*scheduler.Scheduler{start(2), start(3)}
	t.Cleanup(func() {
		for _, s := range second {
			_ = s.Shutdown()
		}
	})
	time.Sleep(2500 * time.Millisecond)
	mu.Lock()
	n := len(missed)
	for at, k := range missed {
		if k != 1 {
			t.Errorf("scheduled time %s reported %d times, want once", at.Format("15:04:05"), k)
		}
	}
	mu.Unlock()
	if n < 2 || n > 5 {
		t.Errorf("%d scheduled times reported missed after a 3 s stop, want 2 to 5", n)
	}
	runs := history(t, second[0], "job")
	var entries []scheduler.Run
	for _, r := range runs {
		if r.Kind == "missed" {
			entries = append(entries, r)
		}
	}
	if len(entries) != 1 || entries[0].Missed != n || entries[0].Scheduled.Before(stopped.Add(-time.Second)) {
		t.Errorf("run record's missed entries %+v, want one of %d scheduled times after the stop", entries, n)
	}
}

// TestOverlapIsNotAMiss: scheduled times skipped because the job's
// previous run was still running are not reported missed.
func TestOverlapIsNotAMiss(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	var missed atomic.Int32
	s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(
		scheduler.WithMissedHandler(func(string, time.Time) { missed.Add(1) })))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	var runs atomic.Int32
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		runs.Add(1)
		time.Sleep(2200 * time.Millisecond)
	}), gocron.WithName("slow")); err != nil {
		t.Fatal(err)
	}
	s.Start()
	time.Sleep(8 * time.Second)
	if runs.Load() < 2 {
		t.Fatalf("%d runs, want at least 2", runs.Load())
	}
	if n := missed.Load(); n != 0 {
		t.Errorf("%d scheduled times reported missed while the job's runs overlapped them, want 0", n)
	}
}

// TestCatchUpRunsTheLatestMissedTimeOnce: with WithCatchUp, instances that
// start after a scheduled time that ran nowhere run it once, across the
// fleet, as a catch-up; one that starts later does not run it again.
func TestCatchUpRunsTheLatestMissedTimeOnce(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	var mu sync.Mutex
	var ticks []time.Time
	start := func(id int) {
		s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(
			scheduler.WithInstanceID(fmt.Sprint("i", id)), scheduler.WithCatchUp(2*time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		if _, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func(ctx context.Context) {
			tick, _ := scheduler.TickFromContext(s.RunContext(ctx))
			mu.Lock()
			ticks = append(ticks, tick)
			mu.Unlock()
		}), gocron.WithName("hourly")); err != nil {
			t.Fatal(err)
		}
		s.Start()
	}
	start(0)
	start(1)
	time.Sleep(2 * time.Second)
	start(2)
	time.Sleep(2 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	if want := time.Now().Truncate(time.Hour); len(ticks) != 1 || !ticks[0].Equal(want) {
		t.Errorf("catch-up runs %v, want one, of %v", ticks, want)
	}
}

// TestHistoryTellsWhoRanEachScheduledTime: "which instance ran the 09:00
// run, and did it succeed?" had no answer: records expired after seconds.
// The run record keeps each run: scheduled time, instance, start, end,
// outcome and error, the same from any instance.
func TestHistoryTellsWhoRanEachScheduledTime(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	var scheds []*scheduler.Scheduler
	for i := range 2 {
		s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(scheduler.WithInstanceID(fmt.Sprint("i", i))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		var n atomic.Int32
		if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() error {
			if n.Add(1)%2 == 0 {
				return errors.New("disk full")
			}
			return nil
		}), gocron.WithName("job"), gocron.WithEventListeners(gocron.AfterLockError(func(uuid.UUID, string, error) {}))); err != nil {
			t.Fatal(err)
		}
		s.Start()
		scheds = append(scheds, s)
	}
	time.Sleep(4500 * time.Millisecond)
	a, b := history(t, scheds[0], "job"), history(t, scheds[1], "job")
	if len(a) < 3 || len(a) != len(b) {
		t.Fatalf("history: %d entries from one instance, %d from the other; want the same, at least 3", len(a), len(b))
	}
	seen := map[time.Time]bool{}
	failed := 0
	for i, r := range a {
		if r != b[i] {
			t.Errorf("entry %d differs between instances: %+v and %+v", i, r, b[i])
		}
		if r.Kind != "scheduled" || r.Instance == "" || r.Started.Before(r.Scheduled) || r.Ended.Before(r.Started) || seen[r.Scheduled] {
			t.Errorf("entry %+v: want a scheduled run, once per scheduled time, with instance, start and end", r)
		}
		seen[r.Scheduled] = true
		if r.Outcome == "failed" && r.Error == "disk full" {
			failed++
		} else if r.Outcome != "ok" {
			t.Errorf("entry %+v: outcome %q, want ok or failed with the task's error", r, r.Outcome)
		}
	}
	if failed == 0 {
		t.Error("no failed run recorded with its error")
	}
}

// history returns job's run record as s reads it, retried for a few
// seconds while fewer than a quorum of nodes answer within the node
// timeout (a loaded test machine, -race).
func history(t *testing.T, s *scheduler.Scheduler, job string) []scheduler.Run {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var runs []scheduler.Run
		if runs, err = s.History(context.Background(), job, 100); err == nil {
			return runs
		}
	}
	t.Fatalf("History(%q): %v", job, err)
	return nil
}

// TestOwnLeftoverRecordIsPutBack: a failed attempt's grant that reached 2
// of 3 nodes after its undo left the job's record raised to its scheduled
// time (with the run lock): the time ran nowhere, the other instances read
// "already ran it", and the next run did not report it missed. The
// instance's next Lock of that time now puts the record back and runs it.
func TestOwnLeftoverRecordIsPutBack(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(scheduler.WithClock(clock),
		scheduler.WithInstanceID("a"), scheduler.WithLockJitter(0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {}), gocron.WithName("job")); err != nil {
		t.Fatal(err)
	}
	l := s.Locker()
	ctx := context.Background()
	lk, err := l.Lock(ctx, "job") // 12:00:00
	if err != nil {
		t.Fatal(err)
	}
	var v string
	for _, n := range cl {
		if v == "" {
			v = n.Client(t).Get(ctx, "schedlock:job:job").Val()
		}
	}
	nonce := strings.Split(v[strings.Index(v, "a@"):], "/")[1]
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The leftover of an attempt for 12:00:01 on 2 of 3 nodes.
	value := "0123456789abcdef0123456789abcdef-a@1767268801000/" + nonce + "/2592000000"
	for _, n := range cl[:2] {
		n.Client(t).Set(ctx, "schedlock:job:job", value, 10*time.Second)
		prev := n.Client(t).HGet(ctx, "schedlock:taken:job", "v").Val()
		n.Client(t).HSet(ctx, "schedlock:taken:job", "m", "1767268801000", "v", value, "pm", "1767268800000", "pv", prev)
	}
	clock.Advance(time.Second)
	lk, err = l.Lock(ctx, "job")
	if err != nil {
		t.Fatalf("Lock of 12:00:01 with this instance's leftover record: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDifferentLocationsAreWarned: two instances that read a daily job in
// different locations each run their own 09:00; the one that finds the
// other's time as the previous one taken warns settings_mismatch.
func TestDifferentLocationsAreWarned(t *testing.T) {
	t.Parallel()
	c, _ := miniClient(t, 3)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 8, 0, 0, 0, time.UTC)) // 09:00 in Berlin
	logs := &logRecorder{}
	var lockers []*scheduler.Locker
	for i, loc := range []*time.Location{berlin, time.UTC} {
		s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithClock(clock), scheduler.WithLockJitter(0),
			scheduler.WithInstanceID(fmt.Sprint("i", i)), scheduler.WithLocation(loc), scheduler.WithLogger(slog.New(logs))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		if _, err := s.NewJob(gocron.CronJob("0 0 9 * * *", true), gocron.NewTask(func() {}), gocron.WithName("report")); err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, s.Locker())
	}
	ctx := context.Background()
	lk, err := lockers[0].Lock(ctx, "report") // Berlin's 09:00
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	clock.Advance(time.Hour) // 09:00 UTC
	if lk, err := lockers[1].Lock(ctx, "report"); err == nil {
		_ = lk.Unlock(ctx)
	}
	if w := logs.warnings("settings_mismatch"); len(w) != 1 {
		t.Errorf("%d settings_mismatch warnings, want 1", len(w))
	}
}

// TestFreshGatedFleetIsToldApart: a new fleet with restart gating failed
// every run for its first maxTTL with an error that read like an outage
// ("lost its data recently", ErrUnavailable alone). It now also matches
// redlock.ErrGated, counts as skipped_gated, and says the nodes may be new.
func TestFreshGatedFleetIsToldApart(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	c, err := redlock.New(cl.Clients(t), redlock.WithRestartGating(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	l, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithLockJitter(0), scheduler.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Lock(context.Background(), "job")
	if !errors.Is(err, redlock.ErrGated) || !errors.Is(err, redlock.ErrUnavailable) ||
		!strings.Contains(err.Error(), "no restart-gate marker (a new node, or one that lost its data)") {
		t.Errorf("Lock on a new gated fleet: %v; want ErrGated and ErrUnavailable, saying the nodes may be new", err)
	}
}
