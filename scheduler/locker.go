package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/tracing"
)

var _ gocron.Locker = (*Locker)(nil)

// Locker is a gocron.Locker (gocron.WithDistributedLocker) that lets each
// scheduled time of each job run on exactly one instance of a fleet whose
// schedulers share the same Redis nodes. It is safe for concurrent use; it
// starts one goroutine per running job (the lock's extension), which ends
// in Unlock.
//
// A run serves a scheduled time of the job's own schedule (Lock), and
// takes, in one quorum round (redlock.WithHighWaterFirst: one node
// first, and the others unless that node's record refuses it):
//
//   - the run lock "<prefix>job:<job>", held while the job runs and
//     extended every TTL/3, so that no other instance starts the job while
//     a run goes on; released by Unlock;
//   - the job's record of scheduled times "<prefix>taken:<job>", raised to
//     the run's scheduled time and never lowered: an instance whose clock
//     lags, or whose run comes late, finds its scheduled time (or a later
//     one) taken, whatever the difference.
//
// Each run, miss and late skip is also written to the job's run record
// "<prefix>runs:<job>" (History). docs/scheduling.md states the guarantee
// and its limits.
type Locker struct {
	client   *redlock.Client
	cfg      lockerConfig
	log      *slog.Logger
	tracer   trace.Tracer
	runCount metric.Int64Counter

	warnings *warnings
	nonce    string    // tells this Locker's records from another process's with the same instance ID
	started  time.Time // on cfg.clock: a record with this ID written before it is a previous process's

	pauseRead chan struct{} // a slot: one read of the pauses at a time (readPausesNow)

	mu          sync.Mutex
	runs        map[context.Context]*runLock // by the job ctx gocron passes to Lock and the task
	jobs        map[string]*jobState
	follow      gocron.Scheduler      // Follow's, or nil
	pauses      map[string]pauseEntry // the fleet's pauses as last read (pause.go)
	pausesTried time.Time             // the last read a Lock tried (readPausesNow)
	watchers    int                   // fleet loops running that keep pauses read
}

// NewLocker returns a Locker that takes its locks through client. It
// performs no I/O and starts nothing. Errors match redlock.ErrInvalidArgument
// and name the bad value: a nil client, a TTL below 10 ms, a negative clock
// tolerance, a tick resolution below 1 ms, a lock timeout <= 0, a misfire
// threshold below 1 ms, a negative catch-up window, a history length out
// of 1..10,000, a retention below the misfire threshold (or catch-up
// window) plus the lock timeout and the clock tolerance, a run lock TTL
// that the Client rejects (redlock.Client.CheckTTL: e.g. above its
// restart gate), and a misfire threshold or catch-up window above the
// Client's restart gate.
func NewLocker(client *redlock.Client, opts ...LockerOption) (*Locker, error) {
	cfg := lockerConfig{
		ttl:         DefaultTTL,
		tolerance:   DefaultClockTolerance,
		resolution:  DefaultTickResolution,
		prefix:      DefaultKeyPrefix,
		lockTimeout: DefaultLockTimeout,
		jitter:      DefaultLockJitter,
		misfire:     DefaultMisfireThreshold,
		history:     DefaultHistoryLength,
		retention:   DefaultRecordRetention,
		poll:        DefaultFleetPoll,
	}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("LockerOption %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	if client == nil {
		return nil, invalidf("the *redlock.Client is nil")
	}
	if !cfg.misfireSet && client.RestartGate() > 0 {
		cfg.misfire = min(cfg.misfire, client.RestartGate())
	}
	if err := cfg.validate(client); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	log := cfg.logger
	if log == nil {
		log = slog.Default()
	}
	tp, mp := cfg.tracer, cfg.meter
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(tracing.ScopeScheduler, metric.WithInstrumentationVersion(tracing.Version))
	runs, err := meter.Int64Counter(tracing.MetricJobRuns, metric.WithUnit("{run}"),
		metric.WithDescription("Job runs and scheduled times by outcome."))
	if err != nil {
		return nil, fmt.Errorf("scheduler: creating the OpenTelemetry instruments: %w", err)
	}
	warns, err := newWarnings(meter, log)
	if err != nil {
		return nil, fmt.Errorf("scheduler: creating the OpenTelemetry instruments: %w", err)
	}
	return &Locker{
		client:    client,
		cfg:       cfg,
		log:       log,
		tracer:    tp.Tracer(tracing.ScopeScheduler, trace.WithInstrumentationVersion(tracing.Version)),
		runCount:  runs,
		warnings:  warns,
		nonce:     fmt.Sprintf("%08x", rand.Uint32()),
		started:   cfg.clock.Now(),
		runs:      make(map[context.Context]*runLock),
		jobs:      make(map[string]*jobState),
		pauseRead: make(chan struct{}, 1),
	}, nil
}

