package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schedlock/schedlock/tracing"
)

// Lock is a lock held on a quorum of nodes, as returned by Acquire and
// TryAcquire. Its methods are safe for concurrent use: Extend and Release
// of one Lock run one at a time, so that Until never runs ahead of what a
// quorum of nodes holds. The lock value (its 128-bit owner token: random,
// or derived from WithOwner's ID) is never exposed or logged.
type Lock struct {
	c         *Client
	cfg       lockConfig
	resources []string
	keys      []string                                // the lock keys, one per resource (the layers add theirs to each script)
	n         int                                     // number of resources
	layers    []layer                                 // the features of the Lock's scripts (layer.go)
	tp        string                                  // traceparent of the acquiring span, stored in the value
	scripts   [kindUndo + 1]atomic.Pointer[assembled] // its scripts by kind, once assembled (a Release's extra layers aside)

	// op orders Extend and Release: each holds it for its whole round.
	op sync.Mutex

	// mu guards the fields below; it is never held during I/O. Writers:
	// nextAttempt (value), attempt (pending -> held), end (->
	// released), Extend (until, ttl; -> lost), Release (-> released), lose
	// (-> lost); watch and changedLocked (changed).
	mu      sync.Mutex
	state   lockState
	lostBy  string // why the state became lost (loseLocked), for Release's error
	value   string // the last attempt's value: the held lock's once held
	ttl     time.Duration
	until   time.Time
	granted time.Time
	// expires bounds when the keys that this Lock's extend rounds may
	// have set expire (keysExpireLocked); zero before the first Extend.
	expires time.Time
	changed chan struct{} // closed at the next change of state, until or ttl; nil when nobody watches
}

type lockState int

const (
	statePending  lockState = iota // acquisition in progress
	stateHeld                      // acquired, valid until until
	stateLost                      // known lost; keys may remain until Release
	stateReleased                  // released, or the acquisition failed for good
)

// newLock validates one call's input and prepares its Lock.
// retrying says that the Lock is Acquire's, not TryAcquire's.
func (c *Client) newLock(ctx context.Context, resources []string, ttl time.Duration, opts []LockOption, retrying bool) (*Lock, error) {
	if c.closed.Load() {
		return nil, wrapf([]error{ErrNotAcquired, ErrClosed}, "%s not acquired: the client is closed", lockName(resources))
	}
	cfg := c.cfg.lock
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("option %d of %d is nil", i+1, len(opts))
		}
		o.applyLock(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := c.CheckTTL(ttl); err != nil {
		return nil, err
	}
	ttl = ttl.Truncate(time.Millisecond) // as the nodes get it
	if err := c.checkResources(resources); err != nil {
		return nil, err
	}
	n := len(resources)
	l := &Lock{c: c, cfg: cfg, resources: slices.Clone(resources), n: n, ttl: ttl,
		tp: traceparentOf(ctx)}
	for _, r := range resources {
		l.keys = append(l.keys, c.cfg.keyPrefix+r)
	}
	for _, newLayer := range registry {
		y, err := newLayer(c, &cfg, resources, retrying)
		if err != nil {
			return nil, err
		}
		if y != nil {
			l.layers = append(l.layers, y)
		}
	}
	return l, nil
}

// validate checks one call's options, naming the bad value.
func (cfg *lockConfig) validate() error {
	switch {
	case cfg.retry == nil:
		return invalidf("the retry policy factory (WithRetry) is nil")
	case len(cfg.metadata) > MaxMetadata:
		return invalidf("metadata (WithMetadata) is %d bytes, more than the maximum %d", len(cfg.metadata), MaxMetadata)
	case cfg.nodeTimeoutSet && cfg.nodeTimeout <= 0:
		return invalidf("node timeout %v (WithNodeTimeout) is not positive", cfg.nodeTimeout)
	}
	for _, check := range callChecks {
		if err := check(cfg); err != nil {
			return err
		}
	}
	return nil
}

// checkResources rejects an empty list, empty or repeated names, names
// with a NUL byte and reserved names (keys.go).
func (c *Client) checkResources(resources []string) error {
	if len(resources) == 0 {
		return invalidf("no resources: name at least one")
	}
	seen := make(map[string]int, len(resources))
	for i, r := range resources {
		switch j, dup := seen[r]; {
		case r == "":
			return invalidf("resources[%d] is empty", i)
		case hasNUL(r):
			return invalidf("resource %s contains a NUL byte", quoteName(r))
		case reserved(r) != "":
			return invalidf("resource name %q is reserved: %s", r, reserved(r))
		case dup:
			return invalidf("resource %s is listed twice (resources[%d] and resources[%d])", quoteName(r), j, i)
		}
		seen[r] = i
	}
	return nil
}

