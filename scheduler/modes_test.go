package scheduler_test

// How gocron's own modes behave with the Locker (issue 18, item 6), on
// real redis-server nodes. docs/scheduling.md, "gocron's modes", states
// the outcomes these tests pin.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// fleetRuns records runs by job and tick.
type fleetRuns struct {
	mu   sync.Mutex
	runs map[string][]time.Time // by job: the ticks run, in order
}

func (f *fleetRuns) add(job string, tick time.Time) {
	f.mu.Lock()
	if f.runs == nil {
		f.runs = map[string][]time.Time{}
	}
	f.runs[job] = append(f.runs[job], tick)
	f.mu.Unlock()
}

// check reports, per job, ticks run twice and ticks of the 1 s grid in
// [from, to) never run.
func (f *fleetRuns) check(jobs []string, from, to time.Time) (duplicates, missed, judged int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, job := range jobs {
		seen := map[time.Time]int{}
		for _, tick := range f.runs[job] {
			if seen[tick]++; seen[tick] == 2 {
				duplicates++
			}
		}
		for tick := from.Truncate(time.Second).Add(time.Second); tick.Before(to); tick = tick.Add(time.Second) {
			judged++
			if seen[tick] == 0 {
				missed++
			}
		}
	}
	return duplicates, missed, judged
}

// startModeFleet starts instances (clock offsets 0 and -200 ms) with one
// cron job per name, every second, each run taking 5 ms, under the given
// gocron options.
func startModeFleet(t *testing.T, cl redlocktest.Cluster, f *fleetRuns, jobs []string, sopts []gocron.SchedulerOption, jopts ...gocron.JobOption) []*scheduler.Scheduler {
	var fleet []*scheduler.Scheduler
	for i, off := range []time.Duration{0, -200 * time.Millisecond} {
		c := newRedlock(t, cl.Clients(t))
		s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithClock(redlocktest.OffsetClock(off)),
			scheduler.WithInstanceID(fmt.Sprint("instance-", i))), scheduler.WithGocronOptions(sopts...))
		if err != nil {
			t.Fatal(err)
		}
		for _, job := range jobs {
			_, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func(ctx context.Context) {
				tick, _ := scheduler.TickFromContext(s.RunContext(ctx))
				f.add(job, tick)
				time.Sleep(5 * time.Millisecond)
			}), append([]gocron.JobOption{gocron.WithName(job)}, jopts...)...)
			if err != nil {
				t.Fatal(err)
			}
		}
		s.Start()
		t.Cleanup(func() { _ = s.Shutdown() })
		fleet = append(fleet, s)
	}
	return fleet
}

// TestGocronModesRunEachTickOnce: with spare capacity, singleton mode and
// WithLimitConcurrentJobs, in wait and reschedule mode, run every tick of
// every job exactly once across the fleet (WithLimitConcurrentJobs(1,
// LimitModeReschedule) lost 13 of 33 ticks of one job while a Lock took
// two rounds).
func TestGocronModesRunEachTickOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		jobs  []string // default a, b, c
		sopts []gocron.SchedulerOption
		jopts []gocron.JobOption
	}{
		{name: "limit1-reschedule-one-job", jobs: []string{"a"},
			sopts: []gocron.SchedulerOption{gocron.WithLimitConcurrentJobs(1, gocron.LimitModeReschedule)}},
		{name: "singleton-reschedule", jopts: []gocron.JobOption{gocron.WithSingletonMode(gocron.LimitModeReschedule)}},
		{name: "singleton-wait", jopts: []gocron.JobOption{gocron.WithSingletonMode(gocron.LimitModeWait)}},
		{name: "limit-reschedule", sopts: []gocron.SchedulerOption{gocron.WithLimitConcurrentJobs(3, gocron.LimitModeReschedule)}},
		{name: "limit-wait", sopts: []gocron.SchedulerOption{gocron.WithLimitConcurrentJobs(1, gocron.LimitModeWait)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			jobs := tc.jobs
			if jobs == nil {
				jobs = []string{"a", "b", "c"}
			}
			cl := redlocktest.Start(t, 3)
			f := &fleetRuns{}
			start := time.Now()
			startModeFleet(t, cl, f, jobs, tc.sopts, tc.jopts...)
			time.Sleep(7 * time.Second)
			dup, missed, judged := f.check(jobs, start.Add(time.Second), time.Now().Add(-time.Second))
			if dup != 0 || missed != 0 {
				t.Errorf("%d ticks ran twice, %d of %d missed", dup, missed, judged)
			}
		})
	}
}

