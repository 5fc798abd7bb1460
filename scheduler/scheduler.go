package scheduler

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/schedlock/schedlock/redlock"
)

var _ gocron.Scheduler = (*Scheduler)(nil)

// Scheduler is a gocron.Scheduler whose jobs run once per scheduled time
// across every instance that uses the same Redis nodes. It embeds the
// gocron scheduler, so every gocron method works as documented by gocron;
// NewJob, Update, Jobs and Start add what a fleet needs:
//
//   - a job must have a stable name (gocron.WithName): an empty name or
//     gocron's default name for a closure ("main.main.func1") fails with
//     ErrUnstableName, a name that NewJob or Update gave to another job of
//     this Scheduler that still has it with ErrDuplicateName (a name given
//     through the embedded gocron methods, s.Scheduler.NewJob or Update, is
//     not reliably caught);
//   - the job's schedule gives its scheduled times, which every instance
//     computes alike: a schedule whose times gocron counts from each
//     instance's own start fails with ErrRandomSchedule (random intervals)
//     or ErrUnsharedSchedule (cron's "@every", daily, weekly or monthly
//     intervals above 1);
//   - a duration job (gocron.DurationJob(d)) is anchored to the wall-clock
//     grid of multiples of d (gocron.WithStartAt with the current time
//     rounded down to d), so that instances started at different times
//     fire at the same instants; it replaces a start time of the caller's
//     (gocron.WithStartDateTime: use a cron job for one);
//   - the jobs NewJob, Update and Jobs return run RunNow as a manual run
//     (Job.RunNow), and Start catches up (WithCatchUp).
//
// Safe for concurrent use, as the gocron scheduler is.
type Scheduler struct {
	gocron.Scheduler
	locker *Locker

	mu sync.Mutex // serialises NewJob/Update so that name checks hold
	// names maps each name that NewJob and Update gave a job to that job's
	// ID, so that the duplicate check does not list every job (gocron's
	// Jobs sorts them all: registering n jobs took O(n² log n), 3.2 s for
	// 4,000). An entry may be stale: its job was removed or renamed since
	// (by any method), or a failed check removed it; settle confirms a hit
	// against Jobs, and rebuilds the index from Jobs whenever it has
	// doubled since the last rebuild (indexed), so that it does not grow
	// with names long gone.
	names   map[string]uuid.UUID
	indexed int

	// jobsVersion counts the changes NewJob and Update made to the jobs:
	// the fleet loop writes the registry again when it moved.
	jobsVersion atomic.Uint64

	fleetMu sync.Mutex
	fleet   *fleetLoop // running from Start to Shutdown or StopJobs; nil otherwise

	fingerMu   sync.Mutex // guards the cache of jobSet
	jobList    []string
	finger     string
	fingerAt   uint64
	fingerTime time.Time
}

// Option configures New.
type Option func(*schedConfig)

type schedConfig struct {
	locker  []LockerOption
	gocron  []gocron.SchedulerOption
	monitor gocron.MonitorStatus
}

// WithLockerOptions passes options to the Scheduler's Locker (NewLocker).
func WithLockerOptions(opts ...LockerOption) Option {
	return func(c *schedConfig) { c.locker = append(c.locker, opts...) }
}

// WithGocronOptions passes options to gocron.NewScheduler, after the ones New
// sets (gocron.WithClock with the Locker's clock, gocron.WithLocation with
// its location, gocron.WithDistributedLocker and gocron.WithMonitorStatus).
// Do not pass gocron.WithDistributedElector (with an elector gocron
// consults no locker), gocron.WithLocation (set WithLocation among the
// Locker's options, so that both read schedules alike) or
// gocron.WithMonitor and WithMonitorStatus (they replace the monitor that
// tells the run record each run's outcome: use WithMonitor).
func WithGocronOptions(opts ...gocron.SchedulerOption) Option {
	return func(c *schedConfig) { c.gocron = append(c.gocron, opts...) }
}

// WithMonitor passes m every call of the gocron monitor that the Scheduler
// installs (gocron.WithMonitorStatus) to learn each run's outcome for the
// run record. Default: none; nil means none.
func WithMonitor(m gocron.MonitorStatus) Option {
	return func(c *schedConfig) { c.monitor = m }
}

