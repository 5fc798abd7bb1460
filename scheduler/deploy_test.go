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

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// deployRun is one run of the rolling-deploy tests' job.
type deployRun struct {
	instance string
	tick     time.Time
}

// TestRollingDeployRunsEachTickOnce: instance A runs a short job whose
// task ignores its ctx (a plain func()); A stops the job mid-run (Shutdown,
// RemoveJob or Update, as a rolling deploy does); instance B, whose clock
// is 150 ms behind, fires the same tick after A's run has ended. B must
// find the tick taken: the run had started, so its tick is never given
// back (a regression: Unlock released the tick record whenever the job's
// ctx was cancelled, and B ran the tick again).
func TestRollingDeployRunsEachTickOnce(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Shutdown", "RemoveJob", "Update"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			cl := redlocktest.Start(t, 3)
			var mu sync.Mutex
			var runs []deployRun
			started := make(chan struct{}, 16)
			// A definition holds its parsed schedule: one per job.
			def := func() gocron.JobDefinition { return gocron.CronJob("* * * * * *", true) }
			newInstance := func(name string, offset time.Duration) (*scheduler.Scheduler, uuid.UUID, gocron.Task) {
				c := newRedlock(t, cl.Clients(t))
				s, err := scheduler.New(c, scheduler.WithLockerOptions(
					scheduler.WithClock(redlocktest.OffsetClock(offset)), scheduler.WithInstanceID(name)))
				if err != nil {
					t.Fatal(err)
				}
				task := gocron.NewTask(func() { // ignores the job's ctx
					tick := s.Locker().Tick("job")
					mu.Lock()
					runs = append(runs, deployRun{name, tick})
					mu.Unlock()
					if name == "A" {
						select {
						case started <- struct{}{}:
						default:
						}
					}
					time.Sleep(40 * time.Millisecond)
				})
				j, err := s.NewJob(def(), task, gocron.WithName("job"))
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
				t.Cleanup(func() { _ = s.Shutdown() })
				return s, j.ID(), task
			}
			a, id, task := newInstance("A", 0)
			newInstance("B", -150*time.Millisecond)

			select {
			case <-started:
			case <-time.After(5 * time.Second):
				t.Fatal("instance A never ran the job")
			}
			var err error
			switch how {
			case "Shutdown":
				err = a.Shutdown()
			case "RemoveJob":
				err = a.RemoveJob(id)
			case "Update":
				_, err = a.Update(id, def(), task, gocron.WithName("job"))
			}
			if err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			time.Sleep(1500 * time.Millisecond) // B fires the tick and the next one

			mu.Lock()
			defer mu.Unlock()
			first := runs[0].tick // A's interrupted run
			byTick := map[time.Time][]string{}
			for _, r := range runs {
				byTick[r.tick] = append(byTick[r.tick], r.instance)
			}
			if got := byTick[first]; len(got) != 1 {
				t.Errorf("tick %s, interrupted by %s on A, ran on %v; want once, on A", first.Format("15:04:05.000"), how, got)
			}
			for tick, on := range byTick {
				if len(on) > 1 {
					t.Errorf("tick %s ran %d times: on %v", tick.Format("15:04:05.000"), len(on), on)
				}
			}
		})
	}
}

