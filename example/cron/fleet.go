package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	exnodes "github.com/schedlock/schedlock/example/internal/nodes"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// jobSpec is one of the jobs every instance registers.
type jobSpec struct {
	name     string
	every    time.Duration // spacing of its ticks
	describe string        // for people
	define   func() gocron.JobDefinition
}

// jobs are the jobs of the demo. Their ticks are whole seconds (report) and
// multiples of 2 s since the zero time (sync: the Scheduler anchors a
// duration job d to now.Truncate(d)).
var jobs = []jobSpec{
	{
		name:     "report",
		every:    time.Second,
		describe: `cron "* * * * * *" (every second)`,
		define:   func() gocron.JobDefinition { return gocron.CronJob("* * * * * *", true) },
	},
	{
		name:     "sync",
		every:    2 * time.Second,
		describe: "duration job, every 2s",
		define:   func() gocron.JobDefinition { return gocron.DurationJob(2 * time.Second) },
	},
}

// runFleet runs the demo (in process or with child processes) and prints its
// summary. It returns an error when a tick ran twice or was missed.
func runFleet(ctx context.Context, cfg config, stdout io.Writer) error {
	nodes, err := exnodes.Start(cfg.redis)
	if err != nil {
		return err
	}
	defer nodes.Close() // last: after every scheduler and client has stopped
	if err := nodes.Ping(ctx); err != nil {
		return err
	}

	if cfg.status != "" {
		url, stop, err := serveStatus(cfg.status, nodes.Addrs, recordLength(cfg.duration))
		if err != nil {
			return err
		}
		defer stop() // before the nodes close
		fmt.Fprintf(stdout, "Status page of the fleet: %s (fleet controls on; -duration keeps it up longer)\n", url)
	}

	offsets := make([]time.Duration, cfg.instances)
	for i := range offsets {
		offsets[i] = cfg.offset(i)
	}
	rec := newRecorder(stdout, offsets)
	printHeader(stdout, cfg, nodes, offsets)

	start := time.Now()
	var stats []instanceStats
	if cfg.mode == "process" {
		stats, err = runProcesses(ctx, cfg, nodes.Addrs, rec, start)
	} else {
		stats, err = runInProcess(ctx, cfg, nodes.Addrs, rec, start)
	}
	if err != nil {
		return err
	}
	end := start.Add(cfg.duration)
	if now := time.Now(); now.Before(end) {
		end = now // interrupted
	}
	// Ticks are on the instances' clocks: judge the window in tick time,
	// where every instance was running.
	lo, hi := slices.Min(offsets), slices.Max(offsets)
	from, to := start.Add(judgeFrom+hi), end.Add(-judgeUntil+lo)
	var ex excuses
	if cfg.status != "" { // the page's pauses and runs now are not failures
		if ex, err = readExcuses(ctx, nodes.Addrs, recordLength(cfg.duration)); err != nil {
			return err
		}
	}
	err = rec.summarize(stdout, from, to, stats, ex)
	if perr := printRecord(ctx, stdout, nodes.Addrs, from, to, recordLength(cfg.duration)); perr != nil && err == nil {
		err = perr
	}
	return err
}