// New returns a gocron scheduler whose jobs are locked through client with a
// new Locker. Like gocron.NewScheduler it starts nothing until Start.
// Errors: those of NewLocker (matching redlock.ErrInvalidArgument), a nil
// Option or gocron option (the same), and those of gocron.NewScheduler.
func New(client *redlock.Client, opts ...Option) (*Scheduler, error) {
	var cfg schedConfig
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("option %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	for i, o := range cfg.gocron {
		if o == nil {
			return nil, invalidf("gocron option %d of %d (WithGocronOptions) is nil", i+1, len(cfg.gocron))
		}
	}
	locker, err := NewLocker(client, cfg.locker...)
	if err != nil {
		return nil, err
	}
	gopts := append([]gocron.SchedulerOption{
		gocron.WithClock(locker.cfg.clock),
		gocron.WithLocation(locker.cfg.location),
		gocron.WithDistributedLocker(locker),
		gocron.WithMonitorStatus(&monitor{l: locker, next: cfg.monitor}),
	}, cfg.gocron...)
	s, err := gocron.NewScheduler(gopts...)
	if err != nil {
		return nil, &textError{msg: "scheduler: creating the gocron scheduler: " + err.Error(), errs: []error{err}}
	}
	return &Scheduler{Scheduler: s, locker: locker}, nil
}

// monitor is the gocron.MonitorStatus through which the Scheduler learns
// each run's outcome, before gocron calls Unlock.
type monitor struct {
	l    *Locker
	next gocron.MonitorStatus
}

func (m *monitor) IncrementJob(id uuid.UUID, name string, tags []string, status gocron.JobStatus) {
	if m.next != nil {
		m.next.IncrementJob(id, name, tags, status)
	}
}

func (m *monitor) RecordJobTiming(start, end time.Time, id uuid.UUID, name string, tags []string) {
	if m.next != nil {
		m.next.RecordJobTiming(start, end, id, name, tags)
	}
}

func (m *monitor) RecordJobTimingWithStatus(start, end time.Time, id uuid.UUID, name string, tags []string, status gocron.JobStatus, err error) {
	m.l.finished(name, status, err)
	if m.next != nil {
		m.next.RecordJobTimingWithStatus(start, end, id, name, tags, status, err)
	}
}

// finished passes the outcome gocron reports for job's run in progress
// here to the run.
func (l *Locker) finished(job string, status gocron.JobStatus, err error) {
	l.mu.Lock()
	run := l.state(job).run
	l.mu.Unlock()
	if run == nil {
		return
	}
	outcome := outcomeOK
	if status != gocron.Success {
		outcome = outcomeFailed
	}
	run.finished(outcome, err)
}

// Locker returns the Scheduler's Locker.
func (s *Scheduler) Locker() *Locker { return s.locker }

// RunContext is Locker().RunContext: the run's context, cancelled also when
// the run's lock is lost. Call it first thing in a task:
//
//	gocron.NewTask(func(ctx context.Context) error {
//		ctx = s.RunContext(ctx)
//		...
//	})
func (s *Scheduler) RunContext(ctx context.Context) context.Context {
	return s.locker.RunContext(ctx)
}

// InstanceID returns the instance ID of the Scheduler's Locker
// (Locker.InstanceID).
func (s *Scheduler) InstanceID() string { return s.locker.InstanceID() }

// History returns the newest n entries of job's run record
// (Locker.History).
func (s *Scheduler) History(ctx context.Context, job string, n int) ([]Run, error) {
	return s.locker.History(ctx, job, n)
}

// NewJob is gocron's NewJob with the checks described on Scheduler. On an
// error no job is left in the scheduler. The Job it returns runs
// RunNow as a manual run (Job.RunNow). A nil def, task or job option is
// an error matching redlock.ErrInvalidArgument (gocron would panic).
func (s *Scheduler) NewJob(def gocron.JobDefinition, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	if err := checkJob("NewJob", def, task, opts); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.Scheduler.NewJob(def, task, opts...)
	if err != nil {
		return nil, err
	}
	return s.settle(j, def, task, opts)
}

// Update is gocron's Update with the checks described on Scheduler. gocron
// has replaced the job's definition before the checks run, so a job whose
// new definition fails them is removed, not restored. A nil def, task or
// job option is an error matching redlock.ErrInvalidArgument, and the job
// stays as it was.
func (s *Scheduler) Update(id uuid.UUID, def gocron.JobDefinition, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	if err := checkJob("Update", def, task, opts); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.Scheduler.Update(id, def, task, opts...)
	if err != nil {
		return nil, err
	}
	return s.settle(j, def, task, opts)
}

