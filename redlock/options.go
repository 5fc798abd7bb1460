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

// Option configures a Client (New). Every LockOption is an Option too: given
// to New, it sets the default for every call of the Client.
type Option interface{ applyClient(*config) }

// LockOption configures one Acquire, TryAcquire or Do call (and Keep, for
// ExtendEvery); given to New, the Client's default for every call.
type LockOption interface {
	Option
	applyLock(*lockConfig)
}

// AcquireOption is the former name of LockOption.
//
// Deprecated: use LockOption; AcquireOption will be removed in the next
// release.
type AcquireOption = LockOption

// SharedOption is the former name of the options accepted by both New and
// the calls, now every LockOption.
//
// Deprecated: use LockOption; SharedOption will be removed in the next
// release.
type SharedOption = LockOption

// KeepOption is the former name of Keep's options.
//
// Deprecated: use LockOption; KeepOption will be removed in the next
// release.
type KeepOption = LockOption

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
	retryIf        func(n int, q *QuorumError) bool // WithRetryIf: nil retries always
	metadataFunc   func() string                    // WithMetadataFunc
	noWake         bool                             // WithReleaseNotices(false) given to the call or to New
	refusalText    func(NodeResult) string          // WithRefusalText
}

type clientOption func(*config)

func (f clientOption) applyClient(c *config) { f(c) }

type lockOption func(*lockConfig)

func (f lockOption) applyClient(c *config)   { f(&c.lock) }
func (f lockOption) applyLock(l *lockConfig) { f(l) }

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
// DefaultNodeTimeout (100 ms); New rejects d <= 0. Given to a call
// (Acquire, TryAcquire, Do) it sets the node timeout of that Lock's rounds
// (its acquisition, extensions and release) instead, e.g. longer for locks
// taken in large bursts; the call rejects d <= 0 (ErrInvalidArgument).
func WithNodeTimeout(d time.Duration) LockOption { return nodeTimeoutOption(d) }

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

// WithReleaseNotices turns waking on release on or off (default on): an
// Acquire that a holder refused on a quorum subscribes, on every node, to
// the release notices of its resources and starts its next round as soon as
// the holder releases, instead of polling with its retry delay (wake.go).
// The channels are "<key>:released": an ACL user needs
// &<prefix>*:released (Redis 7 gives new users no channel); a release
// whose PUBLISH is denied still releases. Turn it off where the nodes refuse
// SUBSCRIBE (ACLs, proxies without pub/sub): this Client's releases then
// publish nothing either. While an Acquire waits, the Client keeps one
// PubSub connection and two goroutines per node; they end when no Acquire
// waits any more, and at Close.
//
// Given to a call (Acquire, Do), WithReleaseNotices(false) makes that call
// poll with its retry delay and mark no holder's key, so that the holder's
// release publishes nothing for it (package scheduler's Lock: its losers
// do not wait). A call cannot turn notices on when its Client has them
// off.
func WithReleaseNotices(on bool) LockOption { return releaseNoticesOption(on) }

type releaseNoticesOption bool

func (o releaseNoticesOption) applyClient(c *config)   { c.noWake, c.lock.noWake = !bool(o), !bool(o) }
func (o releaseNoticesOption) applyLock(l *lockConfig) { l.noWake = !bool(o) }

// WithFencingRetention sets how long a resource's fencing counter is kept
// after its last fenced acquisition (the counter keys' TTL, refreshed by
// every fenced acquisition). Tokens also rise with the nodes' clocks, so
// they stay monotonic after a counter expired as long as those clocks do
// (docs/fencing.md). Default DefaultFencingRetention (7 days); New rejects
// values below 1 s.
func WithFencingRetention(d time.Duration) Option {
	return clientOption(func(c *config) { c.fencingRetention = d })
}

