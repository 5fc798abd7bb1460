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
// tick of each job run on exactly one instance of a fleet whose schedulers
// share the same Redis nodes. It is safe for concurrent use; it starts one
// goroutine per running job (the lock's extension), which ends in Unlock.
//
// For every run, Lock takes, in one quorum round (redlock.WithRecord):
//
//   - the run lock "<prefix>job:<job>", held while the job runs and extended
//     every TTL/3, so that no other instance starts the job while a long run
//     goes on; released by Unlock;
//   - the tick record "<prefix>tick:<job>:<tick in Unix ms>", kept for twice
//     the clock tolerance and never released, so that instances whose
//     clocks lag (or that fire late) find the tick taken: exactly once per
//     tick, whatever the job's duration.
//
// docs/scheduling.md states the guarantee and its limits.
type Locker struct {
	client   *redlock.Client
	cfg      lockerConfig
	log      *slog.Logger
	tracer   trace.Tracer
	runCount metric.Int64Counter

	warnings *warnings
	nonce    string // tells this Locker's records from another process's with the same instance ID

	mu          sync.Mutex
	runs        map[context.Context]*runLock // by the job ctx gocron passes to Lock and the task
	resolutions map[string]resolution        // per job, set by Scheduler
}

// resolution is a tick grid: ticks are anchor + k*every.
type resolution struct{ every time.Duration }

// NewLocker returns a Locker that takes its locks through client. It
// performs no I/O and starts nothing. Errors match redlock.ErrInvalidArgument
// and name the bad value: a nil client, a TTL below 10 ms, a negative clock
// tolerance, a tick resolution below 1 ms, a lock timeout <= 0, and a run
// lock TTL or a tick-record lifetime on the tick resolution's grid (2 x
// clock tolerance, at least 100 ms, + the Lock bound) that the Client
// rejects (redlock.Client.CheckTTL: e.g. above its restart gate).
func NewLocker(client *redlock.Client, opts ...LockerOption) (*Locker, error) {
	cfg := lockerConfig{
		ttl:         DefaultTTL,
		tolerance:   DefaultClockTolerance,
		resolution:  DefaultTickResolution,
		prefix:      DefaultKeyPrefix,
		lockTimeout: DefaultLockTimeout,
		jitter:      DefaultLockJitter,
	}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("LockerOption %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	switch {
	case client == nil:
		return nil, invalidf("the *redlock.Client is nil")
	case cfg.ttl < 10*time.Millisecond:
		return nil, invalidf("TTL %v (WithTTL) is below the minimum 10ms", cfg.ttl)
	case cfg.tolerance < 0 || cfg.tolerance >= 24*time.Hour:
		return nil, invalidf("clock tolerance %v (WithClockTolerance) must be at least 0 and below 24h", cfg.tolerance)
	case cfg.resolution < time.Millisecond:
		return nil, invalidf("tick resolution %v (WithTickResolution) is below the minimum 1ms", cfg.resolution)
	case cfg.lockTimeout <= 0:
		return nil, invalidf("lock timeout %v (WithLockTimeout) is not positive", cfg.lockTimeout)
	case cfg.jitter < 0:
		return nil, invalidf("lock jitter %v (WithLockJitter) is negative", cfg.jitter)
	case cfg.instanceSet && cfg.instance == "":
		return nil, invalidf("instance ID (WithInstanceID) is empty")
	case len(cfg.instance) > maxInstance:
		return nil, invalidf("instance ID (WithInstanceID) is %d bytes, more than the maximum %d", len(cfg.instance), maxInstance)
	}
	if err := client.CheckTTL(cfg.ttl); err != nil {
		return nil, rejectedTTL(err, "run lock TTL %v (WithTTL)", cfg.ttl)
	}
	if err := cfg.checkRecords(client, cfg.resolution, ""); err != nil {
		return nil, err
	}
	if !cfg.instanceSet {
		cfg.instance = tracing.DefaultIdentity()
	}
	if cfg.clock == nil {
		cfg.clock = clockwork.NewRealClock()
	}
	log := cfg.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp, mp := cfg.tracer, cfg.meter
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(tracing.ScopeScheduler, metric.WithInstrumentationVersion(tracing.Version))
	runs, err := meter.Int64Counter(tracing.MetricJobRuns, metric.WithUnit("{run}"), metric.WithDescription("Job ticks by lock outcome."))
	if err != nil {
		return nil, fmt.Errorf("scheduler: creating the OpenTelemetry instruments: %w", err)
	}
	warns, err := newWarnings(meter, log)
	if err != nil {
		return nil, fmt.Errorf("scheduler: creating the OpenTelemetry instruments: %w", err)
	}
	return &Locker{
		client:      client,
		cfg:         cfg,
		log:         log,
		tracer:      tp.Tracer(tracing.ScopeScheduler, trace.WithInstrumentationVersion(tracing.Version)),
		runCount:    runs,
		warnings:    warns,
		nonce:       fmt.Sprintf("%08x", rand.Uint32()),
		runs:        make(map[context.Context]*runLock),
		resolutions: make(map[string]resolution),
	}, nil
}

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