// printHeader tells what is about to happen.
func printHeader(w io.Writer, cfg config, nodes *exnodes.Set, offsets []time.Duration) {
	kind := "Redis nodes given by -redis"
	if nodes.Embedded() {
		kind = "embedded miniredis nodes"
	}
	where := "all in this process"
	if cfg.mode == "process" {
		where = "one child process each"
	}
	fmt.Fprintf(w, "%d scheduler instances (%s) share %d %s: %s.\n",
		cfg.instances, where, len(nodes.Addrs), kind, strings.Join(nodes.Addrs, ", "))
	fmt.Fprintf(w, "Every instance schedules the same jobs:\n")
	for _, j := range jobs {
		fmt.Fprintf(w, "  %-6s  %s\n", j.name, j.describe)
	}
	clocks := make([]string, len(offsets))
	for i, o := range offsets {
		clocks[i] = fmt.Sprintf("instance %d %s", i, formatOffset(o))
	}
	fmt.Fprintf(w, "Clock offsets: %s.\n", strings.Join(clocks, ", "))
	if spread := clockSpread(offsets); spread > scheduler.DefaultClockTolerance {
		fmt.Fprintf(w, "Note: the clocks differ by %v, more than the scheduler's clock tolerance (%v): expect clock_skew warnings; "+
			"each scheduled time still runs at most once, on the instance whose clock is ahead.\n",
			spread, scheduler.DefaultClockTolerance)
	}
	fmt.Fprintf(w, "Each scheduled time must run on exactly one instance; the others skip it. Running for %v.\n", cfg.duration)
	fmt.Fprintf(w, "Each line: the true time of the run (no offset), the job, its scheduled time on the instance's own clock, the instance.\n\n")
}

// clockSpread returns max - min of ds.
func clockSpread(ds []time.Duration) time.Duration {
	lo, hi := ds[0], ds[0]
	for _, d := range ds {
		lo, hi = min(lo, d), max(hi, d)
	}
	return hi - lo
}

// runInProcess runs every instance in this process until start + duration
// or until ctx is done. Shutdown is ordered: all schedulers, then all
// clients (the caller closes the nodes).
func runInProcess(ctx context.Context, cfg config, addrs []string, rec *recorder, start time.Time) ([]instanceStats, error) {
	instances := make([]*instance, 0, cfg.instances)
	closeAll := func() error {
		var errs []error
		for _, in := range instances {
			errs = append(errs, in.close())
		}
		return errors.Join(errs...)
	}
	for i := range cfg.instances {
		in, err := newInstance(i, cfg.offset(i), addrs, cfg, rec.add)
		if err != nil {
			_ = closeAll()
			return nil, err
		}
		instances = append(instances, in)
	}

	runCtx, cancel := context.WithDeadline(ctx, start.Add(cfg.duration))
	defer cancel()
	g, gctx := errgroup.WithContext(runCtx)
	for _, in := range instances {
		g.Go(func() error { return in.run(gctx) })
	}
	err := g.Wait() // every scheduler has shut down
	if cerr := closeAll(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	stats := make([]instanceStats, len(instances))
	for i, in := range instances {
		stats[i] = in.stats()
	}
	return stats, nil
}

// jobRun is one run of a job, as seen by the instance that ran it. It is also
// the JSON line a child process writes per run.
type jobRun struct {
	Job      string    `json:"job"`
	Tick     time.Time `json:"tick"`     // the tick it serves, on its instance's clock
	Instance int       `json:"instance"` // which instance ran it
	Start    time.Time `json:"start"`    // when it started, on the real clock
}

// instanceStats counts the ticks an instance skipped. A child process
// writes it as its last JSON line.
type instanceStats struct {
	Instance      int    `json:"instance"`
	HeldElsewhere int64  `json:"held_elsewhere"`        // the normal skip: another instance had the tick
	LockErrors    int64  `json:"lock_errors"`           // other skips, e.g. Redis unavailable
	FirstError    string `json:"first_error,omitempty"` // the first of LockErrors

	Unreported bool      `json:"-"` // process mode: the child ended without sending its counts
	KilledAt   time.Time `json:"-"` // -kill-one: when the parent killed it
}

// instance is one member of the fleet: what one replica of a service has.
type instance struct {
	id     int
	offset time.Duration
	rdbs   []*redis.Client
	locks  *redlock.Client
	sched  *scheduler.Scheduler

	held     atomic.Int64 // lock errors matching scheduler.ErrHeldElsewhere
	failed   atomic.Int64 // other lock errors
	mu       sync.Mutex
	firstErr error // first of failed
}

// newInstance connects to addrs with new clients and registers the jobs on a
// new scheduler whose clock is offset from the real one. Each run calls
// onRun, from gocron's goroutine, when it starts. Nothing runs before run.
func newInstance(id int, offset time.Duration, addrs []string, cfg config, onRun func(jobRun)) (*instance, error) {
	in := &instance{id: id, offset: offset}
	nodes := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		// ContextTimeoutEnabled lets a request that redlock gave up on
		// return at once instead of at the client's read timeout.
		rdb := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		in.rdbs = append(in.rdbs, rdb)
		nodes[i] = rdb
	}
	locks, err := redlock.New(nodes)
	if err != nil {
		_ = in.close()
		return nil, err
	}
	in.locks = locks
	lockerOpts := []scheduler.LockerOption{scheduler.WithClock(redlocktest.OffsetClock(offset)),
		scheduler.WithInstanceID(fmt.Sprintf("instance-%d", id)), scheduler.WithHistoryLength(recordLength(cfg.duration))}
	if cfg.ttl > 0 {
		lockerOpts = append(lockerOpts, scheduler.WithTTL(cfg.ttl))
	}
	in.sched, err = scheduler.New(locks, scheduler.WithLockerOptions(lockerOpts...))
	if err != nil {
		_ = in.close()
		return nil, fmt.Errorf("instance %d: %w", id, err)
	}
	for _, j := range jobs {
		task := gocron.NewTask(func(ctx context.Context) error {
			started := time.Now()
			ctx = in.sched.RunContext(ctx) // cancelled if this run loses its lock
			tick, _ := scheduler.TickFromContext(ctx)
			onRun(jobRun{Job: j.name, Tick: tick, Instance: id, Start: started})
			return work(ctx, cfg.jobTime)
		})
		_, err := in.sched.NewJob(j.define(), task,
			gocron.WithName(j.name), // the lock key: the same on every instance
			gocron.WithEventListeners(gocron.AfterLockError(in.lockError)))
		if err != nil {
			_ = in.sched.Shutdown()
			_ = in.close()
			return nil, fmt.Errorf("instance %d: job %s: %w", id, j.name, err)
		}
	}
	return in, nil
}

