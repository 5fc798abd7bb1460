package scheduler_test

// Regression tests for the bugs an adversarial review found in the
// changes of issue 18, against real redis-server nodes.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"log/slog"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// Two runs of one job on ONE Locker in the same tick (gocron runs each
// run's Lock on its own goroutine: RunNow beside a scheduled run, or an
// interval shorter than the tick). The loser must not report
// ErrDuplicateInstance: the record is this Locker's own.
func TestConcurrentSameLockerNoDuplicate(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newRedlock(t, cl.Clients(t))
	l, err := scheduler.NewLocker(c, scheduler.WithLockJitter(0), scheduler.WithInstanceID("A"))
	if err != nil {
		t.Fatal(err)
	}
	dups, ok, held := 0, 0, 0
	for i := 0; i < 200; i++ {
		job := fmt.Sprintf("job-%d", i)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		locks := make([]interface{ Unlock(context.Context) error }, 2)
		for k := 0; k < 2; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lk, err := l.Lock(context.Background(), job)
				errs[k] = err
				if err == nil {
					locks[k] = lk
				}
			}()
		}
		wg.Wait()
		for k := 0; k < 2; k++ {
			switch {
			case errs[k] == nil:
				ok++
				_ = locks[k].Unlock(context.Background())
			case errors.Is(errs[k], scheduler.ErrDuplicateInstance):
				dups++
			case errors.Is(errs[k], scheduler.ErrHeldElsewhere):
				held++
			default:
				t.Logf("other: %v", errs[k])
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("ok=%d held=%d dup=%d", ok, held, dups)
	if dups > 0 {
		t.Errorf("%d false ErrDuplicateInstance from one Locker racing itself", dups)
	}
}

// A single instance, a plain gocron scheduler with NewLocker, a named job
// every 100 ms (shorter than the 1 s tick resolution), default jitter:
// there is no other instance, so no ErrDuplicateInstance may ever appear.
func TestShortIntervalSingleInstanceNoDuplicate(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newRedlock(t, cl.Clients(t))
	l, err := scheduler.NewLocker(c)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
	if err != nil {
		t.Fatal(err)
	}
	var le lockErrors
	if _, err := s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() {}),
		gocron.WithName("fast"), le.listener()); err != nil {
		t.Fatal(err)
	}
	s.Start()
	time.Sleep(4 * time.Second)
	_ = s.Shutdown()
	le.mu.Lock()
	for _, e := range le.errs {
		if errors.Is(e, scheduler.ErrDuplicateInstance) {
			t.Logf("%v", e)
			break
		}
	}
	le.mu.Unlock()
	if n := le.matching(scheduler.ErrDuplicateInstance); n > 0 {
		t.Errorf("one instance alone got %d ErrDuplicateInstance", n)
	}
}