// redlockText returns the text of a redlock error without its package
// prefix, to be quoted in the text of an error that wraps it.
func redlockText(err error) string { return strings.TrimPrefix(err.Error(), "redlock: ") }

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

// Tick returns the tick that a run of job starting now on this instance
// serves: the local time (WithClock) t, moved to the job's tick grid as
// (t + r/4) rounded down to a multiple of r, where r is the job's interval
// (jobs added through Scheduler.NewJob as duration jobs) or the tick
// resolution. A timer that fires up to r/4 early or 3r/4 late still maps to
// its own tick.
func (l *Locker) Tick(job string) time.Time {
	every := l.every(job)
	return l.cfg.clock.Now().Add(every / 4).Truncate(every)
}

// every returns the spacing of job's tick grid.
func (l *Locker) every(job string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.resolutions[job]; ok {
		return r.every
	}
	return l.cfg.resolution
}

// lockTimeout is the bound of one Lock of job: the lock timeout, at most
// the job's tick spacing less lockMargin, or half the spacing where that
// is longer (750 ms for per-second jobs, 50 ms for 100 ms ones). gocron
// computes a job's next run only after Lock returns, so a Lock that
// outlasted the spacing made it skip the next tick without calling Lock,
// and that skip was never reported; the margin covers gocron's own delays.
func (l *Locker) lockTimeout(job string) time.Duration { return l.cfg.lockBound(l.every(job)) }

// lockBound is the bound of one Lock of a job with tick spacing every
// (lockTimeout).
func (cfg lockerConfig) lockBound(every time.Duration) time.Duration {
	return min(cfg.lockTimeout, max(every/2, every-lockMargin))
}

// lockMargin is what a Lock leaves of its job's tick spacing (lockTimeout).
const lockMargin = 250 * time.Millisecond