// validate checks cfg, naming the bad value.
func (cfg *lockerConfig) validate(client *redlock.Client) error {
	switch {
	case cfg.ttl < 10*time.Millisecond:
		return invalidf("TTL %v (WithTTL) is below the minimum 10ms", cfg.ttl)
	case cfg.tolerance < 0 || cfg.tolerance >= 24*time.Hour:
		return invalidf("clock tolerance %v (WithClockTolerance) must be at least 0 and below 24h", cfg.tolerance)
	case cfg.resolution < time.Millisecond:
		return invalidf("tick resolution %v (WithTickResolution) is below the minimum 1ms", cfg.resolution)
	case cfg.lockTimeout <= 0:
		return invalidf("lock timeout %v (WithLockTimeout) is not positive", cfg.lockTimeout)
	case cfg.jitter < 0:
		return invalidf("lock jitter %v (WithLockJitter) is negative", cfg.jitter)
	case cfg.instanceSet && cfg.instance == "":
		return invalidf("instance ID (WithInstanceID) is empty")
	case cfg.poll < 10*time.Millisecond || cfg.poll > time.Minute:
		return invalidf("fleet poll %v (WithFleetPoll) must be between 10ms and 1m", cfg.poll)
	case len(cfg.instance) > maxInstance:
		return invalidf("instance ID (WithInstanceID) is %d bytes, more than the maximum %d", len(cfg.instance), maxInstance)
	}
	if err := client.CheckTTL(cfg.ttl); err != nil {
		return rejectedTTL(err, "run lock TTL %v (WithTTL)", cfg.ttl)
	}
	return cfg.validateRecords(client)
}

// validateRecords checks the settings of the records of scheduled times
// and runs.
func (cfg *lockerConfig) validateRecords(client *redlock.Client) error {
	switch {
	case cfg.misfire < time.Millisecond:
		return invalidf("misfire threshold %v (WithMisfireThreshold) is below the minimum 1ms", cfg.misfire)
	case cfg.catchUp < 0:
		return invalidf("catch-up window %v (WithCatchUp) is negative", cfg.catchUp)
	case cfg.history < 1 || cfg.history > maxHistory:
		return invalidf("history length %d (WithHistoryLength) must be between 1 and %d", cfg.history, maxHistory)
	}
	if gate := client.RestartGate(); gate > 0 && max(cfg.misfire, cfg.catchUp) > gate {
		return invalidf("misfire threshold %v (WithMisfireThreshold) or catch-up window %v (WithCatchUp) is above the redlock Client's restart gate %v (redlock.WithRestartGating): "+
			"a node restarted without its data rejoins after the gate, and a run later than that could find its scheduled time free", cfg.misfire, cfg.catchUp, gate)
	}
	if cfg.retention < cfg.minRetention() {
		late := fmt.Sprintf("the misfire threshold %v", cfg.misfire)
		if cfg.catchUp > cfg.misfire {
			late = fmt.Sprintf("the catch-up window %v", cfg.catchUp)
		}
		return invalidf("record retention %v (WithRecordRetention) is below %v: a scheduled time's record must outlive its last Lock, "+
			"up to %s plus the lock timeout %v after it, on a clock up to the clock tolerance %v behind",
			cfg.retention, cfg.minRetention(), late, cfg.lockTimeout, cfg.tolerance)
	}
	return nil
}

// minRetention is the shortest record retention that keeps the record of
// a scheduled time until every Lock of it has passed: the latest is the
// misfire threshold (or the catch-up window) and a lock timeout after the
// scheduled time, on an instance whose clock is up to the clock tolerance
// behind the one that ran it. Saturates at the largest Duration.
func (cfg *lockerConfig) minRetention() time.Duration {
	d := max(cfg.misfire, cfg.catchUp)
	for _, x := range []time.Duration{cfg.lockTimeout, cfg.tolerance} {
		if d > math.MaxInt64-x {
			return math.MaxInt64
		}
		d += x
	}
	return d
}