// Two instances with identical clocks, WithClockTolerance(0) (record kept
// 100 ms) and the default start delay (up to 187.5 ms): a short run on one
// instance leaves neither a record nor a run lock by the time the other
// instance's delayed Lock runs its round, so the tick runs twice.
//
// Both Lockers read one fake clock, stopped 100 ms after a tick: on the
// real clock, a loaded machine started some pairs of Locks on either side
// of a tick boundary (x.750 s), so they served two ticks, each once, and
// the test counted them as one tick run twice.
func TestStartDelayWithZeroToleranceRunsOnce(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 100e6, time.UTC))
	mk := func(id string) *scheduler.Locker {
		l, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithInstanceID(id), scheduler.WithClock(clock),
			scheduler.WithClockTolerance(0), scheduler.WithLockJitter(scheduler.DefaultLockJitter))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := mk("A"), mk("B")
	twice := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		job := fmt.Sprintf("job-%d", i)
		got := 0
		var jwg sync.WaitGroup
		for _, l := range []*scheduler.Locker{a, b} {
			jwg.Add(1)
			go func() {
				defer jwg.Done()
				lk, err := l.Lock(context.Background(), job)
				if err == nil {
					mu.Lock()
					got++
					mu.Unlock()
					_ = lk.Unlock(context.Background()) // a quick job
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			jwg.Wait()
			mu.Lock()
			if got > 1 {
				twice++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if twice > 0 {
		t.Errorf("%d of 40 ticks ran on both instances (identical clocks)", twice)
	}
}

// Identical clocks, nodes 80 ms away (each way), tolerance 150 ms: the
// writer's clock reading is taken before its round reaches the nodes and
// the reader's after its refusal comes back, so the computed offset is
// about -2 x latency and a clock_skew warning fires with no skew at all.
func TestFalseClockSkewUnderLatency(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	logs := &logRecorder{}
	mk := func(id string, nodes []redis.UniversalClient, opts ...scheduler.LockerOption) *scheduler.Locker {
		// Hourly scheduled times: a Lock at any moment of the hour (but
		// its last 250 ms) has its whole bound for the slow rounds.
		l, err := scheduler.NewLocker(newRedlock(t, nodes), append([]scheduler.LockerOption{scheduler.WithInstanceID(id),
			scheduler.WithClockTolerance(100 * time.Millisecond), scheduler.WithLockJitter(0), scheduler.WithTickResolution(time.Hour),
			scheduler.WithMisfireThreshold(time.Hour)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	pa, proxA := cl.ProxiedClients(t)
	pb, proxB := cl.ProxiedClients(t)
	for _, p := range append(proxA, proxB...) {
		p.SetLatency(60 * time.Millisecond)
	}
	a := mk("A", pa)
	b := mk("B", pb, scheduler.WithLogger(slog.New(logs)))
	for _, l := range []*scheduler.Locker{a, b} { // warm up connections and scripts
		for i := 0; i < 3; i++ {
			if w, err := l.Lock(context.Background(), fmt.Sprintf("warm-%p-%d", l, i)); err == nil {
				_ = w.Unlock(context.Background())
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	lk, err := a.Lock(context.Background(), "j")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	_, err = b.Lock(context.Background(), "j")
	t.Logf("B: %v", err)
	if w := logs.warnings("clock_skew"); len(w) > 0 {
		t.Errorf("false clock_skew warning with identical clocks: offset %v", w[0]["offset"])
	}
}

// A run whose job ctx gocron cancels (Shutdown, Update, RemoveJob,
// StopJobs) while the task goes on ("a task that ignores it runs on to its
// end"): the run lock's extension stops with the job ctx, so after the TTL
// another instance starts the job while the first run still runs, with no
// lost-lock report.
func TestRunLockHeldAfterJobCtxCancelled(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	var lost atomic.Int32
	mk := func(id string) *scheduler.Locker {
		l, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithInstanceID(id),
			scheduler.WithTTL(300*time.Millisecond), scheduler.WithLockJitter(0),
			scheduler.WithLostHandler(func(string, error) { lost.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := mk("A"), mk("B")
	jobCtx, cancel := context.WithCancel(context.Background())
	lk, err := a.Lock(jobCtx, "long")
	if err != nil {
		t.Fatal(err)
	}
	cancel()                            // gocron: Shutdown / Update / RemoveJob / StopJobs; the task runs on
	time.Sleep(1500 * time.Millisecond) // next tick, still running on A
	lb, err := b.Lock(context.Background(), "long")
	if err == nil {
		defer lb.Unlock(context.Background())
		t.Errorf("B started the job while A's run still runs (lost handler calls: %d)", lost.Load())
	} else {
		t.Logf("B: %v", err)
	}
	_ = lk.Unlock(context.Background())
}

// Shutdown while Locks wait out their start delay. The Locks serve the
// latest multiple of 2 s and are bounded by the next one: the test starts
// just after a multiple, or a Lock started a few milliseconds before one
// could end at its bound (ErrUnavailable) before Shutdown.
func TestShutdownDuringJitter(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	time.Sleep(time.Until(time.Now().Truncate(2 * time.Second).Add(2*time.Second + 100*time.Millisecond)))
	s, err := scheduler.New(newRedlock(t, cl.Clients(t)))
	if err != nil {
		t.Fatal(err)
	}
	var le lockErrors
	for i := 0; i < 50; i++ {
		if _, err := s.NewJob(gocron.DurationJob(2*time.Second), gocron.NewTask(func() {}), gocron.WithName(fmt.Sprintf("j%d", i)),
			gocron.WithStartAt(gocron.WithStartImmediately()), le.listener()); err != nil {
			t.Fatal(err)
		}
	}
	s.Start()
	time.Sleep(30 * time.Millisecond)
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	le.mu.Lock()
	for _, e := range le.errs {
		if !errors.Is(e, scheduler.ErrStopped) {
			t.Errorf("lock error not ErrStopped: %v", e)
		}
	}
	t.Logf("%d lock errors", len(le.errs))
	le.mu.Unlock()
}

// Two of three nodes frozen (SIGSTOP: connections accepted, never
// answered) and go-redis clients with a short ReadTimeout: every round
// fails at once with timeouts (ErrUnavailable, not "down"), so take keeps
// retrying with delay rand.N(min(5ms<<n, 200ms)). A lock timeout of 6 s
// (minute ticks) allows more than 40 retries: 5ms<<41 overflows to a
// negative Duration and rand.N panics, killing the process.
func TestLongUnavailableRetriesDoNotPanic(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := []redis.UniversalClient{cl[0].Client(t)}
	for _, s := range cl[1:] {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 20 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		nodes = append(nodes, rdb)
	}
	c := newRedlock(t, nodes)
	l, err := scheduler.NewLocker(c, scheduler.WithTickResolution(time.Minute),
		scheduler.WithLockTimeout(6*time.Second), scheduler.WithLockJitter(0))
	if err != nil {
		t.Fatal(err)
	}
	cl[1].Stop(t)
	cl[2].Stop(t)
	defer cl[1].Cont(t)
	defer cl[2].Cont(t)
	start := time.Now()
	_, err = l.Lock(context.Background(), "j")
	if !errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("after %v: %v, want ErrUnavailable", time.Since(start), err)
	}
}

// TestLostLockReportedAfterJobCtxCancelled: a task that runs on after
// gocron cancelled the job's ctx keeps its run lock, and when that lock is
// lost the loss is still reported (the watcher used to stop with the job's
// ctx).
func TestLostLockReportedAfterJobCtxCancelled(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	lost := make(chan string, 1)
	l, err := scheduler.NewLocker(newRedlock(t, cl.Clients(t)), scheduler.WithTTL(300*time.Millisecond),
		scheduler.WithLockJitter(0), scheduler.WithLostHandler(func(job string, _ error) { lost <- job }))
	if err != nil {
		t.Fatal(err)
	}
	jobCtx, cancel := context.WithCancel(context.Background())
	lk, err := l.Lock(jobCtx, "long")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	runCtx := l.RunContext(jobCtx)
	cancel() // Shutdown: the task runs on
	select {
	case <-runCtx.Done():
		if err := context.Cause(runCtx); !errors.Is(err, context.Canceled) {
			t.Errorf("run context after the job's ctx ended: %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Error("the run context did not end with the job's ctx")
	}
	for _, s := range cl {
		if err := s.Client(t).FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case job := <-lost:
		if job != "long" {
			t.Errorf("lost handler got job %q", job)
		}
	case <-time.After(3 * time.Second):
		t.Error("the lost run lock was not reported")
	}
}
