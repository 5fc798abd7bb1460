package scheduler_test

// How gocron's own modes behave with the Locker (issue 18, item 6), on
// real redis-server nodes. docs/scheduling.md, "gocron's modes", states
// the outcomes these tests pin.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

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

// TestRunNowServesTheCurrentTick: RunNow goes through the Locker like a
// scheduled run, for the tick the current time maps to (Locker.Tick): it
// runs once across the fleet, and then takes that tick's place, or it is
// refused with ErrHeldElsewhere through AfterLockError when that tick has
// run already.
func TestRunNowServesTheCurrentTick(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	c := newRedlock(t, cl.Clients(t))
	s, err := scheduler.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	var mu sync.Mutex
	var ticks []time.Time
	refused := make(chan error, 4)
	j, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func(ctx context.Context) {
		tick, _ := scheduler.TickFromContext(s.RunContext(ctx))
		mu.Lock()
		ticks = append(ticks, tick)
		mu.Unlock()
	}), gocron.WithName("manual"), gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
		refused <- err
	})))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	// The first scheduled run is at the next whole hour; RunNow takes the
	// current tick of the 1 h grid, and a second RunNow is refused.
	if err := j.RunNow(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(ticks) == 1 })
	if err := j.RunNow(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-refused:
		if !errors.Is(err, scheduler.ErrHeldElsewhere) {
			t.Errorf("second RunNow: %v, want ErrHeldElsewhere (its tick has run)", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the second RunNow in the same tick was neither refused nor run")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ticks) != 1 {
		t.Errorf("%d runs, want 1", len(ticks))
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
