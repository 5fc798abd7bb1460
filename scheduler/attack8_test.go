package scheduler_test

// Tests from an attack on the scheduler's promise (a helper, 2026-12-03):
// the defects it found, each fixed.

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// TestNilGocronInputsAreErrors: a nil gocron scheduler option, job
// definition, task or job option went straight to gocron, which panicked
// on it; New, NewJob and Update now return an error naming it.
func TestNilGocronInputsAreErrors(t *testing.T) {
	c, _ := miniClient(t, 1)
	_, err := scheduler.New(c, scheduler.WithGocronOptions(gocron.WithLimitConcurrentJobs(1, gocron.LimitModeWait), nil))
	checkInvalid(t, "New", err, "scheduler: invalid argument: gocron option 2 of 2 (WithGocronOptions) is nil")
	s := newMiniScheduler(t)
	task, def := gocron.NewTask(func() {}), gocron.DurationJob(time.Hour)
	_, err = s.NewJob(nil, task, gocron.WithName("a"))
	checkInvalid(t, "NewJob", err, "scheduler: invalid argument: the job definition (NewJob) is nil")
	_, err = s.NewJob(def, nil, gocron.WithName("a"))
	checkInvalid(t, "NewJob", err, "scheduler: invalid argument: the task (NewJob) is nil")
	_, err = s.NewJob(def, task, gocron.WithName("a"), nil)
	checkInvalid(t, "NewJob", err, "scheduler: invalid argument: job option 2 of 2 (NewJob) is nil")
	j, err := s.NewJob(def, task, gocron.WithName("a"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Update(j.ID(), nil, task, gocron.WithName("a"))
	checkInvalid(t, "Update", err, "scheduler: invalid argument: the job definition (Update) is nil")
	_, err = s.Update(j.ID(), def, task, nil)
	checkInvalid(t, "Update", err, "scheduler: invalid argument: job option 1 of 1 (Update) is nil")
	if len(s.Jobs()) != 1 {
		t.Errorf("%d jobs after the failed Updates, want the 1 there was", len(s.Jobs()))
	}
}

// checkInvalid fails t unless err matches redlock.ErrInvalidArgument with
// text want.
func checkInvalid(t *testing.T, call string, err error, want string) {
	t.Helper()
	if !errors.Is(err, redlock.ErrInvalidArgument) || err.Error() != want {
		t.Errorf("%s = %v, want %q (ErrInvalidArgument)", call, err, want)
	}
}

// TestRunNowWithTheLargestLockTimeout: Job.RunNow waits for its Lock up
// to the lock timeout plus 5 s. With WithLockTimeout near the largest
// Duration (and a record retention as long, which such a lock timeout
// needs) that sum overflowed to a negative wait, and RunNow returned nil
// at once though the Lock was refused (a run in progress on another
// instance).
func TestRunNowWithTheLargestLockTimeout(t *testing.T) {
	t.Run("1s", func(t *testing.T) { runNowWhileHeld(t, time.Second) })
	t.Run("max", func(t *testing.T) { runNowWhileHeld(t, time.Duration(math.MaxInt64)) })
}

// runNowWhileHeld checks that RunNow on A, with lock timeout timeout,
// reports that B runs the job.
func runNowWhileHeld(t *testing.T, timeout time.Duration) {
	c, _ := miniClient(t, 1)
	quiet := scheduler.WithLogger(slog.New(slog.DiscardHandler))
	s, err := scheduler.New(c, scheduler.WithLockerOptions(quiet, scheduler.WithInstanceID("A"),
		scheduler.WithLockTimeout(timeout), scheduler.WithRecordRetention(math.MaxInt64)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	j, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func() {}), gocron.WithName("job"))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	b, err := scheduler.NewLocker(c, quiet, scheduler.WithInstanceID("B"), scheduler.WithMisfireThreshold(2*time.Hour),
		scheduler.WithTickResolution(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := b.Lock(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Unlock(context.Background()) }()
	if err := j.RunNow(); !errors.Is(err, scheduler.ErrHeldElsewhere) {
		t.Errorf("RunNow while B runs the job = %v, want ErrHeldElsewhere", err)
	}
}

// TestRetentionOutlivesTheLastLock: NewLocker accepted a record retention
// equal to the misfire threshold (1 s each), and then an instance 200 ms
// behind whose run of a scheduled time waited 900 ms in gocron's queue
// found the record of that time expired and ran it a second time. The
// retention must cover the misfire threshold, the lock timeout and the
// clock tolerance.
func TestRetentionOutlivesTheLastLock(t *testing.T) {
	c, _ := miniClient(t, 1)
	opts := []scheduler.LockerOption{scheduler.WithMisfireThreshold(time.Second), scheduler.WithLockTimeout(time.Second),
		scheduler.WithClockTolerance(500 * time.Millisecond)}
	_, err := scheduler.NewLocker(c, append(opts, scheduler.WithRecordRetention(time.Second))...)
	if !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("NewLocker with a retention equal to the misfire threshold = %v, want ErrInvalidArgument", err)
	}
	if _, err := scheduler.NewLocker(c, append(opts, scheduler.WithRecordRetention(2500*time.Millisecond))...); err != nil {
		t.Errorf("NewLocker with a retention of the misfire threshold + lock timeout + clock tolerance = %v", err)
	}
	_, err = scheduler.NewLocker(c, append(opts, scheduler.WithCatchUp(time.Minute), scheduler.WithRecordRetention(time.Minute))...)
	if !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("NewLocker with a retention equal to the catch-up window = %v, want ErrInvalidArgument", err)
	}
	huge := time.Duration(math.MaxInt64)
	if _, err := scheduler.NewLocker(c, scheduler.WithMisfireThreshold(huge), scheduler.WithRecordRetention(huge)); err != nil {
		t.Errorf("NewLocker with the largest misfire threshold and retention = %v", err)
	}
}

// TestManualRunAfterAFailedReleaseKeepsTheRecord: Scheduler A runs a
// scheduled time T of a job every 5 s; its release fails on 2 of 3 nodes.
// A RunNow on A a moment later meets A's own run lock. It took it for a
// failed attempt's leftover, and ReleaseAbandoned put the job's record
// back below T (a manual run raises nothing); B, whose Lock of T comes
// 1.5 s after T (its clock behind, or a queued run), then found T free and
// ran it a second time, silently. A run lock of A's latest run is now
// deleted alone: the record stays at T.
func TestManualRunAfterAFailedReleaseKeepsTheRecord(t *testing.T) {
	t.Parallel()
	t.Run("control without RunNow", func(t *testing.T) { t.Parallel(); manualAfterFailedRelease(t, false) })
	t.Run("RunNow", func(t *testing.T) { t.Parallel(); manualAfterFailedRelease(t, true) })
}

func manualAfterFailedRelease(t *testing.T, runNow bool) {
	cl := redlocktest.Start(t, 3)
	nodes, prox := ctxTimeoutProxied(t, cl)
	s, err := scheduler.New(newRedlock(t, nodes), scheduler.WithLockerOptions(scheduler.WithInstanceID("A"),
		scheduler.WithLockJitter(0), scheduler.WithLogger(slog.New(slog.DiscardHandler))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	type ran struct {
		tick time.Time
		kind string
	}
	runs := make(chan ran, 100)
	var first atomic.Bool
	j, err := s.NewJob(gocron.CronJob("*/5 * * * * *", true), gocron.NewTask(func(ctx context.Context) {
		tick, _ := scheduler.TickFromContext(s.RunContext(ctx))
		runs <- ran{tick, "A"}
		if tick.Truncate(5*time.Second).Equal(tick) && first.CompareAndSwap(false, true) {
			// The links to 2 of the 3 nodes fail as the run ends.
			prox[1].Blackhole(true)
			prox[2].Blackhole(true)
			time.AfterFunc(500*time.Millisecond, func() { prox[1].Blackhole(false); prox[2].Blackhole(false) })
		}
	}), gocron.WithName("job"))
	if err != nil {
		t.Fatal(err)
	}
	// Start just after a 5 s boundary so that T is the next one.
	time.Sleep(time.Until(time.Now().Truncate(5 * time.Second).Add(5*time.Second + 200*time.Millisecond)))
	s.Start()
	var T time.Time
	select {
	case r := <-runs:
		T = r.tick
	case <-time.After(8 * time.Second):
		t.Fatal("A did not run")
	}
	time.Sleep(900 * time.Millisecond) // the failed release is over, links healed
	if runNow {
		if err := j.RunNow(); err != nil {
			t.Logf("A's RunNow: %v", err)
		}
	}
	// B's Lock of T, 1.5 s after it.
	bClock := clockwork.NewFakeClockAt(T.Add(1500 * time.Millisecond))
	b, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithClock(bClock), scheduler.WithInstanceID("B"),
		scheduler.WithLockJitter(0), scheduler.WithLogger(slog.New(slog.DiscardHandler)),
		scheduler.WithTickResolution(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := b.Lock(context.Background(), "job")
	if err == nil {
		_ = lk.Unlock(context.Background())
		t.Errorf("B ran scheduled time %s, which A had run", T.Format(time.TimeOnly))
	} else {
		t.Logf("B refused: %v", err)
	}
}

// TestMonthlyJobMissIsReported: a job on the 1st of each month, default
// settings. It runs on January 1st; on February 1st Redis is down (or
// every instance is stopped); it runs on March 1st, which must report
// February 1st missed. The job's record of scheduled times expired 30 days
// after January 1st (DefaultRecordRetention), so the March run found no
// previous time and reported nothing: every miss of a monthly or yearly
// job was silent. A job's records now stay for at least two of its
// intervals.
func TestMonthlyJobMissIsReported(t *testing.T) {
	t.Run("retention 90 days", func(t *testing.T) { monthlyMiss(t, scheduler.WithRecordRetention(90*24*time.Hour)) })
	t.Run("default retention", func(t *testing.T) { monthlyMiss(t) })
}

// monthlyMiss runs the scenario of TestMonthlyJobMissIsReported with
// the Locker options extra.
func monthlyMiss(t *testing.T, extra ...scheduler.LockerOption) {
	c, ms := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	g, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithLocation(time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Shutdown() })
	if _, err := g.NewJob(gocron.CronJob("0 0 0 1 * *", true), gocron.NewTask(func() {}), gocron.WithName("monthly")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var missed []time.Time
	l, err := scheduler.NewLocker(c, append([]scheduler.LockerOption{scheduler.WithClock(clock), scheduler.WithLocation(time.UTC),
		scheduler.WithLockJitter(0), scheduler.WithInstanceID("A"), scheduler.WithLogger(slog.New(slog.DiscardHandler)),
		scheduler.WithMissedHandler(func(_ string, at time.Time) { mu.Lock(); missed = append(missed, at); mu.Unlock() })}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	l.Follow(g)
	ctx := context.Background()
	lk, err := l.Lock(ctx, "monthly") // January 1st
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	// February 1st: nothing runs. March 1st: 59 days later.
	clock.Advance(59 * 24 * time.Hour)
	for _, m := range ms {
		m.FastForward(59 * 24 * time.Hour)
	}
	lk, err = l.Lock(ctx, "monthly")
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(missed) != 1 || !missed[0].Equal(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("missed reported: %v, want February 1st", missed)
	}
	runs, err := l.History(ctx, "monthly", 10)
	if err != nil || len(runs) != 3 {
		t.Errorf("History = %d entries, %v; want January's run, February's miss and March's run", len(runs), err)
	}
}

// TestTooFineAScheduleIsNamed: with a tick resolution of 1 ms a Lock's
// bound (it ends before the job's next scheduled time) is 1 ms, shorter
// than any round on these nodes (5 ms each way), and every Lock failed with
// "Redis unavailable" and nothing else: an operator's choice reported as
// an outage. The error now says that the schedule is too fine.
func TestTooFineAScheduleIsNamed(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, prox := ctxTimeoutProxied(t, cl)
	for _, p := range prox {
		p.SetLatency(5 * time.Millisecond)
	}
	l, err := scheduler.NewLocker(newRedlock(t, nodes), scheduler.WithTickResolution(time.Millisecond),
		scheduler.WithLockJitter(0), scheduler.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Lock(context.Background(), "job")
	t.Logf("Lock: %v", err)
	if err == nil || !strings.Contains(err.Error(), "a schedule this fine leaves no time for a round") {
		t.Errorf("Lock with a 1 ms tick resolution = %v, want it to name the schedule", err)
	}
}

// TestLeftoverWithAManualRunsMetadataIsPutBack: a failed attempt made at
// the same clock reading as the latest run (a frozen test clock; a manual
// run a moment before) writes the same metadata. With the latest run
// remembered by its metadata (see
// TestManualRunAfterAFailedReleaseKeepsTheRecord), its leftover record of
// 12:00:00 on 2 of 3 nodes was taken for a run's, the Lock of 12:00:00
// was refused ("a" took it: this very instance) and the time ran nowhere.
// Manual runs take no scheduled time and are not remembered: the leftover
// is put back and 12:00:00 runs. (A second attacker found it.)
func TestLeftoverWithAManualRunsMetadataIsPutBack(t *testing.T) {
	c, ms := miniClient(t, 3)
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := clockwork.NewFakeClockAt(at) // frozen: every reading is 12:00:00.000
	s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithClock(clock), scheduler.WithLocation(time.UTC),
		scheduler.WithInstanceID("a"), scheduler.WithLockJitter(0), scheduler.WithLogger(slog.New(slog.DiscardHandler))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	md := make(chan string, 1)
	j, err := s.NewJob(gocron.CronJob("0 0 * * * *", true), gocron.NewTask(func() {
		var v string
		for _, m := range ms { // a quorum holds it
			if w, _ := m.Get("schedlock:job:job"); v == "" {
				v = w
			}
		}
		md <- v // hourly: gocron's real clock does not fire it in the test
	}), gocron.WithName("job"))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := j.RunNow(); err != nil { // the latest run: a manual run at 12:00:00.000
		t.Fatal(err)
	}
	v := <-md
	i := strings.Index(v, "-a@")
	if i < 0 {
		t.Fatalf("run lock value %q: no metadata of instance a", v)
	}
	metadata := v[i+1:]
	waitFor(t, 2*time.Second, func() bool {
		return !ms[0].Exists("schedlock:job:job") && !ms[1].Exists("schedlock:job:job") && !ms[2].Exists("schedlock:job:job")
	})
	// A failed attempt of this instance for 12:00:00, at the same reading:
	// its grant reached 2 of 3 nodes after its undo.
	leftover := "fedcba9876543210fedcba9876543210-" + metadata
	for _, m := range ms[:2] {
		_ = m.Set("schedlock:job:job", leftover)
		m.SetTTL("schedlock:job:job", 10*time.Second)
		m.HSet("schedlock:taken:job", "m", "1767268800000", "v", leftover, "pm", "", "pv", "")
		m.SetTTL("schedlock:taken:job", time.Hour)
	}
	lk, err := s.Locker().Lock(context.Background(), "job")
	if err != nil {
		t.Fatalf("Lock of 12:00:00 with this instance's own failed attempt's leftover: %v; 12:00:00 ran nowhere", err)
	}
	_ = lk.Unlock(context.Background())
}
