// Package tracing holds the OpenTelemetry names of schedlock: instrumentation
// scope, span names, attribute keys and metric names, defined once for the
// redlock, scheduler and elector packages and for dashboards and queries.
//
// It depends on the OpenTelemetry API only. The library packages take
// WithTracerProvider and WithMeterProvider options and default to the global
// providers, so nothing is recorded until the application installs an SDK;
// package tracing/otlp sets one up that exports to Jaeger (or any OTLP
// backend) from the standard OTEL_* environment variables, and is the only
// package here that imports the SDK. docs/observability.md shows a
// contended acquisition as Jaeger displays it.
//
// No OpenTelemetry semantic convention exists for locks or leader
// election, so attributes use the "schedlock." prefix. Per-node CLIENT
// spans, when enabled, follow the database conventions (db.system.name =
// redis, db.operation.name, server.address, server.port).
package tracing

import "go.opentelemetry.io/otel/attribute"

// Version is the instrumentation scope version of every schedlock package.
const Version = "0.1.0"

// Instrumentation scope names: the packages' import paths.
const (
	ScopeRedlock   = "github.com/schedlock/schedlock/redlock"
	ScopeScheduler = "github.com/schedlock/schedlock/scheduler"
	ScopeElector   = "github.com/schedlock/schedlock/elector"
)

// Span names. Operation spans are INTERNAL; a round span is a child of its
// operation span; node spans (optional) are CLIENT children of a round span.
// Names that carry a round's kind, its outcome or a job name are built by
// RoundSpanName, WaitSpanName and JobSpanName: each of those parts takes
// few values (job names are a program's constants), so span names stay of
// low cardinality as OpenTelemetry requires, and the Jaeger UI's trace view
// and search list read at a glance.
const (
	SpanAcquire    = "redlock.Acquire"
	SpanTryAcquire = "redlock.TryAcquire"
	SpanExtend     = "redlock.Extend"
	SpanRelease    = "redlock.Release"
	SpanDo         = "redlock.Do"
	SpanJobRun     = "scheduler.run"
	SpanCampaign   = "elector.campaign"
	// SpanWait is the first word of a wait span (WaitSpanName): the time a
	// contended Acquire waits between two rounds.
	SpanWait = "redlock.wait"
	// SpanTermStarted and SpanTermEnded are the short spans that mark the
	// start and the end of a leadership term, each the root of its trace;
	// the end links to the start. Each renewal of the term's lease is a
	// trace of its own too (SpanExtend), linked to the start.
	SpanTermStarted = "elector.term started"
	SpanTermEnded   = "elector.term ended"

	// Deprecated: round spans are named by RoundSpanName, e.g.
	// "redlock.acquire.round contended". SpanRound is the name of none.
	SpanRound = "redlock.round"
	// Deprecated: a leadership is recorded as SpanTermStarted, SpanExtend
	// and SpanTermEnded spans; no span lasts the whole term any more.
	SpanLead = "elector.lead"
)

// RoundSpanName returns the name of a quorum round's span:
// "redlock.<op>.round <result>", e.g. "redlock.acquire.round contended",
// "redlock.release.round released", "redlock.undo.round done". op is a
// RoundOp value; outcome an Outcome* value, "" while the round runs
// (the name is then "redlock.<op>.round"). A granted outcome reads as
// "extended", "released" or "done" for extend, release and the other
// bookkeeping rounds.
func RoundSpanName(op, outcome string) string {
	name := "redlock." + op + ".round"
	if outcome == "" {
		return name
	}
	if outcome == OutcomeGranted {
		switch op {
		case "acquire":
		case "extend":
			outcome = "extended"
		case "release":
			outcome = "released"
		default:
			outcome = "done"
		}
	}
	return name + " " + outcome
}

// WaitSpanName returns the name of a wait span: "redlock.wait <ended by>",
// e.g. "redlock.wait release_notice"; endedBy is a WaitEnded* value.
func WaitSpanName(endedBy string) string { return SpanWait + " " + endedBy }

// JobSpanName returns the name of a scheduler tick's span:
// "scheduler.run <job> <outcome>", e.g. "scheduler.run report ran",
// "scheduler.run report skipped_held_elsewhere"; outcome "" while Lock
// runs.
func JobSpanName(job, outcome string) string {
	if outcome == "" {
		return SpanJobRun + " " + job
	}
	return SpanJobRun + " " + job + " " + outcome
}