// Resources returns a copy of the lock's resource names, in the order given
// to Acquire.
func (l *Lock) Resources() []string {
	if l == nil {
		return nil
	}
	return slices.Clone(l.resources)
}

// Metadata returns the metadata stored with the lock (WithMetadata, or the
// granted attempt's WithMetadataFunc result). Safe for concurrent use.
func (l *Lock) Metadata() string {
	if l == nil {
		return ""
	}
	return l.cfg.metadata
}

// Until returns the local validity deadline: the start of the last
// successful acquire or extend round + TTL - drift, on this process's
// monotonic clock (redis.io distlock spec, step 3). Work guarded by the lock
// must end before it. Zero for a nil Lock.
func (l *Lock) Until() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// TTL returns the TTL of the last successful acquire or extend: the one
// Until was computed from, and the one Keep extends by. The keys on the
// nodes may live longer: Extend never lowers a key's TTL, so after an
// Extend to a shorter TTL they keep the longer one until it runs out.
func (l *Lock) TTL() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// setStateLocked moves l to state to, and records the end of a hold in the
// metrics when l leaves stateHeld. l.mu is held.
func (l *Lock) setStateLocked(ctx context.Context, to lockState) {
	if l.state == stateHeld && to != stateHeld {
		l.c.tel.holdEnded(ctx, time.Since(l.granted), to == stateLost || !time.Now().Before(l.until))
	}
	l.state = to
	l.changedLocked()
}

// loseLocked marks l lost; why says what found it lost, for Release's
// error. l.mu is held.
func (l *Lock) loseLocked(ctx context.Context, why string) {
	l.lostBy = why
	l.setStateLocked(ctx, stateLost)
}

// changedLocked tells the watchers (watch) that the state, until or ttl
// changed. l.mu is held.
func (l *Lock) changedLocked() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// watch returns the state, Until and TTL, and a channel that is closed at
// their next change (Keep follows them).
func (l *Lock) watch() (state lockState, until time.Time, ttl time.Duration, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.state, l.until, l.ttl, l.changed
}

// checkHeld returns the current value, or ErrLockLost unless l is held
// and within its validity.
func (l *Lock) checkHeld(ctx context.Context) (value string, until time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.state == stateReleased:
		return "", l.until, wrapf([]error{ErrLockLost}, "%s was already released", lockName(l.resources))
	case l.state == stateLost:
		return "", l.until, wrapf([]error{ErrLockLost}, "%s was already lost", lockName(l.resources))
	case !time.Now().Before(l.until):
		l.loseLocked(ctx, "its validity ended before an Extend")
		return "", l.until, wrapf([]error{ErrLockLost}, "%s lost: its validity ended %v ago", lockName(l.resources), ago(l.until))
	}
	return l.value, l.until, nil
}

// ago says how long ago t was, rounded for people.
func ago(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

// Extend raises the TTL of every key of the lock to ttl on the nodes where
// all of them still hold this lock (owner-checked in one script per node),
// and on success (a quorum of such nodes) moves Until to this round's
// start + ttl - drift, and TTL to ttl. On a node where a key of the lock
// is missing and none is another owner's, it sets the missing keys again,
// as Acquire would (the node lost them, or never got them: a lock granted
// by a bare quorum), unless the node is within its restart gate
// (WithRestartGating). Such a node does not count toward this round's
// quorum, but does in later rounds: a held lock regains the fault
// tolerance of a fresh one (docs/design.md, "Regaining keys"). An Extend
// that finds the lock lost deletes the keys it set again.
//
// Extend cannot shorten the lock on the nodes: it never lowers a key's
// TTL (an Extend that timed out may still reach a node after a later,
// longer one, and must not cut it short; a reentrant owner's holds share
// the keys). A ttl shorter than the keys' remaining TTL moves Until (and
// the TTL that Keep extends by) earlier, while the keys keep their longer
// TTL: a holder that dies then blocks others until that runs out, at most
// the longest TTL of the acquire and its extends after the last of them.
// Release frees the keys at once.
//
// ttl is rounded down to whole milliseconds. Its calls still queued for a
// node when Until passes are dropped, answers after Until do not count,
// and it obeys every limit of Acquire on a TTL (CheckTTL: its range and
// the restart gate). Concurrent Extend and Release calls on one Lock run
// one after the other.
//
// Errors: ErrInvalidArgument for a bad ttl or nil Lock; ErrClosed after
// Client.Close; ErrLockLost when Until has passed, the lock was released,
// or too many nodes no longer hold it; ctx's cause (with the round's
// *QuorumError) when ctx ended first; an error matching no sentinel, with
// the round's *QuorumError, when a quorum confirmed later than ttl after
// the round began (a ttl shorter than the nodes take to answer); otherwise
// a *QuorumError matching ErrUnavailable (nodes failed, so no quorum
// confirmed the extension) or ErrMisconfigured (nodes answered with an
// error an operator must fix). In the last three cases the lock stays
// valid until its unchanged Until.
// Bounded by the node timeout; ctx can end it sooner.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) (err error) {
	if l == nil {
		return invalidf("Extend called on a nil *Lock")
	}
	return l.extend(ctx, ttl, false)
}