// Lock implements gocron.Locker. key is the job's name. It decides without
// waiting for a busy job, in one quorum round: the run lock of the job,
// with the tick record written in the same script on each node (all or
// nothing), retried only when no one won it (a split vote) or nodes did
// not answer, all bounded by the lock timeout. On success the run lock is
// extended in the background until Unlock, and a lost lock cancels the
// run's context (RunContext).
//
// Errors (gocron skips the run and passes them to AfterLockError):
// ErrHeldElsewhere when another instance took this tick or runs the job
// (also matching ErrDuplicateInstance when that instance has this
// Locker's instance ID); an error matching redlock.ErrUnavailable (with
// the redlock *QuorumError) when too many Redis nodes still failed at the
// lock timeout; ErrStopped, with ctx's cause, when ctx ended (gocron
// stopped the job), never ErrUnavailable then; ErrUnstableName, for every
// tick, for an empty name or gocron's default name of an unnamed function,
// and redlock.ErrInvalidArgument for a name with a NUL byte.
// Lock never returns (nil, nil).
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	tick := l.Tick(key)
	// Started as "scheduler.run" (what a sampler sees), named for the job
	// and its outcome only when recorded: no name is built for nothing.
	sctx, span := l.tracer.Start(ctx, tracing.SpanJobRun, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(tracing.Job.String(key), tracing.Tick.String(tick.Format(tickFormat)),
			tracing.Instance.String(l.cfg.instance)))
	if err := checkName(key); err != nil {
		l.warn(ctx, warnUnstableName, key, "scheduler: job skipped: its name is not stable across builds, or not valid; name it with gocron.WithName", "err", err)
		l.skipped(ctx, span, key, err)
		return nil, err
	}
	lctx, cancel := context.WithTimeout(sctx, l.lockTimeout(key))
	defer cancel()
	if !l.jitter(ctx, key) {
		err := l.lockError(key, tick, fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)))
		l.skipped(ctx, span, key, err)
		return nil, err
	}
	run, err := l.take(ctx, lctx, key, tick)
	if err != nil {
		l.skipped(ctx, span, key, err)
		return nil, err
	}
	if span.IsRecording() {
		span.SetName(tracing.JobSpanName(key, tracing.OutcomeRan))
		span.SetAttributes(tracing.Outcome.String(tracing.OutcomeRan))
	}
	if l.runCount.Enabled(ctx) {
		l.runCount.Add(ctx, 1, metric.WithAttributes(tracing.Job.String(key), tracing.Outcome.String(tracing.OutcomeRan)))
	}
	rl := &runLock{l: l, job: key, tick: tick, jobCtx: ctx, run: run, span: span}
	// The extensions go on until Unlock, not until gocron cancels the
	// job's ctx (Shutdown, RemoveJob, Update, StopJobs): a task that
	// ignores its ctx runs on, and its run lock must hold until it returns.
	// The run's context still ends with the job's ctx.
	kctx, stop := run.Keep(context.WithValue(context.WithoutCancel(sctx), tickKey{}, tick))
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
	l.mu.Unlock()
	rl.watch()
	return rl, nil
}

// jitter waits the random delay before a Lock's first round
// (WithLockJitter), at most a quarter of job's tick spacing and half its
// lock timeout; false when ctx ended first.
func (l *Locker) jitter(ctx context.Context, job string) bool {
	bound := min(l.cfg.jitter, l.every(job)/4, l.lockTimeout(job)/2)
	if bound <= 0 {
		return true
	}
	// One of jitterSlots delays: the Locks of one instance that fire
	// together still share one pipeline per slot and node (a delay each
	// sent every call alone: 0.17 cores for 100 jobs on 5 instances, 0.07
	// with slots), while instances mostly pick different slots.
	t := time.NewTimer(time.Duration(rand.N(jitterSlots)) * (bound / jitterSlots))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitterSlots is the number of distinct start delays (WithLockJitter):
// 0, 1/4, 1/2 and 3/4 of the bound.
const jitterSlots = 4

// take acquires the run lock of job with the record of tick, in one round.
// A round that no single holder won (instances that fired at the same
// instant split the nodes between them, and each undid its minority) is
// retried after a short random delay until someone wins or lctx ends. A
// round that failed because nodes did not answer (a burst of ticks queued
// past the node timeout, a node restarting) is retried too, with a growing
// random delay, until lctx (the lock timeout) ends: every round is a full
// acquisition, undone where it failed, so retrying never gives a tick
// twice. A round lost to one holder with a quorum is final.
//
// When ctx (the job's: gocron cancels it at Shutdown, RemoveJob, Update and
// StopJobs) ends, take returns an error that matches ctx's cause and never
// redlock.ErrUnavailable: the nodes did not fail. When the lock timeout
// ends, it returns the error of the last round that ran to its end, or,
// when the first round had not ended yet, an error matching
// redlock.ErrUnavailable: no quorum answered within the lock timeout.
func (l *Locker) take(ctx, lctx context.Context, job string, tick time.Time) (*redlock.Lock, error) {
	record := l.cfg.prefix + "tick:" + job + ":" + strconv.FormatInt(tick.UnixMilli(), 10)
	resources := []string{l.cfg.prefix + "job:" + job}
	stopped := func() error {
		return l.lockError(job, tick, fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)))
	}
	// Each round waits for the nodes up to half the Lock's bound: a burst
	// of many jobs firing at once queues its commands for longer than a
	// node timeout made for single locks, and a round that waits costs
	// less than one that fails and is retried.
	nodeTimeout := max(l.client.NodeTimeout(), l.lockTimeout(job)/2)
	recordTTL := l.tickTTL(job)
	ttlText := nonceSep + strconv.FormatInt(recordTTL.Milliseconds(), 10)
	unavailable := 0
	var last error // of the last round that lctx did not cut short
	for {
		// The metadata is this instance, its clock and the record's TTL,
		// for the checks of instances that find the record (checkRecord).
		md := l.cfg.instance + clockSep + strconv.FormatInt(l.cfg.clock.Now().UnixMilli(), 10) + nonceSep + l.nonce
		if len(md)+len(ttlText) <= redlock.MaxMetadata {
			md += ttlText
		}
		lk, err := l.client.TryAcquire(lctx, resources, l.cfg.ttl, redlock.WithMetadata(md),
			redlock.WithRecord(record, recordTTL), redlock.WithNodeTimeout(nodeTimeout))
		var qerr *redlock.QuorumError
		isQuorum := errors.As(err, &qerr)
		switch {
		case err == nil:
			return lk, nil
		case ctx.Err() != nil:
			return nil, stopped()
		case isQuorum && !errors.Is(err, redlock.ErrUnavailable):
			if holder, taken := qerr.HolderMetadata(); taken {
				return nil, l.refused(ctx, job, tick, record, holder, qerr)
			}
		}
		switch {
		case lctx.Err() != nil && last != nil:
			return nil, last
		case lctx.Err() != nil:
			return nil, l.lockError(job, tick, &textError{errs: []error{redlock.ErrUnavailable, err},
				msg: fmt.Sprintf("no quorum answered within the %v lock timeout: %s", l.lockTimeout(job), redlockText(err))})
		}
		last = l.lockError(job, tick, err)
		if !isQuorum {
			return nil, last
		}
		delay := time.Millisecond + rand.N(splitDelay)
		if errors.Is(err, redlock.ErrUnavailable) {
			if down(qerr) {
				return nil, last // nodes refuse connections: a retry within the lock timeout will not help
			}
			unavailable++
			delay = rand.N(min(unavailableDelay<<min(unavailable, 8), maxUnavailableDelay))
		}
		t := time.NewTimer(delay)
		select {
		case <-lctx.Done():
			t.Stop()
			if ctx.Err() != nil {
				return nil, stopped()
			}
			return nil, last
		case <-t.C:
		}
	}
}

