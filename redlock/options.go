package redlock

import (
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults. Each option's doc says what zero means.
const (
	// DefaultDriftFactor is the clock drift factor of the redis.io reference
	// implementations: drift = TTL x 0.01 + 2 ms.
	DefaultDriftFactor = 0.01
	// DefaultNodeTimeout bounds each node's answer in a round: small against
	// typical TTLs (redis.io distlock spec, step 2), large enough for a busy
	// host on loopback.
	DefaultNodeTimeout = 100 * time.Millisecond
	// DefaultMinValidity: a grant that leaves less than half the TTL of
	// validity is refused and released.
	DefaultMinValidity = 0.5
	// DefaultMaxRetryWait is how long the default retry policy keeps Acquire
	// trying when ctx has no earlier deadline.
	DefaultMaxRetryWait = 30 * time.Second
	// DefaultFencingRetention is how long a fencing counter outlives the
	// last fenced acquisition of its resource.
	DefaultFencingRetention = 7 * 24 * time.Hour
	// MaxMetadata is the largest metadata WithMetadata accepts, in bytes.
	MaxMetadata = 1024
	// MaxOwner is the longest owner ID WithOwner accepts, in bytes.
	MaxOwner = 256
)

// driftConstant is the fixed part of the clock drift allowance (redis.io
// reference implementations: 2 ms for the Redis expiry granularity).
const driftConstant = 2 * time.Millisecond

// Option configures a Client: it is given to New. Options that a call may
// also take are SharedOptions; New accepts every SharedOption as the
// default of every call of the Client.
type Option interface{ applyClient(*config) }

// LockOption configures one Acquire, TryAcquire or Do call. Options that
// New also takes are SharedOptions; the others (WithRecord, WithHighWater)
// name what one acquisition writes and do not compile when given to New.
type LockOption interface{ applyLock(*lockConfig) }

// SharedOption is an option valid both at New, as the default of every
// call of the Client, and in a call (Acquire, TryAcquire, Do), for that
// call: an Option and a LockOption. A call's own options apply after
// New's, so a call overrides the default.
type SharedOption interface {
	Option
	LockOption
}

// ReleaseOption configures one Release (WithReleaseLog). Its layer
// joins that Release's script (layer.go, releaseLayers).
type ReleaseOption interface {
	// releaseLayer returns the option's layer of a Release of l, checked,
	// after the layers of the options before it.
	releaseLayer(l *Lock, before []layer) (layer, error)
}

// KeepOption configures Keep: ExtendEvery. A KeepOption is also a
// SharedOption: given to New or to the call that acquires the Lock, it
// sets what every later Keep of that Lock, and Do's extensions, start
// from; given to Keep, it applies to that Keep only.
type KeepOption interface {
	SharedOption
	applyKeep(*keepConfig)
}

// AcquireOption is the former name of LockOption.
//
// Deprecated: use LockOption; AcquireOption will be removed in the next
// release.
type AcquireOption = LockOption

type config struct {
	driftFactor      float64
	nodeTimeout      time.Duration
	minValidity      float64
	keyPrefix        string
	logger           *slog.Logger
	fencingRetention time.Duration
	gate             time.Duration
	noWake           bool

	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	hideResources  bool
	nodeSpans      bool

	lock lockConfig // the defaults of every call
}

type lockConfig struct {
	retry          func() backoff.BackOff
	fencing        bool
	metadata       string
	owner          string
	ownerSet       bool
	extendEvery    time.Duration
	nodeTimeout    time.Duration // WithNodeTimeout given to the call
	nodeTimeoutSet bool
	record         string                           // WithRecord: resource name, "" for none
	recordTTL      time.Duration                    // WithRecord
	mark           string                           // WithHighWater: resource name, "" for none
	markAt         int64                            // WithHighWater
	markTTL        time.Duration                    // WithHighWater
	markFirst      bool                             // WithHighWaterFirst
	retryIf        func(n int, q *QuorumError) bool // WithRetryIf: nil retries always
	metadataFunc   func() string                    // WithMetadataFunc
	noWake         bool                             // WithReleaseNotices(false) given to the call or to New
	refusalText    func(NodeResult) string          // WithRefusalText
	patient        bool                             // WithPatientRounds
	quorumFirst    bool                             // WithQuorumFirst
}

// keepConfig is what Keep reads of its options.
type keepConfig struct {
	extendEvery time.Duration // ExtendEvery
}

// clientOption is an Option only.
type clientOption func(*config)

func (f clientOption) applyClient(c *config) { f(c) }

// callOption is a LockOption only: it is not an Option, so New does not
// take it (the compiler says so, and so does a type assertion).
type callOption func(*lockConfig)

func (f callOption) applyLock(l *lockConfig) { f(l) }

// sharedOption is a SharedOption that sets the same field of a call's
// lockConfig and of New's defaults.
type sharedOption func(*lockConfig)

func (f sharedOption) applyClient(c *config)   { f(&c.lock) }
func (f sharedOption) applyLock(l *lockConfig) { f(l) }

// WithDriftFactor sets the clock drift factor: the validity of a lock is
// TTL - elapsed - (TTL x f + 2 ms) (redis.io distlock spec, "Safety
// arguments"). Default 0.01; 0 keeps only the 2 ms constant. New rejects f
// outside [0, 0.5) or NaN.
func WithDriftFactor(f float64) Option {
	return clientOption(func(c *config) { c.driftFactor = f })
}

// WithNodeTimeout bounds each node's answer in every quorum round (acquire,
// extend, release): a node that has not answered after d counts as
// OutcomeTimeout (redis.io distlock spec, step 2). The round stops waiting
// at d whatever the go-redis client's settings; go-redis itself ends the
// request then only with ContextTimeoutEnabled, else at its ReadTimeout (5 s
// by default), and until then that node's later commands wait. Default
// DefaultNodeTimeout (100 ms); New rejects d <= 0. A SharedOption: given
// to New, it is the Client's node timeout (Client.NodeTimeout); given to
// a call (Acquire, TryAcquire, Do), it sets the node timeout of that
// Lock's rounds (its acquisition, extensions and release) instead, e.g.
// longer for locks taken in large bursts; the call rejects d <= 0
// (ErrInvalidArgument).
func WithNodeTimeout(d time.Duration) SharedOption { return nodeTimeoutOption(d) }

type nodeTimeoutOption time.Duration

func (d nodeTimeoutOption) applyClient(c *config) { c.nodeTimeout = time.Duration(d) }
func (d nodeTimeoutOption) applyLock(l *lockConfig) {
	l.nodeTimeout, l.nodeTimeoutSet = time.Duration(d), true
}

// WithMinValidity sets the smallest share of the TTL that a grant must leave
// as validity (TTL - elapsed - drift); a weaker grant is refused and released
// on every node, and the round counts as failed. Default 0.5; 0 accepts any
// positive validity (the bare rule of the redis.io page, step 4). New rejects
// f outside [0, 1), and f that adds up to 1 or more with the drift factor
// (no TTL would do).
func WithMinValidity(f float64) Option {
	return clientOption(func(c *config) { c.minValidity = f })
}

// WithKeyPrefix sets a prefix prepended to every resource name to form the
// Redis key, e.g. "lock:". Default "" (the key is the resource name). New
// rejects a prefix with a NUL byte (keys.go).
func WithKeyPrefix(p string) Option {
	return clientOption(func(c *config) { c.keyPrefix = p })
}

// WithLogger sets the logger for what happens outside a call's error: a
// node that starts failing, with its cause, while the quorum still works
// (Warn; Error when the node is misconfigured) and recovers (Info), lost
// locks in Do and Keep (Warn), node sets that tolerate fewer failures than
// their size suggests (Warn, at New), retried extensions and release-notice
// subscriptions (Debug). Default, and for nil: slog.Default() at the time
// of New; pass slog.New(slog.DiscardHandler) to drop everything. Lock
// values are never logged.
func WithLogger(l *slog.Logger) Option {
	return clientOption(func(c *config) { c.logger = l })
}

// WithRetry sets the retry policy of Acquire and Do: factory is called once
// per call, so every call gets fresh state (never share one stateful
// BackOff between goroutines). NextBackOff gives the delay before the next
// attempt; backoff.Stop ends Acquire with the last round's error. When a
// quorum of nodes reports one holder and release notices are on, the wait
// ends as soon as that holder releases; otherwise it lasts until the
// holder's key expires, at most 1 s, when that is longer than the policy's
// delay (asking again sooner cannot succeed: the notice comes first), so a
// policy of a few short retries may take up to 1 s per retry against a
// live holder. After a split
// vote (no holder has a quorum; the contenders undo their minorities, so
// the resource is free), the delay is a random 1-15 ms instead, doubling
// with each split vote in a row up to the policy's delay: a shorter delay
// would have the contenders collide again. Default: DefaultRetry. A nil
// factory, or one that returns nil, is an error (ErrInvalidArgument, from
// New or the call). A SharedOption: given to New, the policy of every
// call; given to Acquire or Do, that call's. TryAcquire does not retry:
// it checks the factory but never calls it.
func WithRetry(factory func() backoff.BackOff) SharedOption {
	return sharedOption(func(l *lockConfig) { l.retry = factory })
}

// WithMetadata stores m beside the lock's owner token in every key of the
// lock, written atomically with it: other clients see it as the holder's
// metadata (NodeResult.Holder in a refused round, Client.HolderMetadata),
// e.g. an identity. It must not hold secrets. Default ""; at most
// MaxMetadata bytes. A SharedOption: given to New, the metadata of every
// call; given to a call (Acquire, TryAcquire, Do), that call's.
// WithMetadata and WithMetadataFunc replace each other: the last one given
// applies, and a call's come after New's.
func WithMetadata(m string) SharedOption {
	return sharedOption(func(l *lockConfig) { l.metadata, l.metadataFunc = m, nil })
}

// WithMetadataFunc is WithMetadata with metadata that f gives anew at the
// start of each attempt, for instance with a clock reading of that
// moment (package scheduler's run locks). It replaces WithMetadata, and
// WithMetadata replaces it: the last one given applies, and a call's come
// after New's. A result longer than MaxMetadata bytes ends the call with
// ErrInvalidArgument before that attempt is sent. f runs on the calling
// goroutine. A SharedOption: given to a call (Acquire, TryAcquire, Do),
// it runs for that call; given to New, it runs for every call,
// concurrently, and must be safe for concurrent use. Lock.Metadata
// returns the granted attempt's metadata.
func WithMetadataFunc(f func() string) SharedOption {
	return sharedOption(func(l *lockConfig) { l.metadataFunc = f })
}

// WithRetryIf sets a condition on retrying: after each failed round of
// Acquire or Do, retry is called with the round's number (1 for the
// first) and its error, before the retry policy (WithRetry) is asked for
// the delay; when it returns false, the call stops and returns an error
// that matches ErrNotAcquired and wraps q (errors.As). It is not called
// for a round that ctx ended. It runs on the calling goroutine between
// rounds and may do I/O (package scheduler's Lock stops when another
// instance holds its job on a quorum, and deletes a leftover of its own
// failed attempt before it retries). A SharedOption: given to Acquire
// or Do, it runs for that call; given to New, it runs for every call,
// concurrently, and must be safe for concurrent use. Default nil: retry
// while the policy allows. TryAcquire does not retry and does not call
// it.
func WithRetryIf(retry func(n int, q *QuorumError) bool) SharedOption {
	return sharedOption(func(l *lockConfig) { l.retryIf = retry })
}

// WithPatientRounds makes every round of Acquire (and Do) wait as
// TryAcquire's round does: for every node up to the node timeout, also for
// a node that timed out before, and, once the round is lost, for the
// answers still due, so that its undo goes only to nodes that may have
// granted. It suits callers that take many locks at once, in bursts that
// slow the nodes without stopping them, and stop at a refusal (package
// scheduler's Lock): there a round that waits costs less than one that
// fails and is retried, and losers send no undo. Without it, a round
// returns as soon as its outcome is known, and Acquire's retries count a
// node that timed out as failed until it answers again, so that a frozen
// node does not slow every retry (design.md). A SharedOption: given to
// New, every Acquire and Do of the Client; given to Acquire or Do, that
// call's. TryAcquire's round waits so anyway. Default off.
func WithPatientRounds() SharedOption {
	return sharedOption(func(l *lockConfig) { l.patient = true })
}

// WithRefusalText sets how the call's error texts describe a node that
// refused its acquisition: text(r) replaces the default `held by
// "worker-2" for another 850ms` (or `"m" is at mark 120, set by
// "worker-2"`) after the node's address, for callers whose metadata or
// marks mean something the default cannot say (package scheduler names
// the instance and the scheduled time). r is the node's result
// (Outcome OutcomeHeld); text writes all of it, the resource name that
// the default shows for a lock of several resources or for a record
// included. text must be safe for concurrent use; it runs whenever the
// error's text is built. A SharedOption: given to New, it applies to
// every call; given to a call (Acquire, TryAcquire, Do), to that call's
// errors. Default nil: the default text.
func WithRefusalText(text func(r NodeResult) string) SharedOption {
	return sharedOption(func(l *lockConfig) { l.refusalText = text })
}

// ExtendEvery sets the time from one successful extension of a Lock by
// Keep (and by Do, which runs Keep) to the next. Default TTL/3; values
// above 0.8 x TTL are lowered to 0.8 x TTL; zero or negative values mean
// the default. It is a KeepOption: given to Keep, it sets that Keep's
// interval; given to Acquire, TryAcquire or Do, that Lock's default for
// every Keep; given to New, the default of every Lock of the Client.
func ExtendEvery(d time.Duration) KeepOption { return extendEveryOption(d) }

type extendEveryOption time.Duration

func (d extendEveryOption) applyClient(c *config)   { c.lock.extendEvery = time.Duration(d) }
func (d extendEveryOption) applyLock(l *lockConfig) { l.extendEvery = time.Duration(d) }
func (d extendEveryOption) applyKeep(k *keepConfig) { k.extendEvery = time.Duration(d) }

// DefaultRetry returns a fresh instance of the default retry policy:
// exponential backoff from 25 ms, doubling up to 1 s between attempts, with
// full jitter (each delay uniform in [0, d)), giving up after
// DefaultMaxRetryWait (30 s). Safe to call from many goroutines.
func DefaultRetry() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 25 * time.Millisecond
	b.Multiplier = 2
	b.MaxInterval = time.Second
	b.MaxElapsedTime = DefaultMaxRetryWait
	b.RandomizationFactor = 0
	b.Reset()
	return FullJitter(b)
}

// FullJitter wraps b so that each delay d becomes a uniform random delay in
// [0, d) ("full jitter"); backoff.Stop passes through. The result is as safe
// for concurrent use as b (not at all for ExponentialBackOff: make one per
// call).
func FullJitter(b backoff.BackOff) backoff.BackOff { return &fullJitter{b: b} }

type fullJitter struct{ b backoff.BackOff }

func (j *fullJitter) NextBackOff() time.Duration {
	d := j.b.NextBackOff()
	if d == backoff.Stop || d <= 0 {
		return d
	}
	return rand.N(d)
}

func (j *fullJitter) Reset() { j.b.Reset() }
