package scheduler

import (
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of the Locker options.
const (
	// DefaultTTL is the TTL of the lock that a running job holds. The lock is
	// extended every TTL/3 while the job runs, so the TTL bounds how long a
	// crashed instance keeps the job from running elsewhere, not how long a
	// job may run.
	DefaultTTL = 10 * time.Second
	// DefaultClockTolerance is the largest clock difference between two
	// instances that the Locker accepts without a clock_skew warning.
	DefaultClockTolerance = time.Second
	// DefaultTickResolution is the spacing of the grid of scheduled times
	// for jobs whose schedule the Locker does not know (a job of a plain
	// gocron scheduler that was not given to Locker.Follow).
	DefaultTickResolution = time.Second
	// DefaultMisfireThreshold is how late a run may start after its
	// scheduled time and still serve it (WithMisfireThreshold).
	DefaultMisfireThreshold = time.Minute
	// DefaultHistoryLength is how many entries the run record keeps per
	// job (WithHistoryLength).
	DefaultHistoryLength = 100
	// DefaultRecordRetention is how long a job's run record and its
	// latest scheduled time stay on the nodes after the job's last run
	// (WithRecordRetention).
	DefaultRecordRetention = 30 * 24 * time.Hour
	// DefaultKeyPrefix starts every Redis key the Locker writes (after the
	// redlock Client's own prefix).
	DefaultKeyPrefix = "schedlock:"
	// DefaultLockTimeout bounds one Lock call.
	DefaultLockTimeout = time.Second
	// DefaultLockJitter bounds the random delay before a Lock's first
	// round: a fleet's Locks of one instant spread over this long.
	DefaultLockJitter = 250 * time.Millisecond
)

// LockerOption configures a Locker (NewLocker) or the Locker inside a
// Scheduler (New, through WithLockerOptions).
type LockerOption func(*lockerConfig)

type lockerConfig struct {
	ttl         time.Duration
	tolerance   time.Duration
	resolution  time.Duration
	misfire     time.Duration
	misfireSet  bool
	catchUp     time.Duration
	history     int
	retention   time.Duration
	location    *time.Location
	onMissed    func(job string, scheduled time.Time)
	prefix      string
	lockTimeout time.Duration
	jitter      time.Duration
	clock       clockwork.Clock
	logger      *slog.Logger
	onLost      func(job string, err error)
	instance    string
	instanceSet bool // WithInstanceID given: no default identity drawn
	poll        time.Duration
	tracer      trace.TracerProvider
	meter       metric.MeterProvider
}

// WithTracerProvider sets the OpenTelemetry tracer provider for the span of
// each job run ("scheduler.run", with the lock outcome: ran, skipped because
// held elsewhere, skipped because Redis is unavailable). Default: the
// global provider; nil means the default. Pass the same provider to the
// redlock Client to see its rounds under the run span.
func WithTracerProvider(tp trace.TracerProvider) LockerOption {
	return func(c *lockerConfig) { c.tracer = tp }
}

// WithMeterProvider sets the OpenTelemetry meter provider for the
// schedlock.scheduler.runs counter. Default: the global provider; nil means
// the default.
func WithMeterProvider(mp metric.MeterProvider) LockerOption {
	return func(c *lockerConfig) { c.meter = mp }
}

// WithInstanceID sets the identity this Locker stores with its locks: other
// instances' ErrHeldElsewhere errors name it, and it tells a split vote
// (instances that fired at the same instant and each won a minority of
// nodes, retried) from a scheduled time really taken. It must differ
// between live instances: one that finds the job's record of scheduled
// times written by another process with its own ID reports
// ErrDuplicateInstance. Default tracing.DefaultIdentity(),
// "<service>/<host>-<pid>-<token>" (e.g. "billing/web-3-19350-1a2b", with a
// random token per process). NewLocker rejects "" and IDs longer than
// redlock.MaxMetadata - 51 bytes: the locks' metadata is "<ID>@<the
// instance's clock in Unix ms>/<a random nonce of the Locker>/<the record
// retention in ms>", which other instances' redlock errors show as the
// holder. A record with this ID that another process wrote before this
// Locker started (on the writer's clock) is taken for the previous
// process of a restarted instance with a stable ID, and reported as
// ErrHeldElsewhere only; a duplicate whose clock is behind by more than
// the time since this Locker started is reported once its records are
// newer.
func WithInstanceID(id string) LockerOption {
	return func(c *lockerConfig) { c.instance, c.instanceSet = id, true }
}

// WithTTL sets the TTL of the lock a running job holds (extended every TTL/3
// while it runs). A crashed instance blocks the job for at most this long.
// Default DefaultTTL (10 s); NewLocker rejects values below 10 ms.
func WithTTL(d time.Duration) LockerOption { return func(c *lockerConfig) { c.ttl = d } }

// WithClockTolerance sets the largest difference between two instances'
// clocks (as seen by their gocron schedulers) that the Locker takes
// without a clock_skew warning; it changes nothing else but the shortest
// record retention NewLocker accepts (WithRecordRetention). Each scheduled
// time runs at most once whatever the difference (up to about the record
// retention, 30 days by default), on the instance whose clock is ahead. Every Lock refused by another instance's record
// measures the difference (docs/scheduling.md).
// Default DefaultClockTolerance (1 s); NewLocker rejects negative values and
// values of a day or more; 0 warns at any difference above 50 ms.
func WithClockTolerance(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.tolerance = d }
}