// What ended a wait span (WaitEndedBy).
const (
	WaitEndedByNotice  = "release_notice" // the holder's release notices came from a quorum of nodes
	WaitEndedByBackoff = "backoff_timer"  // the retry policy's delay (or the holder's expiry) passed
	WaitEndedByCtx     = "ctx_done"       // the caller's ctx ended
)

// Attribute keys.
const (
	// Resources is the lock's resource names (string slice); omitted when
	// the Client hides them (redlock.WithHiddenResources).
	Resources = attribute.Key("schedlock.lock.resources")
	// TTL is the requested TTL in milliseconds (int).
	TTL = attribute.Key("schedlock.lock.ttl_ms")
	// FencingToken is the lock's fencing token (int), when fencing is on.
	FencingToken = attribute.Key("schedlock.lock.fencing_token")
	// Outcome is the outcome of an operation or round: one of the Outcome*
	// values.
	Outcome = attribute.Key("schedlock.outcome")
	// Attempts is the number of rounds an Acquire made (int).
	Attempts = attribute.Key("schedlock.acquire.attempts")

	// Round attributes.
	RoundOp        = attribute.Key("schedlock.round.op")      // acquire, fence, check (a re-entry's kept token), note (a reentrant hold's token), undo (of a failed attempt), extend, release, holder, eval (Client.Eval)
	RoundAttempt   = attribute.Key("schedlock.round.attempt") // 1-based, acquire rounds
	Nodes          = attribute.Key("schedlock.round.nodes")   // N
	Quorum         = attribute.Key("schedlock.round.quorum")  // N/2+1
	VotesOK        = attribute.Key("schedlock.round.votes.ok")
	VotesHeld      = attribute.Key("schedlock.round.votes.held")
	VotesError     = attribute.Key("schedlock.round.votes.error")
	VotesTimeout   = attribute.Key("schedlock.round.votes.timeout")
	VotesGated     = attribute.Key("schedlock.round.votes.gated")
	VotesPending   = attribute.Key("schedlock.round.votes.pending")
	ValidityMillis = attribute.Key("schedlock.round.validity_ms") // validity left at grant (float)
	// NodeAddresses, NodeOutcomes and NodeLatencies are per-node detail, in
	// node order (string, string and float64 ms slices).
	NodeAddresses = attribute.Key("schedlock.round.node.addresses")
	NodeOutcomes  = attribute.Key("schedlock.round.node.outcomes")
	NodeLatencies = attribute.Key("schedlock.round.node.latency_ms")
	// Holder is the metadata of the holder that refused a round (e.g. an
	// instance or leader identity), never its owner token. On a wait span,
	// the holder waited for: set when a quorum of nodes named one holder.
	Holder = attribute.Key("schedlock.holder")

	// Wait span attributes.
	WaitEndedBy       = attribute.Key("schedlock.wait.ended_by")   // a WaitEnded* value
	WaitPlannedMillis = attribute.Key("schedlock.wait.planned_ms") // the longest the wait could last (float)

	// Scheduler and elector attributes.
	Job      = attribute.Key("schedlock.job")
	Tick     = attribute.Key("schedlock.tick") // RFC 3339 with ms
	Instance = attribute.Key("schedlock.instance")
	// RunKind is what a scheduler run serves: scheduled (a scheduled time
	// of the job's schedule), manual (RunNow: no scheduled time) or
	// catch-up (a missed scheduled time, run late: WithCatchUp).
	RunKind = attribute.Key("schedlock.run.kind")
	// Warning is the kind of a misconfiguration the scheduler detected
	// (MetricWarnings): unstable_name, duplicate_instance, clock_skew,
	// settings_mismatch.
	Warning  = attribute.Key("schedlock.warning")
	Election = attribute.Key("schedlock.election")
	Identity = attribute.Key("schedlock.identity")
	Term     = attribute.Key("schedlock.term")
	// TermMillis is how long a leadership term lasted, on its end span
	// (float, ms).
	TermMillis = attribute.Key("schedlock.term.duration_ms")
)

