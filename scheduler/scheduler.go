package scheduler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/schedlock/schedlock/redlock"
)

var _ gocron.Scheduler = (*Scheduler)(nil)

// Scheduler is a gocron.Scheduler whose jobs run once per tick across every
// instance that uses the same Redis nodes. It embeds the gocron scheduler,
// so every gocron method works as documented by gocron; NewJob and Update
// add the checks and settings that a fleet needs:
//
//   - a job must have a stable name (gocron.WithName): an empty name or
//     gocron's default name for a closure ("main.main.func1") fails with
//     ErrUnstableName, a name that NewJob or Update gave to another job of
//     this Scheduler that still has it with ErrDuplicateName (a name given
//     through the embedded gocron methods, s.Scheduler.NewJob or Update, is
//     not reliably caught);
//   - a random-interval job (gocron.DurationRandomJob) fails with
//     ErrRandomSchedule: instances share no ticks, so it would run once per
//     instance;
//   - a duration job (gocron.DurationJob(d)) is anchored to the wall-clock
//     grid of multiples of d (gocron.WithStartAt with the current time
//     rounded down to d), so that instances started at different times tick
//     at the same instants, and its ticks are identified on that grid; a
//     duration job whose tick records (2 x clock tolerance, at least 100
//     ms, + its Lock bound) have a TTL that the redlock Client rejects
//     (redlock.Client.CheckTTL: e.g. above its restart gate) fails with an
//     error matching redlock.ErrInvalidArgument.
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
}

// Option configures New.
type Option func(*schedConfig)

type schedConfig struct {
	locker []LockerOption
	gocron []gocron.SchedulerOption
}

// WithLockerOptions passes options to the Scheduler's Locker (NewLocker).
func WithLockerOptions(opts ...LockerOption) Option {
	return func(c *schedConfig) { c.locker = append(c.locker, opts...) }
}

// WithGocronOptions passes options to gocron.NewScheduler, after the ones New
// sets (gocron.WithClock with the Locker's clock, and
// gocron.WithDistributedLocker). Do not pass gocron.WithDistributedElector:
// with an elector gocron consults no locker.
func WithGocronOptions(opts ...gocron.SchedulerOption) Option {
	return func(c *schedConfig) { c.gocron = append(c.gocron, opts...) }
}

// New returns a gocron scheduler whose jobs are locked through client with a
// new Locker. Like gocron.NewScheduler it starts nothing until Start.
// Errors: those of NewLocker (matching redlock.ErrInvalidArgument) and of
// gocron.NewScheduler.
func New(client *redlock.Client, opts ...Option) (*Scheduler, error) {
	var cfg schedConfig
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("option %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	locker, err := NewLocker(client, cfg.locker...)
	if err != nil {
		return nil, err
	}
	gopts := append([]gocron.SchedulerOption{
		gocron.WithClock(locker.cfg.clock),
		gocron.WithDistributedLocker(locker),
	}, cfg.gocron...)
	s, err := gocron.NewScheduler(gopts...)
	if err != nil {
		return nil, &textError{msg: "scheduler: creating the gocron scheduler: " + gocronText(err), errs: []error{err}}
	}
	return &Scheduler{Scheduler: s, locker: locker}, nil
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

// NewJob is gocron's NewJob with the checks described on Scheduler. On an
// error no job is left in the scheduler.
func (s *Scheduler) NewJob(def gocron.JobDefinition, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
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
// new definition fails them is removed, not restored.
func (s *Scheduler) Update(id uuid.UUID, def gocron.JobDefinition, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j, err := s.Scheduler.Update(id, def, task, opts...)
	if err != nil {
		return nil, err
	}
	return s.settle(j, def, task, opts)
}

// settle checks the name of the new job j and anchors a duration job to
// its grid, re-creating it under the same ID.
func (s *Scheduler) settle(j gocron.Job, def gocron.JobDefinition, task gocron.Task, opts []gocron.JobOption) (gocron.Job, error) {
	name := j.Name()
	fail := func(err error) (gocron.Job, error) {
		_ = s.Scheduler.RemoveJob(j.ID())
		return nil, err
	}
	if err := checkName(name); err != nil {
		return fail(err)
	}
	if r, ok := j.Schedule().(gocron.DurationRandomJobSchedule); ok {
		return fail(fmt.Errorf("%w: job %q runs every %v to %v at random; use a fixed interval (gocron.DurationJob) or a cron schedule",
			ErrRandomSchedule, name, r.Min, r.Max))
	}
	if id, ok := s.names[name]; ok && id != j.ID() {
		for _, other := range s.Scheduler.Jobs() {
			if other.ID() != j.ID() && other.Name() == name {
				return fail(fmt.Errorf("%w: job %s is already named %q", ErrDuplicateName, other.ID(), name))
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
	ds, ok := j.Schedule().(gocron.DurationJobSchedule)
	if !ok || ds.Duration <= 0 {
		s.locker.setResolution(name, 0)
		return j, nil
	}
	if err := s.locker.cfg.checkRecords(s.locker.client, ds.Duration, name); err != nil {
		return fail(err)
	}
	anchor := s.locker.cfg.clock.Now().Truncate(ds.Duration)
	aligned := append(append([]gocron.JobOption(nil), opts...),
		gocron.WithStartAt(gocron.WithStartDateTimePast(anchor)),
		gocron.WithIdentifier(j.ID()))
	if err := s.Scheduler.RemoveJob(j.ID()); err != nil {
		return nil, recreateError(name, err)
	}
	j, err := s.Scheduler.NewJob(def, task, aligned...)
	if err != nil {
		return nil, recreateError(name, err)
	}
	s.locker.setResolution(name, ds.Duration)
	return j, nil
}

// recreateError is the error of a duration job that could not be
// re-created on its tick grid.
func recreateError(name string, err error) error {
	return &textError{msg: fmt.Sprintf("scheduler: re-creating duration job %q on its tick grid: %s", name, gocronText(err)), errs: []error{err}}
}

// gocronText returns the text of a gocron error without gocron's package
// prefix, to be quoted in the text of an error that wraps it.
func gocronText(err error) string { return strings.TrimPrefix(err.Error(), "gocron: ") }

// setResolution sets the tick grid of job (0: the default resolution).
func (l *Locker) setResolution(job string, every time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if every <= 0 {
		delete(l.resolutions, job)
		return
	}
	l.resolutions[job] = resolution{every: every}
}