// extend is Extend; with current (Keep's extensions) it extends by the
// Lock's TTL as it is once the Lock's op mutex is held instead of ttl, so
// that an Extend of the holder's that ran meanwhile sets the TTL it uses.
func (l *Lock) extend(ctx context.Context, ttl time.Duration, current bool) (err error) {
	c := l.c
	ctx, span := c.tel.startOp(ctx, tracing.SpanExtend, l.resources, ttl)
	defer func() { c.tel.endExtend(ctx, span, err) }()
	if err := c.CheckTTL(ttl); err != nil {
		return err
	}
	ttl = ttl.Truncate(time.Millisecond) // as the nodes get it
	if c.closed.Load() {
		return wrapf([]error{ErrClosed}, "%s not extended: the client is closed", lockName(l.resources))
	}
	l.op.Lock()
	defer l.op.Unlock()
	value, until, err := l.checkHeld(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	if current {
		ttl = l.ttl
	}
	start := time.Now()
	l.expires = later(l.keysExpireLocked(), start.Add(ttl+l.nodeTimeout()))
	l.mu.Unlock()
	a := &attempt{l: l, value: value}
	k := l.scriptCall(kindExtend, "extend", a, nil, []any{value, ttl.Milliseconds(), l.n})
	k.parse = parseExtend(l, k)
	rs := c.voteUntil(ctx, k.call, until)
	err = l.extended(ctx, rs, start, ttl)
	if errors.Is(err, ErrLockLost) {
		l.dropRegained(ctx, rs, value)
	}
	return err
}

// dropRegained deletes the keys that an extension which found the lock
// lost set again (parseExtend), as an undo does: a cleanup queued after
// the extension on each node, not waited for.
func (l *Lock) dropRegained(ctx context.Context, rs []NodeResult, value string) {
	skip, none := make([]bool, len(rs)), true
	for i, r := range rs {
		skip[i] = !r.regained
		none = none && skip[i]
	}
	if none {
		return
	}
	a := &attempt{l: l, value: value}
	l.c.undo(ctx, l.releaseCall(kindRelease, a).call, skip)
}

// extended records the outcome of an extend round that started at start
// with ttl, and returns Extend's error.
func (l *Lock) extended(ctx context.Context, rs []NodeResult, start time.Time, ttl time.Duration) error {
	c := l.c
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.state != stateHeld: // lost meanwhile (Keep's deadline)
		return wrapf([]error{ErrLockLost}, "%s lost while Extend waited for the nodes: no extension reached a quorum in time", lockName(l.resources))
	case count(rs, OutcomeOK) >= c.quorum:
		if v := c.validity(start, ttl); v <= 0 {
			q := newQuorumError("extend", l.resources, c.quorum, rs, false)
			if left := time.Until(l.until); left > 0 {
				// The nodes never lower a TTL: the keys a quorum confirmed
				// hold at least until the unchanged Until.
				return wrapf([]error{q}, "%s not extended: the nodes took longer than the %v TTL asked to confirm it; it stays valid until its unchanged Until, %v from now: %s",
					lockName(l.resources), ttl, left.Round(time.Millisecond), q.body())
			}
			l.loseLocked(ctx, "its validity ended while an Extend waited for the nodes")
			return wrapf([]error{ErrLockLost, q}, "%s lost: the nodes took longer than its %v TTL to confirm the extension, and its validity has ended: %s",
				lockName(l.resources), ttl, q.body())
		}
		l.until, l.ttl = start.Add(ttl-c.drift(ttl)), ttl
		l.changedLocked()
		return nil
	case count(rs, OutcomeHeld) > len(rs)-c.quorum:
		l.loseLocked(ctx, "an Extend found too few nodes still holding it")
		return newQuorumError("extend", l.resources, c.quorum, rs, false, ErrLockLost)
	}
	// Not confirmed, not lost for sure: Until stays, since the nodes never
	// lower a TTL (scripts/extend.lua), so what they held still holds.
	switch {
	case !time.Now().Before(l.until):
		l.loseLocked(ctx, "its validity ended before a quorum confirmed an Extend")
		q := newQuorumError("extend", l.resources, c.quorum, rs, ctx.Err() == nil) // unknown because of the nodes, unless ctx cut it
		return wrapf([]error{ErrLockLost, q}, "%s lost: its validity ended before a quorum confirmed the extension: %s",
			lockName(l.resources), q.body())
	case ctx.Err() != nil: // the caller gave up: not the nodes' failure
		cause, q := context.Cause(ctx), newQuorumError("extend", l.resources, c.quorum, rs, false)
		return wrapf([]error{cause, q}, "%s not extended: %v; %s", lockName(l.resources), cause, q.body())
	}
	return newQuorumError("extend", l.resources, c.quorum, rs, true) // nodes failed
}

