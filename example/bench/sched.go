package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
)

// Scheduler-scale metric names.
const (
	mJobTicks        = "job_ticks"
	mRunsPerTick     = "runs_per_job_tick"
	mMissed          = "missed_job_ticks"
	mDup             = "duplicate_job_ticks"
	mServerCmdsTick  = "server_cmds_per_job_tick"
	mClientCmdsTick  = "client_cmds_per_job_tick"
	mCPUCores        = "client_cpu_cores"
	mCPUPerTickUS    = "client_cpu_us_per_job_tick"
	mRedisCPUCores   = "redis_cpu_cores"
	mStolenCores     = "stolen_cpu_cores"
	mLockErrHeld     = "lock_errors_held_elsewhere"
	mLockErrOther    = "lock_errors_other"
	mInstances       = "instances"
	mJobs            = "jobs"
	mWindowSeconds   = "window_s"
	mClientCPUPerIns = "client_cpu_cores_per_instance"
)

// tickRecorder counts runs per job and tick (Unix second); with explain
// (-sched-explain) it also keeps, per job, which instance ran which tick
// and the Lock errors of the window, for explainTick.
type tickRecorder struct {
	mu      sync.Mutex
	jobs    int
	runs    map[int64][]int32
	explain bool
	events  map[int][]string // job: "bench-2 ran 12:00:01", "bench-3: <Lock error>"
}

func (r *tickRecorder) add(job int, tick time.Time, instance string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := tick.Unix()
	c := r.runs[t]
	if c == nil {
		c = make([]int32, r.jobs)
		r.runs[t] = c
	}
	c[job]++
	if r.explain {
		r.events[job] = append(r.events[job], instance+" ran "+tick.UTC().Format(time.RFC3339))
	}
}

