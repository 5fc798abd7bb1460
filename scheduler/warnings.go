package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/tracing"
)

// Misconfigurations that the Locker detects while it runs. Each one is
// counted every time in schedlock.scheduler.warnings (attribute
// schedlock.warning with the kind below, and the job) and logged at Warn on
// the configured logger (WithLogger) at most once a minute per kind and job.
const (
	// warnUnstableName: a job whose name differs between builds (empty, or
	// gocron's default name for an unnamed function); its runs are
	// skipped with ErrUnstableName.
	warnUnstableName = "unstable_name"
	// warnDuplicateInstance: another process writes records with this
	// Locker's instance ID (WithInstanceID).
	warnDuplicateInstance = "duplicate_instance"
	// warnClockSkew: the instance that took a scheduled time had a clock
	// further from this one's than the clock tolerance.
	warnClockSkew = "clock_skew"
	// warnSettingsMismatch: the instance that took a scheduled time runs
	// the job on another schedule (or in another location).
	warnSettingsMismatch = "settings_mismatch"
	// warnLate: a run came too late for its scheduled time (ErrLate).
	warnLate = "late"
)

// warnEvery is how often one kind of warning is logged for one job.
const warnEvery = time.Minute

// maxInstance is the longest instance ID: its clock reading, nonce and
// retention (clockSep, up to 20 digits, nonceSep, 8 hex digits, nonceSep,
// up to 20 digits) must fit in the lock's metadata.
const maxInstance = redlock.MaxMetadata - 51

type warnings struct {
	log    *slog.Logger
	count  metric.Int64Counter
	offset metric.Float64Histogram

	mu     sync.Mutex
	logged map[[2]string]time.Time // by kind and job: when last logged
}

func newWarnings(meter metric.Meter, log *slog.Logger) (*warnings, error) {
	count, err := meter.Int64Counter(tracing.MetricWarnings, metric.WithUnit("{warning}"),
		metric.WithDescription("Misconfigurations detected, by kind (schedlock.warning) and job."))
	if err != nil {
		return nil, err
	}
	offset, err := meter.Float64Histogram(tracing.MetricClockOffset, metric.WithUnit("s"),
		metric.WithDescription("Clock difference to the instance whose record of scheduled times refused a Lock (absolute)."),
		metric.WithExplicitBucketBoundaries(tracing.DurationBuckets...))
	if err != nil {
		return nil, err
	}
	return &warnings{log: log, count: count, offset: offset, logged: map[[2]string]time.Time{}}, nil
}

// warn counts one warning of kind for job and logs msg with args, unless
// it was logged for this kind and job within warnEvery.
func (l *Locker) warn(ctx context.Context, kind, job, msg string, args ...any) {
	w := l.warnings
	if w.count.Enabled(ctx) {
		w.count.Add(ctx, 1, metric.WithAttributes(tracing.Warning.String(kind), tracing.Job.String(job)))
	}
	key, now := [2]string{kind, job}, time.Now()
	w.mu.Lock()
	last, seen := w.logged[key]
	if !seen || now.Sub(last) >= warnEvery {
		w.logged[key] = now
		seen = false
	}
	w.mu.Unlock()
	if !seen {
		w.log.WarnContext(ctx, msg, append([]any{"job", job, "warning", kind}, args...)...)
	}
}

// logSkip logs a run skipped for a reason an operator must act on (Redis
// unavailable or misconfigured, nodes inside their restart gate) at most
// once every warnEvery per outcome (an outage skips every job), so that the logs alone tell
// that a job stopped running, even without an AfterLockError listener.
// The runs counter counts every such skip (outcome).
func (l *Locker) logSkip(ctx context.Context, outcome, job string, err error) {
	level := slog.LevelError
	switch outcome {
	case tracing.OutcomeSkippedDown:
	case tracing.OutcomeSkippedMisconfigured:
		if !errors.Is(err, redlock.ErrMisconfigured) {
			return // an unstable name: warned as such (warnUnstableName)
		}
	case tracing.OutcomeSkippedGated:
		level = slog.LevelWarn
	default:
		return
	}
	w := l.warnings
	key, now := [2]string{"skip", outcome}, time.Now() // one line per reason, whatever the number of jobs
	w.mu.Lock()
	last, seen := w.logged[key]
	if !seen || now.Sub(last) >= warnEvery {
		w.logged[key] = now
		seen = false
	}
	w.mu.Unlock()
	if !seen {
		w.log.Log(ctx, level, "scheduler: run skipped (logged at most once a minute per reason; the runs counter counts each)",
			"job", job, "outcome", outcome, "err", err)
	}
}

// checkRecord checks the job's record of scheduled times that refused a
// Lock of claim c (r) against this Locker. A scheduled time there that is
// not on this instance's schedule of the job is a warning: the instances
// run the job on different schedules (a deploy that changes it, or a
// location set differently). Then it measures how far the clock of the
// instance that wrote the record is from this one's: the writer stored its
// clock reading and the record's retention in its metadata, and the record
// has aged retention - r.HolderTTL since (by the node's clock, which both
// share). A difference beyond the clock tolerance is a warning: the
// instance whose clock is ahead runs the scheduled times, and the others
// come late for them.
func (l *Locker) checkRecord(ctx context.Context, job string, c claim, r redlock.NodeResult) {
	if m := time.UnixMilli(r.HolderMark); c.kind != kindManual && !onSchedule(l.timetable(job), m) {
		l.warn(ctx, warnSettingsMismatch, job, "scheduler: another instance ran a scheduled time that is not on this instance's schedule of the job; "+
			"instances must share the job's schedule and location (WithLocation)", "theirs", m, "ours", c.at)
	}
	_, written, nonce, ttl := splitHolder(r.Holder)
	if nonce == "" || ttl <= 0 || r.HolderTTL <= 0 {
		return // written by an earlier release: no clock reading
	}
	// The writer read its clock before its script ran, this instance reads
	// it after its reply: the reading is low by up to about a round trip
	// on each side, taken as this round's latency to the node.
	age := ttl - r.HolderTTL
	offset := written.Add(age).Sub(l.cfg.clock.Now()) + r.Latency // > 0: the writer's clock is ahead
	abs := max(offset, -offset)
	if l.warnings.offset.Enabled(ctx) {
		l.warnings.offset.Record(ctx, abs.Seconds(), metric.WithAttributes(tracing.Job.String(job)))
	}
	if abs > max(l.cfg.tolerance, 50*time.Millisecond)+r.Latency {
		l.warn(ctx, warnClockSkew, job, "scheduler: another instance's clock is further from this one's than the clock tolerance; "+
			"each scheduled time still runs at most once, on the instance whose clock is ahead, and the others come late for it",
			"offset", offset.Round(time.Millisecond), "tolerance", l.cfg.tolerance)
	}
}

// onSchedule reports whether t is a scheduled time of tt.
func onSchedule(tt timetable, t time.Time) bool { return tt.next(t.Add(-time.Millisecond)).Equal(t) }