// retention returns how long job's records stay on the nodes after a
// write: the record retention (WithRecordRetention), or, for a job whose
// scheduled times are further apart, two of its intervals from now plus
// the shortest retention NewLocker accepts (minRetention), so that the run
// after a missed scheduled time still finds the record of the one before
// it and reports the miss (a monthly job with the 30-day default).
func (l *Locker) retention(job string) time.Duration {
	l.mu.Lock()
	tt := l.state(job).table
	l.mu.Unlock()
	if tt == nil {
		return l.cfg.retention
	}
	now := l.cfg.clock.Now()
	t2 := tt.next(tt.next(now))
	if t2.IsZero() {
		return l.cfg.retention
	}
	span := t2.Sub(now)
	if floor := l.cfg.minRetention(); span <= math.MaxInt64-floor {
		span += floor
	}
	return max(l.cfg.retention, span)
}

// setDefaults fills in the defaults that cost something to make.
func (cfg *lockerConfig) setDefaults() {
	if !cfg.instanceSet {
		cfg.instance = tracing.DefaultIdentity()
	}
	if cfg.clock == nil {
		cfg.clock = clockwork.NewRealClock()
	}
	if cfg.location == nil {
		cfg.location = time.Local
	}
}

// maxHistory bounds WithHistoryLength.
const maxHistory = 10000

// invalidf returns an error that reads "scheduler: invalid argument:
// <message>" and matches redlock.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return &textError{msg: "scheduler: invalid argument: " + fmt.Sprintf(format, args...), errs: []error{redlock.ErrInvalidArgument}}
}

// textError is an error with a text of its own that matches errs
// (errors.Is, errors.As): one package prefix, however many errors of other
// packages it wraps.
type textError struct {
	msg  string
	errs []error
}

func (e *textError) Error() string   { return e.msg }
func (e *textError) Unwrap() []error { return e.errs }

// refusalText says, in the Locker's redlock error texts, what a node that
// refused a run lock holds (redlock.WithRefusalText): the holder by its
// instance ID, `instance "vm-7"`, not by the metadata of its run lock
// (splitHolder), which encodes a clock reading and a nonce for the
// Locker's own checks, and the job's record of scheduled times by the
// time it holds.
func refusalText(r redlock.NodeResult) string {
	who := strconv.Quote(r.Holder)
	if r.Holder == "" {
		who = "another owner"
	} else if id, at, _, _ := splitHolder(r.Holder); !at.IsZero() {
		who = "instance " + strconv.Quote(id)
	}
	if r.HolderMark != 0 {
		return "the job's record holds the scheduled time " +
			time.UnixMilli(r.HolderMark).UTC().Format(time.RFC3339Nano) + ", taken by " + who
	}
	text := "the run lock is held by " + who
	if r.HolderTTL > 0 {
		text += fmt.Sprintf(" for another %v", r.HolderTTL)
	}
	return text
}

// rejectedTTL returns the error of a TTL that the Client rejected with err:
// it reads "scheduler: <what>: invalid argument: <why>" and wraps err
// (which matches redlock.ErrInvalidArgument).
func rejectedTTL(err error, what string, args ...any) error {
	return &textError{msg: "scheduler: " + fmt.Sprintf(what, args...) + ": " + redlock.ErrorText(err), errs: []error{err}}
}

// unstableName matches gocron's default names for closures and method
// values (runtime function names such as main.main.func1, pkg.T.M-fm).
var unstableName = regexp.MustCompile(`\.func\d+(\.\d+)*$|-fm$`)

// checkName returns ErrUnstableName for names that differ between builds,
// and an error matching redlock.ErrInvalidArgument for a name that no
// Redis key of redlock can hold (a NUL byte).
func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: the job has no name; name it with gocron.WithName", ErrUnstableName)
	case unstableName.MatchString(name):
		return fmt.Errorf("%w: %q is gocron's default name for an unnamed function; name the job with gocron.WithName", ErrUnstableName, name)
	case strings.ContainsRune(name, 0):
		return &textError{msg: fmt.Sprintf("scheduler: invalid argument: job name %q contains a NUL byte; name the job without one", name),
			errs: []error{redlock.ErrInvalidArgument}}
	}
	return nil
}