// Values of Outcome.
const (
	OutcomeGranted     = "granted"     // the lock (or extension, release) went through
	OutcomeContended   = "contended"   // refused by another holder: not an error
	OutcomeUnavailable = "unavailable" // too many nodes failed: an error
	// OutcomeMisconfigured: too many nodes answered with an error an
	// operator must fix (redlock.ErrMisconfigured): an error.
	OutcomeMisconfigured = "misconfigured"
	OutcomeWeak          = "weak"     // quorum granted too little validity; refused
	OutcomeLost          = "lost"     // the lock is gone
	OutcomeResigned      = "resigned" // elector: a term ended by its leader's resignation
	OutcomeCanceled      = "canceled" // ctx ended
	OutcomeInvalid       = "invalid"  // bad input
	OutcomeRan           = "ran"      // scheduler: the job ran here
	OutcomeSkippedHeld   = "skipped_held_elsewhere"
	// OutcomeSkippedLate: the run came too late for its scheduled time
	// (a later one was taken, or the misfire threshold had passed).
	OutcomeSkippedLate = "skipped_late"
	// OutcomeMissed counts scheduled times that ran nowhere, once each,
	// when a later run of the job finds them.
	OutcomeMissed      = "missed"
	OutcomeSkippedDown = "skipped_redis_unavailable"
	// OutcomeSkippedGated: Redis nodes were inside their restart gate (new,
	// or restarted without their data): redlock.ErrGated.
	OutcomeSkippedGated = "skipped_gated"
	// OutcomeSkippedStopped: gocron stopped the job (Shutdown, RemoveJob,
	// Update, StopJobs) while its lock was being taken.
	OutcomeSkippedStopped = "skipped_stopped"
	// OutcomeSkippedPaused: the job was paused across the fleet
	// (scheduler.Scheduler.Pause, the status page); the scheduled time
	// was taken and recorded as paused, and the job did not run.
	OutcomeSkippedPaused = "skipped_paused"
	// OutcomeSkippedMisconfigured: the job cannot run exactly once as
	// configured (an unstable name: ErrUnstableName), or a node needs an
	// operator's fix.
	OutcomeSkippedMisconfigured = "skipped_misconfigured"
)

// Values of error.type on spans with status Error.
const (
	ErrorTypeUnavailable = "redlock.unavailable"
	// ErrorTypeMisconfigured: redlock.ErrMisconfigured.
	ErrorTypeMisconfigured = "redlock.misconfigured"
	ErrorTypeLockLost      = "redlock.lock_lost"
	ErrorTypeInvalid       = "redlock.invalid_argument"
	ErrorTypeCanceled      = "context.canceled"
	ErrorTypeOther         = "_OTHER"
)

// Span events.
const (
	EventLeadershipGained = "elector.leadership_gained"
	EventLeadershipLost   = "elector.leadership_lost"
	EventLockLost         = "redlock.lock_lost"
)

// Metric names. Durations are in seconds.
const (
	MetricAcquireDuration = "schedlock.lock.acquire.duration"  // histogram, s: Acquire/TryAcquire call to result
	MetricRoundDuration   = "schedlock.lock.round.duration"    // histogram, s: one quorum round
	MetricHoldDuration    = "schedlock.lock.hold.duration"     // histogram, s: grant to release or loss
	MetricContention      = "schedlock.lock.contention"        // counter: acquire rounds lost to another holder
	MetricLost            = "schedlock.lock.lost"              // counter: locks lost while held
	MetricExtendFailures  = "schedlock.lock.extend.failures"   // counter: Extend calls that failed
	MetricNodeErrors      = "schedlock.node.errors"            // counter: per node (server.address), error or timeout
	MetricHeld            = "schedlock.lock.held"              // up-down counter: locks held by this process
	MetricJobRuns         = "schedlock.scheduler.runs"         // counter: job runs by outcome (ran, skipped_*, missed)
	MetricWarnings        = "schedlock.scheduler.warnings"     // counter: misconfigurations detected, by schedlock.warning and job
	MetricClockOffset     = "schedlock.scheduler.clock_offset" // histogram, s: clock difference to the instance whose record refused a Lock
	MetricLeaderships     = "schedlock.elector.leaderships"    // counter: leaderships gained by this process
	MetricLeading         = "schedlock.elector.leading"        // up-down counter: 1 while this candidate leads
)

// DurationBuckets are the explicit histogram bucket boundaries, in seconds,
// for every duration metric: from sub-millisecond rounds to lock waits of
// minutes.
var DurationBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300,
}