// WithRestartGating enforces the redis.io page's "delayed restarts": a node
// that has lost its data (restarted without persistence, or flushed) does
// not vote for any acquisition until maxTTL has passed since it was first
// seen empty, so it cannot grant a lock that it had granted to someone else
// before the restart. It applies to every client that uses the same nodes
// with the same key prefix and this option. The gate marker is a key without
// TTL on each node: a node that keeps its data (appendonly yes + appendfsync
// always) keeps its marker and is not gated after a restart. Restarting from
// an RDB snapshot restores a stale marker and defeats the gate: use AOF, or
// no persistence at all.
//
// Every TTL used with this Client, in Acquire, TryAcquire, Do and Extend,
// must be at most maxTTL (longer ones are rejected; CheckTTL): with their
// defaults, package scheduler needs 10 s (its run lock; tick records need
// 2 x clock tolerance + lock timeout, 3 s) and package elector 10 s (its
// lease), which their constructors check. On a brand-new node
// the first acquisitions also wait maxTTL. Gated nodes show OutcomeGated.
// Default 0: off. New rejects negative values and values below 1 ms.
func WithRestartGating(maxTTL time.Duration) Option {
	return clientOption(func(c *config) { c.gate = maxTTL })
}

// WithRetry sets the retry policy of Acquire and Do: factory is called once
// per call, so every call gets fresh state (never share one stateful
// BackOff between goroutines). NextBackOff gives the delay before the next
// attempt; backoff.Stop ends Acquire with the last round's error. When a
// quorum of nodes reports one holder and release notices are on, the wait
// ends as soon as that holder releases, and lasts at most until its key
// expires (at most 1 s) rather than the policy's delay. After a split
// vote (no holder has a quorum; the contenders undo their minorities, so
// the resource is free), the delay is at most a random 1-15 ms, doubling
// with each split vote in a row. Default: DefaultRetry. A nil factory, or one that returns nil, is an error
// (ErrInvalidArgument, from New or the call).
func WithRetry(factory func() backoff.BackOff) LockOption {
	return lockOption(func(l *lockConfig) { l.retry = factory })
}

// WithFencing makes acquisitions return fencing tokens (Lock.FencingToken):
// numbers that strictly increase across successive holders of a resource,
// for the protected resource to reject writes that carry an older token. It
// costs one more quorum round per acquisition (fencing.go). Default off.
// docs/fencing.md gives the design and its assumptions.
func WithFencing(on bool) LockOption {
	return lockOption(func(l *lockConfig) { l.fencing = on })
}

// WithMetadata stores m beside the lock's owner token in every key of the
// lock, written atomically with it: other clients see it as the holder's
// metadata (NodeResult.Holder in a refused round, Client.HolderMetadata),
// e.g. an identity. It must not hold secrets. Default ""; at most
// MaxMetadata bytes.
func WithMetadata(m string) LockOption {
	return lockOption(func(l *lockConfig) { l.metadata = m })
}

// WithMetadataFunc is WithMetadata with metadata that f gives anew at the
// start of each attempt, for instance with a clock reading of that
// moment (package scheduler's run locks). It overrides WithMetadata; a
// result longer than MaxMetadata bytes ends the call with
// ErrInvalidArgument before that attempt is sent. f runs on the calling
// goroutine. Lock.Metadata returns the granted attempt's metadata.
func WithMetadataFunc(f func() string) LockOption {
	return lockOption(func(l *lockConfig) { l.metadataFunc = f })
}

// WithRetryIf sets a condition on retrying: after each failed round of
// Acquire or Do, retry is called with the round's number (1 for the
// first) and its error, before the retry policy (WithRetry) is asked for
// the delay; when it returns false, the call stops and returns an error
// that matches ErrNotAcquired and wraps q (errors.As). It is not called
// for a round that ctx ended. It runs on the calling goroutine between
// rounds and may do I/O (package scheduler's Lock stops when another
// instance holds its job on a quorum, and deletes a leftover of its own
// failed attempt before it retries). Default nil: retry while the policy
// allows. TryAcquire does not retry and does not call it.
func WithRetryIf(retry func(n int, q *QuorumError) bool) LockOption {
	return lockOption(func(l *lockConfig) { l.retryIf = retry })
}