// InstanceID returns the instance ID this Locker stores with its locks and
// records (WithInstanceID, or the default drawn by NewLocker): the name
// other instances give as the holder, and Run.Instance in the run record.
func (l *Locker) InstanceID() string { return l.cfg.instance }

// Follow makes the Locker read the schedules of s's jobs, by name, so that
// a Locker given to a scheduler of one's own (NewLocker, then
// gocron.WithDistributedLocker) knows each job's scheduled times as
// Scheduler does: call it once, after gocron.NewScheduler. A job's
// schedule is read at its first Lock and again a minute later at the
// earliest. Without Follow, a Locker serves the grid of the tick
// resolution (WithTickResolution) for every job. Duration jobs must still
// be anchored to their grid (gocron.WithStartAt(gocron.WithStartDateTimePast(
// time.Now().Truncate(d)))), as Scheduler does.
func (l *Locker) Follow(s gocron.Scheduler) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.follow = s
}

// Lock implements gocron.Locker. key is the job's name. It finds the
// scheduled time this run serves: a pending Scheduler.RunNow (a manual
// run, with none) or catch-up (WithCatchUp), else the latest scheduled
// time of the job's schedule at or before now on this instance's clock.
// A scheduled time that an earlier run of this
// instance already served, or that the misfire threshold has passed, is
// a late run: skipped with ErrLate, and recorded. Then it decides without
// waiting for a busy job, in one quorum round: the run lock of the job,
// with the job's record of scheduled times raised to this one (all or
// nothing on each node), retried only when no one won it (a split vote)
// or nodes did not answer, all bounded by the lock timeout. On success
// the run lock is extended in the background until Unlock, a lost lock
// cancels the run's context (RunContext), and Unlock reports the
// scheduled times that ran nowhere since the job's previous run as missed
// (WithMissedHandler).
//
// Errors (gocron skips the run and passes them to AfterLockError):
// ErrHeldElsewhere when another instance took this scheduled time or runs
// the job (also matching ErrDuplicateInstance when that instance has this
// Locker's instance ID); ErrLate (above; also when a later scheduled time
// was taken); an error matching redlock.ErrUnavailable (with the redlock
// *QuorumError) when too many Redis nodes still failed at the lock
// timeout; an error matching redlock.ErrMisconfigured, at once, when too
// many nodes answered with an error an operator must fix (its text names
// the nodes and the fix); ErrStopped, with ctx's cause, when ctx ended (gocron stopped
// the job), never ErrUnavailable then; ErrPaused for a scheduled time of a
// job paused across the fleet (taken, recorded as paused, not run: see
// Scheduler.Pause); ErrUnstableName, for every run, for
// an empty name or gocron's default name of an unnamed function, and
// redlock.ErrInvalidArgument for a name with a NUL byte.
// Lock never returns (nil, nil).
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	now := l.cfg.clock.Now()
	if err := checkName(key); err != nil {
		_, span := l.startSpan(ctx, key, claim{kind: kindScheduled})
		l.warn(ctx, warnUnstableName, key, "scheduler: job skipped: its name is not stable across builds, or not valid; name it with gocron.WithName", "err", err)
		l.skipped(ctx, span, key, err)
		return nil, err
	}
	paused := l.paused(ctx, key)
	c, err := l.claim(key, now)
	sctx, span := l.startSpan(ctx, key, c)
	if err != nil {
		l.late(ctx, span, key, c, now, err)
		return nil, err
	}
	run, err := l.acquire(ctx, sctx, key, c)
	if err != nil {
		l.done(key, nil)
		if errors.Is(err, ErrLate) { // a later scheduled time was taken
			l.late(ctx, span, key, c, now, err)
			return nil, err
		}
		l.skipped(ctx, span, key, err)
		c.answer(err)
		return nil, err
	}
	if paused && c.kind != kindManual {
		err := l.skipPaused(ctx, span, key, c, run, now)
		c.answer(err)
		return nil, err
	}
	rl := l.start(ctx, sctx, span, key, c, run)
	c.answer(nil)
	return rl, nil
}

// startSpan starts the span of a run as "scheduler.run": it is named for
// the job and its outcome only when recorded, so that no name is built
// for nothing.
func (l *Locker) startSpan(ctx context.Context, job string, c claim) (context.Context, trace.Span) {
	attrs := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(tracing.Job.String(job), tracing.Instance.String(l.cfg.instance), tracing.RunKind.String(c.kind))}
	ctx, span := l.tracer.Start(ctx, tracing.SpanJobRun, attrs...)
	if span.IsRecording() && !c.at.IsZero() {
		span.SetAttributes(tracing.Tick.String(c.at.Format(tickFormat)))
	}
	return ctx, span
}