// work stands for the job's work: it takes d, or less if ctx ends.
func work(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// lockError counts a tick that gocron skipped because Lock failed.
func (in *instance) lockError(_ uuid.UUID, _ string, err error) {
	switch {
	case errors.Is(err, scheduler.ErrHeldElsewhere):
		in.held.Add(1) // the normal case: another instance has this tick
	case errors.Is(err, context.Canceled):
		// The scheduler is shutting down; not a failure.
	default:
		in.failed.Add(1) // Redis unavailable, or a bug
		in.mu.Lock()
		if in.firstErr == nil {
			in.firstErr = err
		}
		in.mu.Unlock()
	}
}

// run starts the scheduler, waits for ctx to end and shuts it down: it
// returns after every run of this instance has ended.
func (in *instance) run(ctx context.Context) error {
	in.sched.Start()
	<-ctx.Done()
	if err := in.sched.Shutdown(); err != nil {
		return fmt.Errorf("instance %d: shutdown: %w", in.id, err)
	}
	// A release returns on a quorum; Close lets its scripts for the other
	// nodes go out, and stops the Client, before close closes the clients.
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := in.locks.Close(cctx); err != nil {
		return fmt.Errorf("instance %d: close redlock: %w", in.id, err)
	}
	return nil
}

// close closes the instance's Redis clients; call it after run returned.
func (in *instance) close() error {
	var errs []error
	for _, rdb := range in.rdbs {
		errs = append(errs, rdb.Close())
	}
	return errors.Join(errs...)
}

// stats returns the instance's skip counts.
func (in *instance) stats() instanceStats {
	s := instanceStats{Instance: in.id, HeldElsewhere: in.held.Load(), LockErrors: in.failed.Load()}
	in.mu.Lock()
	if in.firstErr != nil {
		s.FirstError = in.firstErr.Error()
	}
	in.mu.Unlock()
	return s
}