// WithRefusalText sets how the call's error texts describe a node that
// refused its acquisition: text(r) replaces the default `held by
// "worker-2" for another 850ms` (or `"m" is at mark 120, set by
// "worker-2"`) after the node's address, for callers whose metadata or
// marks mean something the default cannot say (package scheduler names
// the instance and the scheduled time). r is the node's result
// (Outcome OutcomeHeld). text must be safe for concurrent use; it runs
// when the text is built. Default nil: the default text.
func WithRefusalText(text func(r NodeResult) string) LockOption {
	return lockOption(func(l *lockConfig) { l.refusalText = text })
}

// WithOwner makes the lock reentrant for owner (reentrant.go): an
// acquisition by the same owner of resources that owner already holds
// succeeds at once (one quorum round) and adds a hold; each Lock's Release
// removes its own hold, and the keys are deleted when the last hold is
// released. TTLs are refreshed on reentry and never lowered. With fencing,
// a re-entry of resources the owner holds keeps the hold's token; one that
// adds resources is a new hold with a larger token (one token covers all of
// a lock's resources), which supersedes the older one at the resources they
// share (docs/fencing.md). Another owner is refused as usual. Go
// has no goroutine identity: owner is yours to choose (a job ID, a request
// ID), non-empty and at most MaxOwner bytes; whoever knows it shares the
// lock. Default: not reentrant.
func WithOwner(owner string) LockOption {
	return lockOption(func(l *lockConfig) { l.owner, l.ownerSet = owner, true })
}

// WithRecord makes the acquisition also write a record of itself under
// the resource name record, with its own TTL: on each node, in the same
// script and all or nothing with the lock's keys, a record that another
// acquisition wrote refuses the round like a held key (checked first; the
// refused NodeResult's Resource names the record), and otherwise the
// record is set to this acquisition's value for ttl. A record is never
// extended or released: it outlives the lock until its TTL ends, so that
// the acquisition is remembered (the scheduler's tick records). A failed
// attempt deletes its record with its lock keys. The record obeys the
// rules of a resource name and of a TTL (restart gate included), must not
// be one of the lock's resources, and cannot be combined with WithOwner:
// the call rejects one that breaks a rule (ErrInvalidArgument), and New
// rejects WithRecord altogether. Default: no record.
func WithRecord(record string, ttl time.Duration) LockOption {
	return lockOption(func(l *lockConfig) { l.record, l.recordTTL = record, ttl })
}

// WithHighWater makes the acquisition also raise a high-water mark kept
// under the resource name record: on each node, in the same script and
// all or nothing with the lock's keys, a mark at or above at that another
// acquisition raised refuses the round (checked after a WithRecord record
// and before the lock's keys; the refused NodeResult's Resource names the
// record and its HolderMark gives the mark), and otherwise the mark is set
// to at, with this acquisition's value (its metadata is what a refused
// round's Holder shows), for ttl from now. The mark before is kept for an
// undo: a failed attempt puts it back where it raised it. A granted Lock
// reports the highest mark it replaced (Lock.PreviousMark). A mark is
// never lowered, extended or deleted by Release; it expires ttl after its
// last raise. The scheduler keys each job's scheduled times on one.
//
// at must be positive; ttl at least 1 ms. ttl is a retention, not a lock
// TTL: it may exceed the restart gate (WithRestartGating), and a node that
// restarts empty forgets its marks, so a mark keeps a later acquisition at
// or below it out only while a quorum of nodes still has it: the caller
// bounds how late such an acquisition may come by the gate's maxTTL. The
// record obeys the rules of a resource name, must not be one of the lock's
// resources or its WithRecord record, and cannot be combined with
// WithOwner; a call that breaks a rule fails with ErrInvalidArgument, and
// New rejects WithHighWater altogether. Default: no mark.
func WithHighWater(record string, at int64, ttl time.Duration) LockOption {
	return lockOption(func(l *lockConfig) { l.mark, l.markAt, l.markTTL = record, at, ttl })
}

// ExtendEvery sets, for Do and Keep, the time from one successful extension
// to the next. Default TTL/3; values above 0.8 x TTL are lowered to 0.8 x
// TTL; zero or negative values mean the default.
func ExtendEvery(d time.Duration) LockOption {
	return lockOption(func(l *lockConfig) { l.extendEvery = d })
}

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