// refused returns the error of a tick that holder took, on a quorum of
// nodes, with the round's qerr; it checks the clocks against the record
// and the holder's instance ID against this Locker's.
func (l *Locker) refused(ctx context.Context, job string, tick time.Time, record, holder string, qerr *redlock.QuorumError) error {
	instance, _, nonce, _ := splitHolder(holder)
	e := &tickError{kind: tickHeld, job: job, tick: tick, err: qerr, holder: instance, what: "run"}
	for _, r := range qerr.Nodes {
		if r.Outcome == redlock.OutcomeHeld && r.Resource == record {
			e.what = "tick"
			l.checkRecord(ctx, job, r)
			break
		}
	}
	if instance == l.cfg.instance && e.what == "tick" {
		// Not this Locker's own record (a job firing twice in one tick):
		// another process writes records with this ID.
		if nonce != "" && nonce != l.nonce {
			e.duplicate = true
			l.warn(ctx, warnDuplicateInstance, job, "scheduler: another live instance uses this instance ID; give each instance its own (WithInstanceID)",
				"instance", l.cfg.instance, "tick", tick)
		}
	}
	return e
}

// down reports whether qerr's round failed because nodes refused it
// outright (errors, no timeouts): they are down, not slow. A Lock that
// retried them for the whole lock timeout made gocron skip the next tick
// without calling Lock, so that the skip was never reported.
func down(qerr *redlock.QuorumError) bool {
	return qerr.Count(redlock.OutcomeTimeout) == 0 && qerr.Count(redlock.OutcomeError) > 0
}

// splitDelay bounds the random delay before retrying a split round;
// unavailableDelay x 2^n (at most maxUnavailableDelay) the delay before
// the n-th retry of a round that nodes did not answer.
const (
	splitDelay          = 15 * time.Millisecond
	unavailableDelay    = 5 * time.Millisecond
	maxUnavailableDelay = 200 * time.Millisecond
)