// acquire takes the run's locks after the start delay, within the run's
// Lock bound.
func (l *Locker) acquire(ctx, sctx context.Context, job string, c claim) (*redlock.Lock, error) {
	bound := l.lockBound(c)
	lctx, cancel := context.WithTimeout(sctx, bound)
	defer cancel()
	if !l.jitter(ctx, min(l.cfg.jitter, bound/2, gapTo(c)/4)) {
		return nil, l.fail(job, c, errStopped, fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)))
	}
	return l.take(ctx, lctx, job, c, bound)
}

// lockBound is the bound of one Lock: the lock timeout, and at most the
// time to the job's next scheduled time less lockMargin, or half of it
// where that is longer (750 ms for per-second jobs, 50 ms for 100 ms
// ones). gocron computes a job's next run only after Lock returns, so a
// Lock that outlasted it made gocron skip that scheduled time without
// calling Lock, and the skip was never reported; the margin covers
// gocron's own delays.
func (l *Locker) lockBound(c claim) time.Duration {
	gap := gapTo(c)
	return max(min(l.cfg.lockTimeout, max(gap/2, gap-lockMargin)), time.Millisecond)
}

// gapTo returns the time from a claim's Lock to the job's next scheduled
// time, or a day when there is none.
func gapTo(c claim) time.Duration {
	if c.next.IsZero() {
		return 24 * time.Hour
	}
	return c.next.Sub(c.now)
}

// lockMargin is what a Lock leaves before its job's next scheduled time
// (lockBound).
const lockMargin = 250 * time.Millisecond