// TestRunNowIsAManualRun: RunNow on a Scheduler's job is a manual run: it
// takes no scheduled time (a second RunNow runs too, and the scheduled
// run right after it still runs), never overlaps a run of the job on
// another instance, and a refusal is RunNow's error. Before, RunNow served
// the current tick: a second one in a long tick ran it again or was
// refused silently, and one late in the interval moved the next tick
// earlier, so that the scheduled run was skipped everywhere.
func TestRunNowIsAManualRun(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	var mu sync.Mutex
	kinds := map[string]int{}
	hold := make(chan struct{})
	var holding atomic.Bool
	var jobs []gocron.Job
	var scheds []*scheduler.Scheduler
	for i := range 2 {
		s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(scheduler.WithInstanceID(fmt.Sprint("i", i))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		j, err := s.NewJob(gocron.DurationJob(2*time.Second), gocron.NewTask(func(ctx context.Context) {
			tick, ok := scheduler.TickFromContext(s.RunContext(ctx))
			kind := "scheduled"
			if ok && tick.Truncate(2*time.Second) != tick {
				kind = "manual" // a manual run's tick is its start
			}
			mu.Lock()
			kinds[kind]++
			mu.Unlock()
			if holding.Load() {
				<-hold
			}
		}), gocron.WithName("job"))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		jobs, scheds = append(jobs, j), append(scheds, s)
	}
	// Late in an interval, so that a RunNow that took the scheduled time
	// would show.
	time.Sleep(time.Until(time.Now().Truncate(2 * time.Second).Add(2*time.Second + 1500*time.Millisecond)))
	count := func(kind string) int { mu.Lock(); defer mu.Unlock(); return kinds[kind] }
	scheduled := count("scheduled")
	for n := 1; n <= 2; n++ {
		// The run before may still be in its Unlock (its task has
		// returned): RunNow is refused until it has released the job.
		err := jobs[0].RunNow()
		for deadline := time.Now().Add(5 * time.Second); errors.Is(err, scheduler.ErrHeldElsewhere) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			err = jobs[0].RunNow()
		}
		if err != nil {
			t.Fatalf("RunNow %d: %v", n, err)
		}
		waitFor(t, 5*time.Second, func() bool { return count("manual") == n })
	}
	waitFor(t, 5*time.Second, func() bool { return count("scheduled") > scheduled })
	// A run in progress on instance 1: instance 0's RunNow is refused.
	holding.Store(true)
	if err := jobs[1].RunNow(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return count("manual") == 3 })
	err := jobs[0].RunNow()
	if !errors.Is(err, scheduler.ErrHeldElsewhere) || !strings.Contains(err.Error(), `manual run held by another instance: a run of the job is in progress on "i1"`) {
		t.Errorf("RunNow while a run goes on elsewhere: %v, want ErrHeldElsewhere naming i1", err)
	}
	holding.Store(false)
	close(hold)
	runs := history(t, scheds[0], "job")
	manual := 0
	for _, r := range runs {
		if r.Kind == "manual" {
			manual++
			if !r.Scheduled.IsZero() || r.Outcome == "" {
				t.Errorf("manual run record %+v: want no scheduled time and an outcome", r)
			}
		}
	}
	if manual < 2 {
		t.Errorf("the run record has %d manual runs, want at least the 2 that ended", manual)
	}
}

// TestOneTimeJobAtAFixedTimeRunsOnce: a one-time job at the same instant
// on every instance (gocron.OneTimeJobStartDateTime) runs once across the
// fleet. (One that starts immediately runs at each instance's own start
// time: once per instance, unless they start within one tick.)
func TestOneTimeJobAtAFixedTimeRunsOnce(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	at := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second)
	var runs atomic.Int32
	for i, off := range []time.Duration{0, -200 * time.Millisecond} {
		c := newRedlock(t, cl.Clients(t))
		s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithClock(redlocktest.OffsetClock(off)),
			scheduler.WithInstanceID(fmt.Sprint("instance-", i))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		if _, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartDateTime(at)), gocron.NewTask(func() { runs.Add(1) }),
			gocron.WithName("once")); err != nil {
			t.Fatal(err)
		}
		s.Start()
	}
	time.Sleep(time.Until(at) + 1500*time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Errorf("the one-time job ran %d times, want 1", n)
	}
}