// tickFormat formats ticks in spans and errors.
const tickFormat = "2006-01-02T15:04:05.000Z07:00"

// The metadata of a run lock and its tick record is
// "<instance>@<clock in Unix ms>/<the Locker's nonce>/<record TTL in ms>";
// earlier releases wrote it without the TTL, or the instance ID alone.
const (
	clockSep = "@"
	nonceSep = "/"
)

// splitHolder splits the metadata of a run lock or tick record into the
// instance ID, its clock reading, the writing Locker's nonce and the
// record's TTL; nonce is "" for metadata of the instance ID alone, and
// ttl 0 for metadata without it.
func splitHolder(md string) (instance string, clock time.Time, nonce string, ttl time.Duration) {
	i := strings.LastIndex(md, clockSep)
	if i < 0 {
		return md, time.Time{}, "", 0
	}
	at, rest, ok := strings.Cut(md[i+1:], nonceSep)
	ms, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || rest == "" {
		return md, time.Time{}, "", 0
	}
	nonce, ttlText, _ := strings.Cut(rest, nonceSep)
	if n, err := strconv.ParseInt(ttlText, 10, 64); err == nil && n > 0 {
		ttl = time.Duration(n) * time.Millisecond
	}
	return md[:i], time.UnixMilli(ms), nonce, ttl
}

// skipped ends the run span of a tick that does not run here.
func (l *Locker) skipped(ctx context.Context, span trace.Span, job string, err error) {
	outcome := tracing.OutcomeSkippedHeld
	switch {
	case errors.Is(err, redlock.ErrUnavailable):
		outcome = tracing.OutcomeSkippedDown
		if span.IsRecording() { // else the message is formatted for nothing
			span.SetAttributes(semconv.ErrorTypeKey.String(tracing.ErrorTypeUnavailable))
			span.SetStatus(codes.Error, err.Error())
		}
	case errors.Is(err, ErrHeldElsewhere):
		if span.IsRecording() {
			recordHolder(span, err)
		}
	case errors.Is(err, ErrStopped):
		outcome = tracing.OutcomeSkippedStopped
	default:
		outcome = "skipped"
		if errors.Is(err, ErrUnstableName) || errors.Is(err, redlock.ErrInvalidArgument) {
			outcome = tracing.OutcomeSkippedMisconfigured
		}
		if span.IsRecording() {
			span.SetAttributes(semconv.ErrorTypeKey.String(tracing.ErrorTypeOther))
			span.SetStatus(codes.Error, err.Error())
		}
	}
	if span.IsRecording() {
		span.SetName(tracing.JobSpanName(job, outcome))
		span.SetAttributes(tracing.Outcome.String(outcome))
	}
	span.End()
	if l.runCount.Enabled(ctx) { // else the options are built for nothing
		l.runCount.Add(ctx, 1, metric.WithAttributes(tracing.Job.String(job), tracing.Outcome.String(outcome)))
	}
}

// recordHolder records on a skipped tick's span the instance that holds
// the tick, named by err's quorum.
func recordHolder(span trace.Span, err error) {
	var q *redlock.QuorumError
	if !errors.As(err, &q) {
		return
	}
	if md, ok := q.HolderMetadata(); ok {
		instance, _, _, _ := splitHolder(md) // without its clock reading, nonce and TTL
		span.SetAttributes(tracing.Holder.String(instance))
	}
}

// lockError classifies a failed acquisition of job's tick.
func (l *Locker) lockError(job string, tick time.Time, err error) error {
	e := &tickError{job: job, tick: tick, err: err}
	var q *redlock.QuorumError
	switch {
	case errors.Is(err, ErrStopped):
		e.kind = tickStopped
	case errors.Is(err, redlock.ErrUnavailable):
		e.kind = tickUnavailable
	case errors.As(err, &q) && holderUnknown(q):
		// Refused without a quorum for one holder, and the nodes that
		// failed could complete one: whether the tick was taken is unknown.
		e.kind = tickUnavailable
		e.err = &textError{errs: []error{redlock.ErrUnavailable, err},
			msg: "the nodes that failed leave unknown whether another instance took the tick: " + redlockText(err)}
	}
	return e
}