// checkJob rejects the nil arguments of NewJob and Update (call), which
// gocron would panic on.
func checkJob(call string, def gocron.JobDefinition, task gocron.Task, opts []gocron.JobOption) error {
	switch {
	case def == nil:
		return invalidf("the job definition (%s) is nil", call)
	case task == nil:
		return invalidf("the task (%s) is nil", call)
	}
	for i, o := range opts {
		if o == nil {
			return invalidf("job option %d of %d (%s) is nil", i+1, len(opts), call)
		}
	}
	return nil
}

// Jobs is gocron's Jobs, each as a Job whose RunNow is a manual run.
func (s *Scheduler) Jobs() []gocron.Job {
	jobs := s.Scheduler.Jobs()
	for i, j := range jobs {
		jobs[i] = &Job{Job: j, s: s}
	}
	return jobs
}

// Start is gocron's Start, and it starts the Scheduler's fleet loop
// (WithFleetPoll): this instance's heartbeat and its jobs' registry on the
// nodes (what Status shows), and the fleet's pauses and run-now requests
// (Pause, RequestRun), read every poll. Then, with WithCatchUp, it asks
// for a catch-up run of each job whose latest scheduled time is within the
// catch-up window (WithCatchUp), which runs once across the fleet unless
// an instance ran that scheduled time.
func (s *Scheduler) Start() {
	s.Scheduler.Start()
	s.startFleet()
	if s.locker.cfg.catchUp <= 0 {
		return
	}
	now := s.locker.cfg.clock.Now()
	for _, j := range s.Scheduler.Jobs() {
		at, ok := latest(s.locker.timetable(j.Name()), now, time.Time{})
		if !ok || now.Sub(at) > s.locker.cfg.catchUp {
			continue
		}
		r := s.locker.request(j.Name(), at)
		if err := j.RunNow(); err != nil {
			s.locker.cancel(j.Name(), r)
			s.locker.log.Warn("scheduler: gocron refused a catch-up run", "job", j.Name(), "scheduled", at, "err", err)
		}
	}
}

// Shutdown tells the fleet loop to stop, shuts gocron down (gocron's
// Shutdown), and returns once the fleet loop has ended too: its last
// heartbeat, bounded by the node timeout, says this instance stopped, and
// a run-now request it took has had its answer. Its error is gocron's
// Shutdown's (gocron.ErrStopSchedulerTimedOut when running jobs outlast
// gocron's stop timeout, gocron.WithStopTimeout). A last heartbeat that
// fails is not reported: the fleet then sees this instance fall silent
// (Status) rather than stopped.
func (s *Scheduler) Shutdown() error {
	wait := s.stopFleet()
	defer wait()
	return s.Scheduler.Shutdown()
}

// ShutdownWithContext is Shutdown with gocron's ShutdownWithContext.
func (s *Scheduler) ShutdownWithContext(ctx context.Context) error {
	wait := s.stopFleet()
	defer wait()
	return s.Scheduler.ShutdownWithContext(ctx)
}

// StopJobs stops the fleet loop and gocron's jobs (gocron's StopJobs), as
// Shutdown does; Start starts both again.
func (s *Scheduler) StopJobs() error {
	wait := s.stopFleet()
	defer wait()
	return s.Scheduler.StopJobs()
}

// StopJobsWithContext is StopJobs with gocron's StopJobsWithContext.
func (s *Scheduler) StopJobsWithContext(ctx context.Context) error {
	wait := s.stopFleet()
	defer wait()
	return s.Scheduler.StopJobsWithContext(ctx)
}

// job returns the Scheduler's job named name, or nil.
func (s *Scheduler) job(name string) *Job {
	for _, j := range s.Scheduler.Jobs() {
		if j.Name() == name {
			return &Job{Job: j, s: s}
		}
	}
	return nil
}

// Job is a gocron.Job of a Scheduler: RunNow runs it as a manual run.
type Job struct {
	gocron.Job
	s *Scheduler
}