// WithTickResolution sets the grid of scheduled times for jobs whose
// schedule the Locker does not know (jobs of a plain gocron scheduler not
// given to Locker.Follow): a run at local time t serves the grid point at
// or before it. Such a job's queued runs cannot be told from on-time ones
// (docs/scheduling.md). Default DefaultTickResolution (1 s); NewLocker
// rejects values below 1 ms.
func WithTickResolution(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.resolution = d }
}

// WithKeyPrefix sets the prefix of every key the Locker writes. Default
// DefaultKeyPrefix ("schedlock:"); "" is allowed.
func WithKeyPrefix(p string) LockerOption { return func(c *lockerConfig) { c.prefix = p } }

// WithLockTimeout bounds one Lock call: its start delay (WithLockJitter),
// its quorum rounds (each waits for a node up to half the bound, at least
// the redlock Client's node timeout) and the retries of rounds that nodes
// did not answer or that split the votes. A busy job is never waited for:
// it is a skip. A Lock also ends 250 ms before the job's next scheduled
// time, or half-way to it where that is later: gocron computes the next
// run after Lock returns, and a longer Lock would make it skip a
// scheduled time without a report. Default DefaultLockTimeout (1 s);
// NewLocker rejects values <= 0.
func WithLockTimeout(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.lockTimeout = d }
}

// WithLockJitter sets the bound of the random delay with which Lock
// starts its first round, after it has found the scheduled time it
// serves: one of 0, d/4, d/2 and 3d/4 at random, so that the Locks of one
// instance that fire together still share one pipeline per node and
// delay. Without it, instances whose timers fire at the same instant
// (hosts synced by NTP) reach the nodes together, in a different order on
// each node, so that no one wins a quorum and every one retries (with 5
// instances and 3 nodes, about half of all scheduled times); and a fleet
// of many jobs firing at once reaches Redis as one burst
// (docs/benchmarks.md, "Scheduler scale"). A job starts up to that much
// later. The delay is also bounded by a quarter of the time to the job's
// next scheduled time and by half the Lock's bound (WithLockTimeout), of
// which it is part. Default DefaultLockJitter (250 ms); 0 turns it off;
// NewLocker rejects negative values.
func WithLockJitter(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.jitter = d }
}

// WithClock sets the clock used to find a run's scheduled time. It must be the clock the
// gocron scheduler uses (gocron.WithClock); New passes it to gocron itself.
// Default: the real clock. nil means the real clock.
func WithClock(c clockwork.Clock) LockerOption {
	return func(cfg *lockerConfig) { cfg.clock = c }
}

// WithLogger sets the logger for lost locks, failed releases and the
// misconfigurations the Locker detects (unstable job names, a duplicate
// instance ID, clock skew beyond the tolerance; docs/scheduling.md). The
// errors that gocron passes to AfterLockError report them too. Default,
// and for nil: slog.Default() at the time of NewLocker; pass
// slog.New(slog.DiscardHandler) to drop everything.
func WithLogger(l *slog.Logger) LockerOption { return func(c *lockerConfig) { c.logger = l } }