// Release deletes the lock's keys on every node where they still hold this
// lock (compare-and-delete in one script per node). It returns as soon as
// the outcome is known: a quorum deleted them, or so many nodes failed or no
// longer held them that no quorum can (at most the node timeout); the
// scripts for the other nodes still go out when their nodes can take them.
// It runs on a context detached from ctx's cancellation, so it cleans up
// even when ctx is already cancelled. It waits for an Extend of the same
// Lock in progress.
//
// It returns nil when a quorum still held the lock and deleted its keys,
// also after Until (an Extend to a shorter TTL leaves the keys live
// longer), and no node answered that it could not run the release. A
// Release of a Lock already released does nothing and returns nil, so that
// defer l.Release(ctx) may follow an explicit Release (its error came
// from the first call).
// Errors: ErrInvalidArgument for a nil Lock; ErrClosed after Client.Close
// (nothing is sent; the Lock stays as it was); a *QuorumError matching
// ErrMisconfigured when a quorum refused before deleting anything (a
// WithReleaseLog key of another type, say: the Lock stays as it was, so
// Release may be called again); ErrLockLost when too many
// nodes no longer held it, or fewer than a quorum deleted it after its validity had
// ended or it was known lost (its keys are deleted where they remained);
// otherwise a *QuorumError (errors.As) matching ErrUnavailable (nodes
// failed, so no quorum confirmed the deletion; ErrMisconfigured instead, or
// too, when nodes answered with an error an operator must fix), or
// matching no sentinel
// when a quorum deleted the keys but some node answered an error (NOPERM,
// say). The text of the last two names the nodes where the release did
// not run and says how long their keys may stay: until their TTL runs out,
// at most the longest TTL of this Lock's acquire and extends after the
// last of them. WithReleaseLog writes entries of the caller's beside the
// release, in the same script.
func (l *Lock) Release(ctx context.Context, opts ...ReleaseOption) (err error) {
	if l == nil {
		return invalidf("Release called on a nil *Lock")
	}
	extra, err := releaseLayers(l, opts)
	if err != nil {
		return err
	}
	c := l.c
	ctx, span := c.tel.startOp(ctx, tracing.SpanRelease, l.resources, 0)
	defer func() { endOp(span, err) }()
	if c.closed.Load() {
		return wrapf([]error{ErrClosed}, "%s not released: the client is closed; its keys expire with their TTL", lockName(l.resources))
	}
	l.op.Lock()
	defer l.op.Unlock()
	l.mu.Lock()
	prev, lostBy, until, value, expires := l.state, l.lostBy, l.until, l.value, l.keysExpireLocked()
	l.mu.Unlock()
	if prev == stateReleased {
		return nil // defer l.Release(ctx) after an explicit Release: nothing to do
	}
	k := l.releaseCall(kindRelease, &attempt{l: l, value: value, release: true}, extra...)
	rs := c.release(ctx, k.call, nil)
	if !refusedBeforeDelete(rs, c.quorum) {
		l.mu.Lock()
		l.setStateLocked(ctx, stateReleased)
		l.mu.Unlock()
	}
	if count(rs, OutcomeOK) >= c.quorum {
		for i, y := range k.in {
			y.released(l, k.largs[i])
		}
	}
	return l.releaseErr(rs, prev, lostBy, until, expires)
}