// RunNow asks gocron for a run of the job now, as a manual run: it takes
// the job's run lock, so that it never overlaps a run of the job on any
// instance, but no scheduled time (the job's scheduled runs go on as
// before), and the run record keeps it as manual. It returns once that
// run's Lock has decided, at most the lock timeout (WithLockTimeout) plus
// 5 s later: nil when the run started, or the Lock's error, e.g. one
// matching ErrHeldElsewhere while a run of the job is in progress on an
// instance; gocron's own errors (gocron.ErrJobRunNowFailed,
// ErrJobNotFound) as they come. A run still queued in gocron then (a wait
// mode) runs later as a scheduled run; gocron drops a RunNow of a job that
// runs here in singleton or limit reschedule mode, and the next run of the
// job that starts before that wait ends runs as the manual one. Safe for
// concurrent use.
func (j *Job) RunNow() error { return j.runNow(context.Background()) }

// runNow is RunNow, cut short (the request withdrawn, if no Lock took it
// yet) when ctx ends.
func (j *Job) runNow(ctx context.Context) error {
	l := j.s.locker
	r := l.request(j.Name(), time.Time{})
	if err := j.Job.RunNow(); err != nil {
		l.cancel(j.Name(), r)
		return err
	}
	wait := l.cfg.lockTimeout + 5*time.Second
	if wait < l.cfg.lockTimeout {
		wait = math.MaxInt64 // a lock timeout within 5 s of the largest Duration
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err := <-r.done:
		return err
	case <-t.C:
		l.cancel(j.Name(), r) // still queued in gocron, or dropped by it
		return nil
	case <-ctx.Done():
		l.cancel(j.Name(), r)
		return context.Cause(ctx)
	}
}

// settle checks the name and schedule of the new job j, gives the Locker
// its timetable, and anchors a duration job to its grid, re-creating it
// under the same ID.
func (s *Scheduler) settle(j gocron.Job, def gocron.JobDefinition, task gocron.Task, opts []gocron.JobOption) (gocron.Job, error) {
	name := j.Name()
	fail := func(err error) (gocron.Job, error) {
		_ = s.Scheduler.RemoveJob(j.ID())
		return nil, err
	}
	if err := checkName(name); err != nil {
		return fail(err)
	}
	tt, err := newTimetable(j.Schedule(), s.locker.cfg.location)
	if err != nil {
		return fail(fmt.Errorf("%w (job %q)", err, name))
	}
	if err := s.index(j); err != nil {
		return fail(err)
	}
	s.locker.setTimetable(name, tt)
	s.jobsVersion.Add(1)
	d, ok := tt.(grid)
	if !ok {
		return &Job{Job: j, s: s}, nil
	}
	anchor := s.locker.cfg.clock.Now().Truncate(time.Duration(d))
	aligned := append(append([]gocron.JobOption(nil), opts...),
		gocron.WithStartAt(gocron.WithStartDateTimePast(anchor)),
		gocron.WithIdentifier(j.ID()))
	if err := s.Scheduler.RemoveJob(j.ID()); err != nil {
		return nil, recreateError(name, err)
	}
	j, err = s.Scheduler.NewJob(def, task, aligned...)
	if err != nil {
		return nil, recreateError(name, err)
	}
	return &Job{Job: j, s: s}, nil
}

// index checks that no other job of the Scheduler has j's name, and
// records it in the index of names.
func (s *Scheduler) index(j gocron.Job) error {
	name := j.Name()
	if id, ok := s.names[name]; ok && id != j.ID() {
		for _, other := range s.Scheduler.Jobs() {
			if other.ID() != j.ID() && other.Name() == name {
				return fmt.Errorf("%w: job %s is already named %q", ErrDuplicateName, other.ID(), name)
			}
		}
	}
	if s.names == nil {
		s.names = map[string]uuid.UUID{}
	}
	s.names[name] = j.ID() // a re-created duration job keeps its ID
	if len(s.names) > 2*s.indexed+64 {
		s.names = make(map[string]uuid.UUID, len(s.names))
		for _, job := range s.Scheduler.Jobs() {
			s.names[job.Name()] = job.ID()
		}
		s.indexed = len(s.names)
	}
	return nil
}

// recreateError is the error of a duration job that could not be
// re-created on its grid.
func recreateError(name string, err error) error {
	return &textError{msg: fmt.Sprintf("scheduler: re-creating duration job %q on its grid: %s", name, err.Error()), errs: []error{err}}
}