// WithLostHandler sets a function called, on a goroutine of the Locker, when a
// running job's lock is lost (a majority of Redis nodes unreachable until
// the lock's validity ran out, or the lock expired). The run's context
// (Locker.RunContext) is cancelled at the same time. Default: none.
func WithLostHandler(f func(job string, err error)) LockerOption {
	return func(c *lockerConfig) { c.onLost = f }
}

// WithMisfireThreshold sets how late a run may start after its scheduled
// time and still serve it: a later run is a misfire, skipped with ErrLate
// and recorded as late (Quartz's misfireThreshold). Runs come late from
// gocron's wait modes, a busy executor or WithStartImmediately. Whatever
// the threshold, a run never serves a scheduled time once a later one was
// taken. A node restarted without its data rejoins quorums after the
// restart gate (redlock.WithRestartGating) without the job's records, so
// the threshold must not exceed the gate; without gating, a node that
// loses its data loses the records at once, and at most once then rests on
// the nodes' persistence (docs/operations.md). Default
// DefaultMisfireThreshold (1 min), or the Client's restart gate where
// that is shorter; NewLocker rejects values below 1 ms or above the gate.
func WithMisfireThreshold(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.misfire, c.misfireSet = d, true }
}

// WithCatchUp turns on catching up missed scheduled times (Quartz's "fire
// once now", Kubernetes' startingDeadlineSeconds): when a Scheduler starts
// (Scheduler.Start), each job whose latest scheduled time is at most
// window ago runs that scheduled time once across the fleet, unless an
// instance ran it; a run of it is recorded as a catch-up. Like the misfire
// threshold, window must not exceed the Client's restart gate. Default 0:
// off; NewLocker rejects negative values and values above the gate.
func WithCatchUp(window time.Duration) LockerOption {
	return func(c *lockerConfig) { c.catchUp = window }
}

// WithHistoryLength sets how many entries the run record keeps per job
// (Scheduler.History): runs, misses and late skips, newest first. Default
// DefaultHistoryLength (100); NewLocker rejects values below 1 or above
// 10,000.
func WithHistoryLength(n int) LockerOption { return func(c *lockerConfig) { c.history = n } }

// WithRecordRetention sets how long a job's run record and its record of
// the latest scheduled time taken stay on the nodes after its last write:
// a job that does not run for longer loses its history, and its next run
// cannot report what it missed meanwhile. The record of a scheduled time
// must outlive its last Lock, so NewLocker rejects values below the
// misfire threshold (or the catch-up window, if longer) plus the lock
// timeout and the clock tolerance (1m2s with the defaults); instances
// whose clocks differ by more than the retention less those two and the
// misfire threshold could run a scheduled time twice. A job whose
// scheduled times are further apart (a monthly job) keeps its records
// longer: two of its intervals plus that minimum, so that the run after a
// missed scheduled time still finds the one before and reports the miss.
// Default DefaultRecordRetention (30 days).
func WithRecordRetention(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.retention = d }
}

// WithLocation sets the location in which cron, daily, weekly and monthly
// schedules are read: it must be the gocron scheduler's (gocron.WithLocation);
// New passes it to gocron itself. Default: time.Local, gocron's default;
// nil means the default.
func WithLocation(loc *time.Location) LockerOption {
	return func(c *lockerConfig) { c.location = loc }
}

// WithMissedHandler sets a function called once for each scheduled time
// of job that ran nowhere (nodes down, every instance stopped, a run lock
// left by a crash), in time order and at most 100 times per run (the rest
// are counted and logged). It is called when the run that found them
// ends: in its Unlock, on the goroutine on which gocron ran the task,
// after the task returned (for a scheduled time of a paused job, which
// does not run, in its Lock). Each miss is also counted
// (schedlock.scheduler.runs, outcome missed), logged at Warn and written
// to the run record. A scheduled time skipped because the job's previous
// run was still running is not a miss. Default: none.
func WithMissedHandler(f func(job string, scheduled time.Time)) LockerOption {
	return func(c *lockerConfig) { c.onMissed = f }
}
