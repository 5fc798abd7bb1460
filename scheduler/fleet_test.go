package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// executions counts each job's task runs per instance.
type executions struct {
	mu sync.Mutex
	n  map[string]map[string]int // job -> instance -> runs
}

func (e *executions) add(job, instance string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]map[string]int{}
	}
	if e.n[job] == nil {
		e.n[job] = map[string]int{}
	}
	e.n[job][instance]++
}

// total returns job's runs on every instance.
func (e *executions) total(job string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.n[job] {
		n += c
	}
	return n
}

// fleetJob is a job every instance of a test fleet has.
type fleetJob struct {
	name string
	def  func() gocron.JobDefinition
}

// startFleet starts n Scheduler instances ("i0", "i1", ...) on the nodes
// of cl, with a fleet poll of 100 ms, each running jobs; their task runs
// are counted in ex. They shut down when the test ends.
func startFleet(t *testing.T, cl redlocktest.Cluster, n int, ex *executions, jobs []fleetJob, opts ...scheduler.LockerOption) []*scheduler.Scheduler {
	t.Helper()
	var fleet []*scheduler.Scheduler
	for i := range n {
		id := fmt.Sprint("i", i)
		lopts := append([]scheduler.LockerOption{scheduler.WithInstanceID(id), scheduler.WithFleetPoll(100 * time.Millisecond)}, opts...)
		s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(lopts...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		for _, j := range jobs {
			if _, err := s.NewJob(j.def(), gocron.NewTask(func(ctx context.Context) {
				ex.add(j.name, id)
			}), gocron.WithName(j.name), gocron.WithEventListeners(gocron.AfterLockError(func(uuid.UUID, string, error) {}))); err != nil {
				t.Fatal(err)
			}
		}
		s.Start()
		fleet = append(fleet, s)
	}
	return fleet
}

// everySecond and daily are the test fleets' schedules.
func everySecond() gocron.JobDefinition { return gocron.CronJob("* * * * * *", true) }
func daily() gocron.JobDefinition {
	return gocron.DailyJob(1, gocron.NewAtTimes(gocron.NewAtTime(3, 0, 0)))
}

// entriesSince returns the entries of runs whose scheduled time is after t.
func entriesSince(runs []scheduler.Run, t time.Time) []scheduler.Run {
	var out []scheduler.Run
	for _, r := range runs {
		if r.Scheduled.After(t) {
			out = append(out, r)
		}
	}
	return out
}

// TestPauseStopsTheJobOnEveryInstance: a job paused through one instance
// stops on all of them: each later scheduled time is taken once and
// recorded as paused, and no instance runs the job, until Resume; a
// paused scheduled time is not a miss.
func TestPauseStopsTheJobOnEveryInstance(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	ex := &executions{}
	fleet := startFleet(t, cl, 3, ex, []fleetJob{{"tick", everySecond}})
	ctx := context.Background()
	waitFor(t, 10*time.Second, func() bool { return ex.total("tick") >= 1 })
	if err := fleet[1].Pause(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		for _, s := range fleet {
			if !s.Paused("tick") {
				return false
			}
		}
		return true
	})
	// Every instance sees the pause from now on: the scheduled times
	// after the next one are all paused.
	from := time.Now().Truncate(time.Second).Add(time.Second)
	var paused []scheduler.Run
	waitFor(t, 15*time.Second, func() bool {
		paused = entriesSince(history(t, fleet[2], "tick"), from)
		return len(paused) >= 1
	})
	before := ex.total("tick")
	waitFor(t, 15*time.Second, func() bool {
		paused = entriesSince(history(t, fleet[2], "tick"), from)
		return len(paused) >= 4
	})
	if after := ex.total("tick"); after != before {
		t.Errorf("the job ran %d times while paused on every instance", after-before)
	}
	seen := map[time.Time]bool{}
	for _, r := range paused {
		if r.Outcome != "paused" || r.Kind != "scheduled" || r.Instance == "" || seen[r.Scheduled] {
			t.Errorf("entry %+v while paused: want each scheduled time once, outcome paused, with its instance", r)
		}
		seen[r.Scheduled] = true
	}
	if err := fleet[0].Resume(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	resumed := ex.total("tick")
	waitFor(t, 15*time.Second, func() bool { return ex.total("tick") >= resumed+2 })
	for _, r := range history(t, fleet[0], "tick") {
		if r.Kind == "missed" {
			t.Errorf("entry %+v: a paused scheduled time is not a miss", r)
		}
	}
}

// TestRequestRunRunsOnceOnOneInstance: a run-now request runs the job
// once, on one instance of the fleet, as a manual run; a second request
// while the first waits is refused, and an unknown job is an error.
func TestRequestRunRunsOnceOnOneInstance(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	ex := &executions{}
	fleet := startFleet(t, cl, 3, ex, []fleetJob{{"nightly", daily}})
	ctx := context.Background()
	waitFor(t, 5*time.Second, func() bool { st, err := fleet[0].Status(ctx); return err == nil && len(st.Jobs) == 1 })
	if err := fleet[2].RequestRun(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	var manual []scheduler.Run
	waitFor(t, 10*time.Second, func() bool {
		manual = nil
		for _, r := range history(t, fleet[0], "nightly") {
			if r.Kind == "manual" && !r.Ended.IsZero() {
				manual = append(manual, r)
			}
		}
		return len(manual) >= 1
	})
	time.Sleep(time.Second) // ten polls of every instance: a second run would start
	if n := ex.total("nightly"); n != 1 || len(manual) != 1 || manual[0].Outcome != "ok" {
		t.Errorf("%d runs, run record %+v; want one manual run, ok", n, manual)
	}
	st, err := fleet[1].Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rn := st.Jobs[0].RunNow; rn == nil || rn.State != "started" || rn.Instance != manual[0].Instance {
		t.Errorf("Status RunNow = %+v, want started on %s", rn, manual[0].Instance)
	}
	if err := fleet[0].RequestRun(ctx, "no-such-job"); !errors.Is(err, scheduler.ErrUnknownJob) {
		t.Errorf("RequestRun of an unknown job = %v, want ErrUnknownJob", err)
	}
	if err := fleet[0].Pause(ctx, "no-such-job"); !errors.Is(err, scheduler.ErrUnknownJob) {
		t.Errorf("Pause of an unknown job = %v, want ErrUnknownJob", err)
	}
	// With every fleet loop stopped, nobody takes a request: a second one
	// is refused while the first waits.
	for _, s := range fleet {
		if err := s.StopJobs(); err != nil {
			t.Fatal(err)
		}
	}
	if err := fleet[0].RequestRun(ctx, "nightly"); err != nil {
		t.Fatal(err)
	}
	if err := fleet[1].RequestRun(ctx, "nightly"); !errors.Is(err, scheduler.ErrRequestPending) {
		t.Errorf("a second RequestRun while one waits = %v, want ErrRequestPending", err)
	}
}