// holderUnknown reports whether q's failed nodes (an error, no answer, a
// restart gate), counted as holding, would complete a quorum for the holder
// that most nodes named.
func holderUnknown(q *redlock.QuorumError) bool {
	failed := q.Count(redlock.OutcomeError) + q.Count(redlock.OutcomeTimeout) + q.Count(redlock.OutcomeGated)
	votes, best := map[string]int{}, 0
	for _, r := range q.Nodes {
		if r.Outcome == redlock.OutcomeHeld {
			votes[r.Holder]++
			best = max(best, votes[r.Holder])
		}
	}
	return failed > 0 && best > 0 && best+failed >= q.Quorum
}

// tickError is the error of a Lock that did not take its tick. Its
// message is built only when asked for: gocron skips the tick without
// reading it, and in a fleet every instance but one skips every tick.
type tickError struct {
	kind      int // tickHeld, tickUnavailable, tickStopped or 0
	job       string
	tick      time.Time
	err       error  // redlock's
	what      string // tickHeld: "tick" (its record refused) or "run" (the run lock)
	holder    string // tickHeld: the holder's instance ID
	duplicate bool   // tickHeld: the holder has this Locker's instance ID
}

const (
	tickHeld = 1 + iota
	tickUnavailable
	tickStopped
)

// Error reads `scheduler: job "J" tick T held by another instance: the tick
// was already taken by "H"` (or `its previous run is still running on
// "H"`), `scheduler: job "J" tick T skipped: Redis unavailable: <what
// redlock found>`, `scheduler: job "J" tick T skipped: the job was
// stopped ...`, or `scheduler: job "J" tick T skipped: <redlock's error>`.
// The holder's round is not quoted: a quorum named the holder, which is
// all it says.
func (e *tickError) Error() string {
	head := fmt.Sprintf("scheduler: job %q tick %s", e.job, e.tick.Format(time.RFC3339Nano))
	switch e.kind {
	case tickStopped:
		cause := strings.TrimPrefix(e.err.Error(), ErrStopped.Error()+": ")
		return head + " skipped: the job was stopped (Shutdown, RemoveJob, Update or StopJobs) while its lock was being taken (" + cause + ")"
	case tickUnavailable:
		return head + " skipped: Redis unavailable: " + redlockText(e.err)
	case tickHeld:
		reason := fmt.Sprintf("the tick was already taken by %q", e.holder)
		if e.what == "run" {
			reason = fmt.Sprintf("its previous run is still running on %q", e.holder)
		}
		if e.duplicate {
			reason += ", another live instance with this instance's ID; give each instance its own ID (WithInstanceID)"
		}
		return head + " held by another instance: " + reason
	}
	return head + " skipped: " + redlockText(e.err)
}

// Unwrap gives ErrHeldElsewhere for a tick held elsewhere (and
// ErrDuplicateInstance when the holder has this instance's ID), and
// redlock's error.
func (e *tickError) Unwrap() []error {
	switch {
	case e.duplicate:
		return []error{ErrHeldElsewhere, ErrDuplicateInstance, e.err}
	case e.kind == tickHeld:
		return []error{ErrHeldElsewhere, e.err}
	}
	return []error{e.err}
}

// tickTTL is how long a record of a tick of job lives: twice the clock
// tolerance (at least 100 ms) plus the job's Lock bound (lockTimeout). The
// instances' Locks of one tick start within the tolerance of each other and
// each takes its rounds (start delay and retries) within that bound, so the
// record outlives every round of its tick, and no round after the winner's
// run ended finds the tick free. This holds for instances that share their
// clock tolerance, lock timeout and tick resolution.
func (l *Locker) tickTTL(job string) time.Duration { return l.cfg.recordTTL(l.every(job)) }

// recordTTL is tickTTL for a job with tick spacing every, at most
// math.MaxInt64.
func (cfg lockerConfig) recordTTL(every time.Duration) time.Duration {
	base, bound := max(2*cfg.tolerance, 100*time.Millisecond), cfg.lockBound(every)
	if bound > math.MaxInt64-base {
		return math.MaxInt64
	}
	return base + bound
}