// jitter waits a random delay of 0, 1/4, 1/2 or 3/4 of bound before a
// Lock's first round; false when ctx ended first. The Locks of one
// instance that fire together still share one pipeline per delay and
// node, while instances mostly pick different delays.
func (l *Locker) jitter(ctx context.Context, bound time.Duration) bool {
	if bound <= 0 {
		return true
	}
	t := time.NewTimer(time.Duration(rand.N(jitterSlots)) * (bound / jitterSlots))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitterSlots is the number of distinct start delays (WithLockJitter).
const jitterSlots = 4

// tickFormat formats scheduled times in spans and errors.
const tickFormat = "2006-01-02T15:04:05.000Z07:00"

// start sets up the run of a granted Lock: its extension, its context and
// its entry in l.runs.
func (l *Locker) start(ctx, sctx context.Context, span trace.Span, job string, c claim, run *redlock.Lock) *runLock {
	if span.IsRecording() {
		span.SetName(tracing.JobSpanName(job, tracing.OutcomeRan))
		span.SetAttributes(tracing.Outcome.String(tracing.OutcomeRan))
	}
	l.count(ctx, job, tracing.OutcomeRan, 1)
	rl := &runLock{l: l, job: job, claim: c, started: l.cfg.clock.Now(), jobCtx: ctx, run: run, span: span}
	// The extensions go on until Unlock, not until gocron cancels the
	// job's ctx (Shutdown, RemoveJob, Update, StopJobs): a task that
	// ignores its ctx runs on, and its run lock must hold until it returns.
	// The run's context still ends with the job's ctx.
	kctx, stop := run.Keep(context.WithValue(context.WithoutCancel(sctx), tickKey{}, c.tick()))
	rctx, cancelRun := context.WithCancelCause(kctx)
	stopAfter := context.AfterFunc(ctx, func() { cancelRun(context.Cause(ctx)) })
	rl.ctx, rl.kept = rctx, kctx
	rl.stop = func() error {
		stopAfter()
		lost := stop()
		cancelRun(lost)
		return lost
	}
	l.mu.Lock()
	l.runs[ctx] = rl
	l.state(job).run = rl
	if c.kind != kindManual {
		l.state(job).ran = run.Metadata()
	}
	l.mu.Unlock()
	rl.watch()
	return rl
}

// count adds n to the runs counter for job and outcome.
func (l *Locker) count(ctx context.Context, job, outcome string, n int64) {
	if l.runCount.Enabled(ctx) { // else the options are built for nothing
		l.runCount.Add(ctx, n, metric.WithAttributes(tracing.Job.String(job), tracing.Outcome.String(outcome)))
	}
}

// skipped ends the run span of a Lock that failed and counts it.
func (l *Locker) skipped(ctx context.Context, span trace.Span, job string, err error) {
	outcome := outcomeOf(err)
	l.logSkip(ctx, outcome, job, err)
	if span.IsRecording() {
		switch outcome {
		case tracing.OutcomeSkippedDown, tracing.OutcomeSkippedGated, "skipped", tracing.OutcomeSkippedMisconfigured:
			kind := tracing.ErrorTypeOther
			switch {
			case outcome == tracing.OutcomeSkippedDown || outcome == tracing.OutcomeSkippedGated:
				kind = tracing.ErrorTypeUnavailable
			case errors.Is(err, redlock.ErrMisconfigured):
				kind = tracing.ErrorTypeMisconfigured
			}
			span.SetAttributes(semconv.ErrorTypeKey.String(kind))
			span.SetStatus(codes.Error, err.Error())
		case tracing.OutcomeSkippedHeld:
			var e *runError
			if errors.As(err, &e) && e.holder != "" {
				span.SetAttributes(tracing.Holder.String(e.holder))
			}
		}
		span.SetName(tracing.JobSpanName(job, outcome))
		span.SetAttributes(tracing.Outcome.String(outcome))
	}
	span.End()
	l.count(ctx, job, outcome, 1)
}

// outcomeOf returns the runs counter's outcome of a failed Lock.
func outcomeOf(err error) string {
	switch {
	case errors.Is(err, ErrStopped):
		return tracing.OutcomeSkippedStopped
	case errors.Is(err, redlock.ErrGated):
		return tracing.OutcomeSkippedGated
	case errors.Is(err, redlock.ErrUnavailable):
		return tracing.OutcomeSkippedDown
	case errors.Is(err, redlock.ErrMisconfigured):
		return tracing.OutcomeSkippedMisconfigured
	case errors.Is(err, ErrHeldElsewhere):
		return tracing.OutcomeSkippedHeld
	case errors.Is(err, ErrLate):
		return tracing.OutcomeSkippedLate
	case errors.Is(err, ErrPaused):
		return tracing.OutcomeSkippedPaused
	case errors.Is(err, ErrUnstableName) || errors.Is(err, redlock.ErrInvalidArgument):
		return tracing.OutcomeSkippedMisconfigured
	}
	return "skipped"
}

// RunContext returns the context of the run that ctx belongs to: pass the
// ctx gocron gives the task (a task function whose first parameter is
// context.Context receives it). The result is also cancelled, with a cause
// matching redlock.ErrLockLost, when the run's lock is lost, and it carries
// the run's *redlock.Lock (redlock.FromContext). For a ctx with no run under
// this Locker it returns ctx. The run's scheduled time is in it too
// (TickFromContext).
func (l *Locker) RunContext(ctx context.Context) context.Context {
	l.mu.Lock()
	rl := l.runs[ctx]
	l.mu.Unlock()
	if rl == nil {
		return ctx
	}
	return rl.ctx
}

type tickKey struct{}

// TickFromContext returns the scheduled time that the run of ctx serves,
// for a ctx returned by RunContext or derived from it: the same on every
// instance, whatever its clock, so that it can label the run's work ("the
// report for 12:00:00"). For a manual run (RunNow) it is the time its Lock
// began on this instance's clock. ok is false for any other ctx.
//
// The instant is the same everywhere, its location is not: a cron or
// duration job's time is in the location of the Locker's clock reading
// (time.Local with the real clock), a daily, weekly or monthly job's in
// the scheduler's location (WithLocation), a one-time job's as gocron's
// schedule gives it, and a manual run's carries a monotonic clock
// reading. History's Run.Scheduled for the same run is decoded from JSON
// (often UTC). Compare times with time.Time.Equal, not ==, and key maps
// by t.UnixMilli(), not by time.Time.
func TickFromContext(ctx context.Context) (tick time.Time, ok bool) {
	tick, ok = ctx.Value(tickKey{}).(time.Time)
	return tick, ok
}

// runLock is the gocron.Lock of one run.
type runLock struct {
	l       *Locker
	job     string
	claim   claim
	started time.Time // on the Locker's clock
	jobCtx  context.Context
	run     *redlock.Lock
	ctx     context.Context // cancelled when the run lock is lost or the job's ctx ends
	kept    context.Context // Keep's: cancelled when the run lock is lost
	stop    func() error
	span    trace.Span    // the run's span, ended by Unlock
	done    chan struct{} // closed by Unlock, ends watch
	once    sync.Once
	err     error

	mu      sync.Mutex
	outcome string // set by the Scheduler's gocron monitor: ok or failed
	errText string
}

// watch reports a lost lock while the run goes on.
func (r *runLock) watch() {
	r.done = make(chan struct{})
	go func() {
		select {
		case <-r.done:
		case <-r.kept.Done(): // also after the job's ctx ended: the task may run on
			cause := context.Cause(r.kept)
			if !errors.Is(cause, redlock.ErrLockLost) {
				return
			}
			r.l.log.Error("scheduler: lock lost while the job was running; its run context is cancelled",
				"job", r.job, "scheduled", r.claim.at, "err", cause)
			if r.l.cfg.onLost != nil {
				r.l.cfg.onLost(r.job, cause)
			}
		}
	}()
}

// Unlock implements gocron.Lock. It stops the extension, reports the
// scheduled times that ran nowhere before this run's (WithMissedHandler),
// and releases the run lock, writing them and the run to the run record
// in the release's script (redlock.WithReleaseLog), on a context detached
// from
// ctx (gocron passes the job's ctx, already cancelled after Shutdown,
// StopJobs, RemoveJob or Update), each bounded by the redlock node
// timeout. The job's record of scheduled times keeps this run's scheduled
// time, also when the run was interrupted: once Lock has returned, gocron
// runs the job, and whether it finished its work is unknown here, so the
// scheduled time is never given back to another instance (at most once).
// It returns the lost-lock or release error (gocron ignores it; it is
// also logged). Calling Unlock again returns the first result.
func (r *runLock) Unlock(ctx context.Context) error {
	r.once.Do(func() {
		lost := r.stop()
		close(r.done)
		dctx := trace.ContextWithSpan(context.WithoutCancel(ctx), r.span)
		// The run record's entries go with the release, in its script.
		entries := encode(r.job, append(r.l.missed(dctx, r.job, r.claim, r.run.PreviousMark()), r.entry(lost)))
		rerr := r.run.Release(dctx, redlock.WithReleaseLog(r.l.historyKey(r.job), r.l.cfg.history, r.l.retention(r.job), entries...))
		// Forgotten after the release: until then a Lock of the job that
		// finds the run lock held by this instance knows it is this run.
		r.l.mu.Lock()
		if r.l.runs[r.jobCtx] == r {
			delete(r.l.runs, r.jobCtx)
		}
		r.l.mu.Unlock()
		r.l.done(r.job, r)
		if lost != nil {
			r.span.AddEvent(tracing.EventLockLost)
			r.span.SetAttributes(semconv.ErrorTypeKey.String(tracing.ErrorTypeLockLost))
			r.span.SetStatus(codes.Error, lost.Error())
		}
		r.span.End()
		switch {
		case lost != nil:
			r.err = lost
		case rerr != nil:
			r.err = &textError{msg: fmt.Sprintf("scheduler: job %q %s: after the run, %s", r.job, r.claim.what(), redlock.ErrorText(rerr)),
				errs: []error{rerr}}
			if quorumReleased(rerr) {
				// redlock logs the node that could not run it, once.
				r.l.log.Debug("scheduler: released on a quorum; a node could not run the release", "job", r.job, "err", rerr)
			} else {
				r.l.log.Warn("scheduler: release after the job failed; the lock expires with its TTL", "job", r.job, "err", rerr)
			}
		}
	})
	return r.err
}

// quorumReleased reports whether err, a Release's, says that a quorum
// released the lock and only some node could not run the release: it
// matches none of redlock's failure sentinels then (redlock.Lock.Release).
func quorumReleased(err error) bool {
	for _, s := range []error{redlock.ErrLockLost, redlock.ErrUnavailable, redlock.ErrMisconfigured, redlock.ErrClosed, redlock.ErrInvalidArgument} {
		if errors.Is(err, s) {
			return false
		}
	}
	return true
}

// finished records the outcome gocron reported for the run (the
// Scheduler's monitor).
func (r *runLock) finished(outcome string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcome = outcome
	if err != nil {
		r.errText = err.Error()
	}
}