// lockError keeps a Lock error of job (explain only).
func (r *tickRecorder) lockError(job int, instance string, err error) {
	if !r.explain {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events[job] = append(r.events[job], instance+": "+err.Error())
}

// explainTick returns what the instances did for job at tick: the runs
// and the Lock errors that name its scheduled time. r.mu is held.
func (r *tickRecorder) explainTick(job int, tick time.Time) []string {
	at := tick.UTC().Format(time.RFC3339)
	var out []string
	for _, e := range r.events[job] {
		if strings.Contains(e, " ran "+at) || strings.Contains(e, "scheduled time "+at+" ") {
			out = append(out, e)
		}
	}
	return out
}

// runScheduler runs runSchedOnce for each job count.
func (b *bench) runScheduler(ctx context.Context) error {
	for _, jobs := range b.cfg.schedJobs {
		if err := b.runSchedOnce(ctx, jobs); err != nil {
			return err
		}
	}
	return nil
}

// runSchedOnce runs jobs cron jobs ("* * * * * *") on each of
// cfg.schedInstances scheduler.Scheduler instances in this process (each
// with its own go-redis clients and redlock.Client, as separate processes
// would have) on the first cfg.schedNodes nodes, and measures a window of
// whole ticks after a warm-up.
func (b *bench) runSchedOnce(ctx context.Context, jobs int) error {
	n := b.cfg.schedNodes
	if len(b.nodes) < n {
		b.logf("sched: skipped: needs %d nodes", n)
		return nil
	}
	nodes := b.nodes[:n]
	rec := &tickRecorder{jobs: jobs, runs: map[int64][]int32{}, explain: b.cfg.schedExplain, events: map[int][]string{}}
	var cnt counter
	var held, other atomic.Int64
	var lastOther atomic.Value // an error of the window
	var inWindow atomic.Bool
	var clients []*redis.Client
	defer func() { closeAll(clients) }()
	var scheds []*scheduler.Scheduler
	defer func() {
		for _, s := range scheds {
			_ = s.Shutdown()
		}
	}()
	for i := range b.cfg.schedInstances {
		cs := goRedisClients(nodes.addrs(), &cnt)
		clients = append(clients, cs...)
		uc := make([]redis.UniversalClient, len(cs))
		for j, c := range cs {
			uc[j] = c
		}
		rc, err := redlock.New(uc)
		if err != nil {
			return err
		}
		instance := fmt.Sprintf("bench-%d", i)
		s, err := scheduler.New(rc, scheduler.WithLockerOptions(scheduler.WithInstanceID(instance)))
		if err != nil {
			return err
		}
		scheds = append(scheds, s)
		onLockErr := gocron.AfterLockError(func(_ uuid.UUID, name string, err error) {
			if inWindow.Load() {
				if j, err2 := strconv.Atoi(strings.TrimPrefix(name, "job-")); err2 == nil {
					rec.lockError(j, instance, err)
				}
			}
			if errors.Is(err, scheduler.ErrHeldElsewhere) {
				held.Add(1)
				return
			}
			other.Add(1)
			if inWindow.Load() {
				lastOther.Store(err.Error())
			}
		})
		for j := range jobs {
			task := gocron.NewTask(func(ctx context.Context) {
				if tick, ok := scheduler.TickFromContext(s.RunContext(ctx)); ok {
					rec.add(j, tick, instance)
				}
			})
			if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), task,
				gocron.WithName(fmt.Sprintf("job-%d", j)), gocron.WithEventListeners(onLockErr)); err != nil {
				return err
			}
		}
	}
	for _, s := range scheds {
		s.Start()
	}
	// The window starts and ends half-way between ticks and holds whole
	// ticks only.
	t0 := time.Now().Add(b.cfg.schedWarmup).Truncate(time.Second).Add(time.Second + 500*time.Millisecond)
	win := b.cfg.schedDur.Round(time.Second)
	win = max(win, time.Second)
	t1 := t0.Add(win)
	b.logf("sched: %d jobs x %d instances on %d nodes; window %s .. %s", jobs, b.cfg.schedInstances, n,
		t0.Format("15:04:05.000"), t1.Format("15:04:05.000"))
	if err := sleepUntil(ctx, t0); err != nil {
		return err
	}
	cpu0 := processCPU()
	srv0, err := nodes.commandCalls(ctx)
	if err != nil {
		return err
	}
	cli0 := cnt.n.Load()
	rcpu0 := nodes.cpu()
	steal0, stealOK := stolenCPU()
	held0, other0 := held.Load(), other.Load()
	stopProfile := func() error { return nil }
	if b.cfg.profile != "" { // the window, for -cpuprofile
		var path string
		if path, stopProfile, err = b.startProfile(fmt.Sprintf("ours-sched-%djobs.pprof", jobs)); err != nil {
			return err
		}
		b.logf("sched: profiling the window into %s", path)
	}
	w0 := time.Now()
	inWindow.Store(true)
	if err := sleepUntil(ctx, t1); err != nil {
		_ = stopProfile()
		return err
	}
	wall := time.Since(w0)
	if err := stopProfile(); err != nil {
		return err
	}
	inWindow.Store(false)
	cpu := processCPU() - cpu0
	srv1, err := nodes.commandCalls(ctx)
	if err != nil {
		return err
	}
	cli := cnt.n.Load() - cli0
	rcpu := nodes.cpu() - rcpu0
	steal1, _ := stolenCPU()
	heldN, otherN := held.Load()-held0, other.Load()-other0
	// Let the runs of the last ticks finish, then stop.
	time.Sleep(time.Second)
	for _, s := range scheds {
		_ = s.Shutdown()
	}
	scheds = nil

	jobTicks := jobs * int(win/time.Second)
	var runs, missed, dup int
	rec.mu.Lock()
	// The ticks of the window: the whole seconds between t0 and t1.
	for t := t0.Add(500 * time.Millisecond); t.Before(t1); t = t.Add(time.Second) {
		c := rec.runs[t.Unix()]
		for j := range jobs {
			var k int32
			if c != nil {
				k = c[j]
			}
			runs += int(k)
			switch {
			case k == 0:
				missed++
			case k > 1:
				dup++
			}
			if k != 1 && rec.explain {
				tick := t.Truncate(time.Second)
				b.logf("sched: job-%d at %s ran %d times:\n\t%s", j, tick.UTC().Format(time.RFC3339), k,
					strings.Join(rec.explainTick(j, tick), "\n\t"))
			}
		}
	}
	rec.mu.Unlock()
	res := result{Workload: wSched, Nodes: n, Lib: libOurs, Metrics: map[string]float64{
		mInstances:       float64(b.cfg.schedInstances),
		mJobs:            float64(jobs),
		mWindowSeconds:   win.Seconds(),
		mJobTicks:        float64(jobTicks),
		mRunsPerTick:     float64(runs) / float64(jobTicks),
		mMissed:          float64(missed),
		mDup:             float64(dup),
		mServerCmdsTick:  float64(srv1-srv0) / float64(jobTicks),
		mClientCmdsTick:  float64(cli) / float64(jobTicks),
		mCPUCores:        cpu.Seconds() / wall.Seconds(),
		mClientCPUPerIns: cpu.Seconds() / wall.Seconds() / float64(b.cfg.schedInstances),
		mCPUPerTickUS:    us(cpu) / float64(jobTicks),
		mRedisCPUCores:   rcpu.Seconds() / wall.Seconds(),
		mLockErrHeld:     float64(heldN),
		mLockErrOther:    float64(otherN),
	}}
	if stealOK {
		res.Metrics[mStolenCores] = (steal1 - steal0).Seconds() / wall.Seconds()
	}
	if s, ok := lastOther.Load().(string); ok {
		if len(s) > 400 {
			s = s[:400] + "…"
		}
		res.Note = "an other lock error: " + s
	}
	b.add(res)
	return nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// processCPU returns the user + system CPU time of this process.
// stolenCPU returns the CPU time that the hypervisor gave other guests
// while this machine's vCPUs wanted to run ("steal" in /proc/stat), summed
// over all CPUs; ok is false where /proc/stat has no steal column. A
// window that lost CPU this way misses ticks that the same code meets on a
// quiet machine: the report gives it beside the misses.
func stolenCPU() (d time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	ticks, err := strconv.ParseInt(f[8], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ticks) * time.Second / 100, true // USER_HZ is 100 on Linux
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