// checkRecords returns the error of tick records, for jobs with tick
// spacing every (job names one, or ""), whose TTL client rejects
// (redlock.Client.CheckTTL), or nil.
func (cfg lockerConfig) checkRecords(client *redlock.Client, every time.Duration, job string) error {
	ttl := cfg.recordTTL(every)
	err := client.CheckTTL(ttl)
	if err == nil {
		return nil
	}
	what := fmt.Sprintf("tick records of jobs every %v", every)
	if job != "" {
		what = fmt.Sprintf("job %q: tick records every %v", job, every)
	}
	return rejectedTTL(err, "%s live %v (2 x clock tolerance %v (WithClockTolerance), at least 100ms, + the Lock bound %v (WithLockTimeout))",
		what, ttl, cfg.tolerance, cfg.lockBound(every))
}

// rejectedTTL returns the error of a TTL that the Client rejected with err:
// it reads "scheduler: invalid argument: <what>: <why>" and wraps err.
func rejectedTTL(err error, what string, args ...any) error {
	why := strings.TrimPrefix(err.Error(), redlock.ErrInvalidArgument.Error()+": ")
	return &textError{msg: "scheduler: invalid argument: " + fmt.Sprintf(what, args...) + ": " + why, errs: []error{err}}
}

// RunContext returns the context of the run that ctx belongs to: pass the
// ctx gocron gives the task (a task function whose first parameter is
// context.Context receives it). The result is also cancelled, with a cause
// matching redlock.ErrLockLost, when the run's lock is lost, and it carries
// the run's *redlock.Lock (redlock.FromContext). For a ctx with no run under
// this Locker it returns ctx. The run's tick is in it too (TickFromContext).
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

// TickFromContext returns the tick that the run of ctx serves (see
// Locker.Tick), for a ctx returned by RunContext or derived from it; ok is
// false for any other ctx. Use it to label the work of a run, e.g. "the
// report for 12:00:00", identically on every instance.
func TickFromContext(ctx context.Context) (tick time.Time, ok bool) {
	tick, ok = ctx.Value(tickKey{}).(time.Time)
	return tick, ok
}

// runLock is the gocron.Lock of one run.
type runLock struct {
	l      *Locker
	job    string
	tick   time.Time
	jobCtx context.Context
	run    *redlock.Lock
	ctx    context.Context // cancelled when the run lock is lost or the job's ctx ends
	kept   context.Context // Keep's: cancelled when the run lock is lost
	stop   func() error
	span   trace.Span    // the run's span, ended by Unlock
	done   chan struct{} // closed by Unlock, ends watch
	once   sync.Once
	err    error
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
				"job", r.job, "tick", r.tick, "err", cause)
			if r.l.cfg.onLost != nil {
				r.l.cfg.onLost(r.job, cause)
			}
		}
	}()
}

// Unlock implements gocron.Lock. It stops the extension and releases the run
// lock on a context detached from ctx (gocron passes the job's ctx, already
// cancelled after Shutdown, StopJobs, RemoveJob or Update), bounded by the
// redlock node timeout. The tick record always stays until it expires, also
// when the run was interrupted: once Lock has returned, gocron runs the job,
// and whether it finished its work is unknown here, so the tick is never
// given back to another instance (at most once per tick). It returns the lost-lock
// or release error (gocron ignores it; it is also logged). Calling Unlock
// again returns the first result.
func (r *runLock) Unlock(ctx context.Context) error {
	r.once.Do(func() {
		lost := r.stop()
		close(r.done)
		dctx := trace.ContextWithSpan(context.WithoutCancel(ctx), r.span)
		rerr := r.run.Release(dctx)
		// Forgotten after the release: until then a Lock of the job that
		// finds the run lock held by this instance knows it is this run.
		r.l.mu.Lock()
		if r.l.runs[r.jobCtx] == r {
			delete(r.l.runs, r.jobCtx)
		}
		r.l.mu.Unlock()
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
			r.err = &textError{msg: fmt.Sprintf("scheduler: job %q tick %s: after the run, %s", r.job, r.tick.Format(time.RFC3339Nano), redlockText(rerr)),
				errs: []error{rerr}}
			r.l.log.Warn("scheduler: release after the job failed; the lock expires with its TTL", "job", r.job, "err", rerr)
		}
	})
	return r.err
}