// TestShutdownDuringLockIsNotUnavailable: a Shutdown that comes while Lock
// waits for the nodes cuts the Lock short. AfterLockError gets an error
// that matches ErrStopped and context.Canceled, and not
// redlock.ErrUnavailable, which users alert on: every node is healthy (a
// regression: the cut-short round counted its nodes as failed).
func TestShutdownDuringLockIsNotUnavailable(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	for _, p := range proxies {
		p.SetLatency(250 * time.Millisecond) // a round takes 500 ms
	}
	c, err := redlock.New(nodes, redlock.WithNodeTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	lockErrs := make(chan error, 4)
	s, err := scheduler.New(c,
		scheduler.WithLockerOptions(scheduler.WithLockTimeout(5*time.Second)),
		scheduler.WithGocronOptions(gocron.WithGlobalJobOptions(gocron.WithEventListeners(
			gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { lockErrs <- err })))))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}, 4)
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() { ran <- struct{}{} }),
		gocron.WithName("job")); err != nil {
		t.Fatal(err)
	}
	s.Start()
	// The next whole second fires the job; its Lock is then in its first
	// round, which takes 500 ms.
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second + 150*time.Millisecond).Sub(now))
	if err := s.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case err := <-lockErrs:
		if !errors.Is(err, scheduler.ErrStopped) || !errors.Is(err, context.Canceled) {
			t.Errorf("AfterLockError: %v; want an error matching scheduler.ErrStopped and context.Canceled", err)
		}
		if errors.Is(err, redlock.ErrUnavailable) {
			t.Errorf("AfterLockError: %v matches redlock.ErrUnavailable; every node is healthy", err)
		}
	case <-ran:
		t.Fatal("the job ran: the Shutdown did not come during its Lock")
	}
}

// TestLockTimeoutWithSlowNodesIsUnavailable: a Lock whose lock timeout
// ends before any quorum answered, on nodes slower than that, reports
// redlock.ErrUnavailable (the nodes are too slow to take the tick), not a
// cancellation and not ErrStopped.
func TestLockTimeoutWithSlowNodesIsUnavailable(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	nodes, proxies := cl.ProxiedClients(t)
	for _, p := range proxies {
		p.SetLatency(100 * time.Millisecond)
	}
	c, err := redlock.New(nodes, redlock.WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	locker, err := scheduler.NewLocker(c, scheduler.WithLockTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, err = locker.Lock(context.Background(), "job")
	if !errors.Is(err, redlock.ErrUnavailable) || errors.Is(err, scheduler.ErrStopped) {
		t.Errorf("Lock past its lock timeout on slow nodes = %v; want ErrUnavailable, not ErrStopped", err)
	}
}

// TestOutageReportsEveryTick: with 2 of 3 nodes down (frozen), every tick of a per-second job reaches AfterLockError
// with ErrUnavailable (only about half did: Lock retried for the whole
// 1 s lock timeout, and gocron skipped the next tick without calling
// Lock), and after the nodes come back the next ticks run.
func TestOutageReportsEveryTick(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	c := newRedlock(t, cl.Clients(t))
	var mu sync.Mutex
	var lockErrs []error
	runs := 0
	s, err := scheduler.New(c, scheduler.WithGocronOptions(gocron.WithGlobalJobOptions(gocron.WithEventListeners(
		gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) { mu.Lock(); lockErrs = append(lockErrs, err); mu.Unlock() })))))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() { mu.Lock(); runs++; mu.Unlock() }),
		gocron.WithName("job")); err != nil {
		t.Fatal(err)
	}
	// Frozen, not killed: a killed node's port may be taken by a server of
	// a test running in parallel (it was, once: that server granted the
	// lock and the job ran "during the outage"); a stopped one keeps it.
	cl[1].Stop(t)
	cl[2].Stop(t)
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown() })
	// 4 ticks in the first 4 s, each reported within its Lock's bound (750
	// ms for a per-second job: rounds whose calls to the killed nodes were
	// still dialling when their node wait ended are retried until then).
	time.Sleep(5200 * time.Millisecond)
	mu.Lock()
	reported, ranDuring, during := len(lockErrs), runs, fmt.Sprint(lockErrs)
	for _, err := range lockErrs {
		if !errors.Is(err, redlock.ErrUnavailable) {
			t.Errorf("AfterLockError during the outage: %v, want ErrUnavailable", err)
		}
	}
	mu.Unlock()
	if ranDuring != 0 || reported < 4 {
		t.Errorf("during a 5.2 s outage: %d runs and %d reported skips; want 0 runs and a report for each of the 4 ticks at least; lock errors: %s", ranDuring, reported, during)
	}
	cl[1].Cont(t)
	cl[2].Cont(t)
	time.Sleep(2500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if runs == 0 {
		t.Errorf("no run in the 2.5 s after the nodes came back; lock errors since: %v", lockErrs[reported:])
	}
}