// refusedBeforeDelete reports whether no node deleted anything in the
// release round rs and a quorum answered with an error an operator must
// fix (a release script's checks run before its deletes): the Lock then
// stays as it was, so that Release can be called again once that is fixed.
func refusedBeforeDelete(rs []NodeResult, quorum int) bool {
	refused := 0
	for _, r := range rs {
		switch {
		case r.Outcome == OutcomeOK:
			return false
		case r.Outcome == OutcomeError && errors.Is(r.Err, ErrMisconfigured):
			refused++
		}
	}
	return refused >= quorum
}

// releaseErr returns Release's error for the release round rs of a Lock
// that was in state prev (lost because lostBy), valid until until, with
// keys that expire at expires at the latest.
func (l *Lock) releaseErr(rs []NodeResult, prev lockState, lostBy string, until, expires time.Time) error {
	c := l.c
	ok, left := count(rs, OutcomeOK), keysLeft(rs)
	switch {
	case ok >= c.quorum && left == "":
		return nil
	case ok >= c.quorum:
		q := newQuorumError("release", l.resources, c.quorum, rs, false)
		return wrapf([]error{q}, "%s released on a quorum but not on %s, where the release could not run: its keys stay there %s; %s",
			lockName(l.resources), left, untilText(expires), q.body())
	case prev == stateLost && time.Now().Before(until):
		q := newQuorumError("release", l.resources, c.quorum, rs, false)
		return wrapf([]error{ErrLockLost, q}, "%s was already lost (%s); the release deleted its keys on the nodes that answered and still held them: %s",
			lockName(l.resources), lostBy, q.body())
	case !time.Now().Before(until) || prev == stateLost:
		q := newQuorumError("release", l.resources, c.quorum, rs, false)
		return wrapf([]error{ErrLockLost, q}, "%s lost: its validity ended before a quorum confirmed the release (its keys are deleted where they remained): %s",
			lockName(l.resources), q.body())
	case count(rs, OutcomeHeld) > len(rs)-c.quorum:
		return newQuorumError("release", l.resources, c.quorum, rs, false, ErrLockLost)
	}
	q := newQuorumError("release", l.resources, c.quorum, rs, true)
	return wrapf([]error{q}, "%s not released: %s; where the release did not run, its keys stay %s",
		lockName(l.resources), q.body(), untilText(expires))
}

// keysLeft names the nodes of a release round that answered an error:
// the release could not run there, so they keep the keys; "" for none.
func keysLeft(rs []NodeResult) string {
	var names []string
	for _, r := range rs {
		if r.Outcome == OutcomeError {
			names = append(names, r.Addr)
		}
	}
	return strings.Join(names, ", ")
}

// untilText says how long keys that expire at expires may stay.
func untilText(expires time.Time) string {
	left := time.Until(expires).Round(time.Millisecond)
	if left <= 0 {
		return "until their TTL runs out (it has by now)"
	}
	return fmt.Sprintf("until their TTL runs out, at most %v from now", left)
}

// keysExpireLocked bounds when the keys this Lock set may expire on the
// nodes, from this process's view: the start of its last acquire or extend
// round plus that round's TTL, or a longer earlier one (the nodes never
// lower a TTL), plus the node timeout within which the round's command
// went out. Keys that a layer shares with other Locks (reentrant.go) may
// live longer. l.mu is held.
func (l *Lock) keysExpireLocked() time.Time {
	if l.until.IsZero() {
		return l.expires
	}
	return later(l.expires, l.until.Add(l.c.drift(l.ttl)+l.nodeTimeout()))
}

// nodeTimeout returns the node timeout of l's rounds.
func (l *Lock) nodeTimeout() time.Duration {
	if l.cfg.nodeTimeout > 0 {
		return l.cfg.nodeTimeout
	}
	return l.c.cfg.nodeTimeout
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// releaseCall returns the call of the release script (kindRelease) or of
// an undo (kindUndo: a failed attempt, whose "held" answers are another
// holder's keys) for attempt a, with the extra layers after l's. It goes
// out as a cleanup (release, undo).
func (l *Lock) releaseCall(k scriptKind, a *attempt, extra ...layer) layerCall {
	op := "release"
	if k == kindUndo {
		op = "undo"
	}
	return l.scriptCall(k, op, a, parseInt(int64(l.n)), []any{a.value, l.n}, extra...)
}
