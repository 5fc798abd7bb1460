package redlock

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/schedlock/schedlock/tracing"
)

// Acquire takes a lock on all resources at once (all or nothing on each
// node), retrying quorum rounds with the retry policy (WithRetry; default
// DefaultRetry: jittered exponential backoff, giving up after 30 s, or up
// to 1 s later after a wait stretched to a holder's expiry) until it holds
// the lock, ctx ends, or the policy gives up. When a quorum of nodes
// reports one holder, the wait between rounds ends as soon as that holder
// releases (WithReleaseNotices), and otherwise lasts until the holder's key
// expires (at most 1 s) if that is longer than the policy's delay, so a
// policy's rounds may take longer in all than its delays add up to
// (WithRetry). Each round sends one script to every node
// in parallel, with the node timeout enforced here; the lock is held when a
// quorum granted and the validity left (TTL - elapsed - drift, measured
// from this round's own start) is at least the minimum. A failed round is
// undone on every node that may have granted, also on those that did not
// answer. After each failed round the retry condition (WithRetryIf), if
// any, may stop the call. ttl is rounded down to whole milliseconds.
//
// Errors: ErrInvalidArgument for bad input (no I/O then; or, for a
// WithMetadataFunc result that is too long, before that attempt);
// otherwise an error
// matching ErrNotAcquired, with the last round's *QuorumError (errors.As),
// ErrUnavailable when too many nodes failed (ErrMisconfigured when they
// answered with an error an operator must fix), ctx's cause when ctx
// ended, and
// ErrClosed (with no *QuorumError before any round) once the Client is
// closed.
// Safe for concurrent use. (redis.io distlock spec, steps 1-5.)
func (c *Client) Acquire(ctx context.Context, resources []string, ttl time.Duration, opts ...LockOption) (l *Lock, err error) {
	ctx, span := c.tel.startOp(ctx, tracing.SpanAcquire, resources, ttl)
	start, attempts := time.Now(), 0
	defer func() { c.tel.endAcquire(ctx, span, start, attempts, l, err) }()
	l, err = c.newLock(ctx, resources, ttl, opts, true)
	if err != nil {
		return nil, err
	}
	policy := l.cfg.retry()
	if policy == nil {
		return nil, invalidf("the retry policy factory (WithRetry) returned a nil policy")
	}
	policy.Reset()
	defer func(l *Lock) { l.done(err == nil) }(l)
	var last *QuorumError
	splits := 0 // split votes in a row
	for attempts = 1; ; attempts++ {
		if c.closed.Load() {
			l.end()
			if last == nil {
				return nil, wrapf([]error{ErrNotAcquired, ErrClosed}, "%s not acquired: the client is closed", lockName(l.resources))
			}
			return nil, wrapf([]error{ErrNotAcquired, ErrClosed, last}, "%s not acquired%s: the client is closed; %s: %s",
				lockName(l.resources), attemptsText(attempts-1), lastAttempt(attempts-1), last.body())
		}
		if err := l.nextMetadata(); err != nil {
			return nil, err
		}
		q := c.attempt(ctx, l, attempts, true)
		if q == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			if last == nil || !cutShort(q) {
				last = q
			}
			return nil, l.fail(ctx, attempts, last)
		}
		last = q
		if splitVote(q) {
			splits++
		} else {
			splits = 0
		}
		d, err := l.nextDelay(policy, attempts, splits, q)
		if err != nil {
			return nil, err
		}
		c.pause(ctx, l, last, d)
		if ctx.Err() != nil {
			return nil, l.fail(ctx, attempts, last)
		}
	}
}

// pause spends the delay d after l's failed attempt q: a layer may spend
// it (layer.wait); otherwise a sleep until d passes or ctx ends, in a
// wait span.
func (c *Client) pause(ctx context.Context, l *Lock, q *QuorumError, d time.Duration) {
	for _, y := range l.layers {
		if y.wait(ctx, l, q, d) {
			return
		}
	}
	c.tel.wait(ctx, q, d, nil, false)
}

// done tells l's layers that its acquisition ended.
func (l *Lock) done(acquired bool) {
	for _, y := range l.layers {
		y.done(l, acquired)
	}
}

// nextDelay returns the delay before the attempt after attempt n, which
// failed with q after splits split votes in a row, or the error that ends
// the acquisition: the retry condition (WithRetryIf) or the retry policy
// stopped it.
func (l *Lock) nextDelay(policy backoff.BackOff, n, splits int, q *QuorumError) (time.Duration, error) {
	stop, d := "the retry condition (WithRetryIf) stopped it", time.Duration(backoff.Stop)
	if l.cfg.retryIf == nil || l.cfg.retryIf(n, q) {
		stop, d = "the retry policy (WithRetry) gave up", policy.NextBackOff()
	}
	switch {
	case d == backoff.Stop:
		l.end()
		return 0, wrapf([]error{q}, "%s not acquired%s: %s; %s: %s",
			lockName(l.resources), attemptsText(n), stop, lastAttempt(n), q.body())
	case splits > 0:
		// The resource is free: retry soon, at a random moment that
		// desynchronizes the contenders, and never later than the policy
		// would after a split vote lasts.
		return min(splitDelay(splits), max(d, maxSplitDelay+time.Millisecond)), nil
	}
	return d, nil
}

// TryAcquire is Acquire with exactly one quorum round and no retry. For
// one resource and no option that adds to the acquire script (WithOwner,
// WithFencing, restart gating, WithRecord, WithHighWater) that round is
// SET NX GET rather than the acquire script (Redis 7.0 or later; a node
// that rejects it gets the script). A round that can no longer succeed
// still waits for the other nodes' answers (at most the node timeout), so
// that its undo goes only to nodes that may have granted, and none when
// every node refused. Errors: ErrInvalidArgument for bad input (no I/O
// then); a *QuorumError (matching ErrNotAcquired, and ErrUnavailable when
// too many nodes failed, ErrMisconfigured when they answered with an error
// an operator must fix); ErrClosed (with ErrNotAcquired) after Close;
// or, when ctx ended, an error matching ErrNotAcquired and ctx's cause.
// Safe for concurrent use.
func (c *Client) TryAcquire(ctx context.Context, resources []string, ttl time.Duration, opts ...LockOption) (l *Lock, err error) {
	ctx, span := c.tel.startOp(ctx, tracing.SpanTryAcquire, resources, ttl)
	start, attempts := time.Now(), 0
	defer func() { c.tel.endAcquire(ctx, span, start, attempts, l, err) }()
	l, err = c.newLock(ctx, resources, ttl, opts, false)
	if err != nil {
		return nil, err
	}
	defer func(l *Lock) { l.done(err == nil) }(l)
	if ctx.Err() != nil {
		return nil, l.fail(ctx, 0, nil)
	}
	if err := l.nextMetadata(); err != nil {
		return nil, err
	}
	attempts = 1
	if q := c.attempt(ctx, l, 1, false); q != nil {
		if ctx.Err() != nil {
			return nil, l.fail(ctx, 1, q)
		}
		l.end()
		return nil, q
	}
	return l, nil
}

// cutShort reports whether q's round learned nothing: every node's call
// was cut short by the caller's ctx.
func cutShort(q *QuorumError) bool {
	for _, r := range q.Nodes {
		if !r.canceled {
			return false
		}
	}
	return true
}

// fail ends the acquisition and returns the error of one that ctx ended.
func (l *Lock) fail(ctx context.Context, attempts int, last *QuorumError) error {
	l.end()
	cause := context.Cause(ctx)
	if last == nil {
		return wrapf([]error{ErrNotAcquired, cause}, "%s not acquired%s: %v", lockName(l.resources), attemptsText(attempts), cause)
	}
	return wrapf([]error{ErrNotAcquired, cause, last}, "%s not acquired%s: %v; %s: %s",
		lockName(l.resources), attemptsText(attempts), cause, lastAttempt(attempts), last.body())
}

// lastAttempt introduces the outcome of the last of n attempts.
func lastAttempt(n int) string {
	if n > 1 {
		return "last attempt"
	}
	return "the attempt"
}

// end marks a failed acquisition.
func (l *Lock) end() {
	l.mu.Lock()
	l.state = stateReleased
	l.mu.Unlock()
}

// attempt is one acquisition attempt, steps 1-5 of the redis.io page: T1,
// one round on every node, the quorum decision, the validity, and on
// failure the undo on every node. It returns nil when l is now held.
// retrying says that the attempt is Acquire's (which retries), not
// TryAcquire's.
func (c *Client) attempt(ctx context.Context, l *Lock, n int, retrying bool) *QuorumError {
	a := l.nextAttempt()
	start := time.Now() // T1
	k := l.scriptCall(kindAcquire, "acquire", a, nil, []any{a.value, l.ttl.Milliseconds(), l.n})
	k.parse = parseAcquire(l, k, a.value)
	rs := c.round(ctx, c.acquireSpec(l, k, a.value, n, retrying))
	qerr := c.granted(ctx, a, k, rs)
	if qerr == nil {
		v := c.validity(start, l.ttl)
		if v > 0 && v >= time.Duration(float64(l.ttl)*c.cfg.minValidity) {
			l.mu.Lock()
			l.state, l.until, l.granted = stateHeld, start.Add(l.ttl-c.drift(l.ttl)), time.Now()
			l.mu.Unlock()
			c.tel.held.Add(ctx, 1)
			return nil
		}
		qerr = newQuorumError("acquire", l.resources, c.quorum, rs, false, ErrNotAcquired)
		qerr.weak, qerr.validity, qerr.minimum = true, v, time.Duration(float64(l.ttl)*c.cfg.minValidity)
	}
	qerr.refusal = l.cfg.refusalText
	// Undo on every node that may have granted, also where the answer is
	// missing or an error (step 5); a refusal set nothing, and a node
	// that the round never asked (its asking order gave it up) got
	// nothing.
	// Why the undo never overtakes its own grant on a node: Client.undo.
	skip, none := make([]bool, len(rs)), true
	for i, r := range rs {
		skip[i] = r.refused || r.unsent
		none = none && skip[i]
	}
	if !none { // else every node refused: nothing to undo
		c.undo(ctx, l.releaseCall(kindUndo, a).call, skip)
	}
	return qerr
}

// nextMetadata sets the metadata of the next attempt from WithMetadataFunc,
// if given; a result that is too long ends the acquisition.
func (l *Lock) nextMetadata() error {
	if l.cfg.metadataFunc == nil {
		return nil
	}
	md := l.cfg.metadataFunc()
	if len(md) > MaxMetadata {
		l.end()
		return invalidf("metadata (WithMetadataFunc) is %d bytes, more than the maximum %d", len(md), MaxMetadata)
	}
	l.cfg.metadata = md
	return nil
}

// granted returns nil when a quorum of rs granted attempt a and its
// layers' steps after a grant (layer.granted) succeeded.
func (c *Client) granted(ctx context.Context, a *attempt, k layerCall, rs []NodeResult) *QuorumError {
	if count(rs, OutcomeOK) < c.quorum {
		return newQuorumError("acquire", a.l.resources, c.quorum, rs, false, ErrNotAcquired)
	}
	for _, y := range k.in {
		if q := y.granted(ctx, a, k.layout, k.call, rs); q != nil {
			return q
		}
	}
	return nil
}

// nextAttempt starts an attempt: its value (a new owner token, unless a
// layer gives the attempt a token of its own, layer.begin) becomes the
// Lock's. Every attempt has its own owner token, or a layer that keeps
// the token tells its attempts apart itself, so that the undo or cleanup
// of one attempt never deletes what a later attempt set.
func (l *Lock) nextAttempt() *attempt {
	a := &attempt{l: l, token: newToken()}
	for _, y := range l.layers {
		y.begin(a)
	}
	a.value = buildValue(a.token, l.tp, l.cfg.metadata)
	l.mu.Lock()
	l.value = a.value
	l.mu.Unlock()
	return a
}

// acquireSpec returns the acquire round of one attempt, k (its script
// from the Lock's layers: scripts/acquire.lua).
func (c *Client) acquireSpec(l *Lock, k layerCall, value string, n int, retrying bool) broadcast {
	spec := broadcast{call: k.call, attempt: n, ttl: l.ttl,
		// Acquire's retries do not wait for a node that timed out until
		// it answers again; a first attempt (and TryAcquire, which a
		// caller may retry through a burst that only slows the nodes)
		// waits for every node, and so does a settling round.
		skipDown: retrying && n > 1,
		wait:     untilKnown,
		order:    l.order(), // a layer's (layer.order), or every node at once
	}
	if !retrying || l.cfg.patient {
		// A TryAcquire, or a patient round (WithPatientRounds), that lost
		// waits for the answers still due, also from nodes that are down,
		// so that its undo does not go to nodes that refused (a fleet's
		// losers sent one undo per scheduled time each).
		spec.wait = untilSettled
	}
	if !retrying && len(l.keys) == 1 && len(k.in) == 0 {
		// A plain one-key lock tried once: SET NX GET does what the script
		// does there, and Redis runs a plain command faster than a script.
		spec.plain = &call{op: "acquire", args: []any{"set", l.keys[0], value, "px", l.ttl.Milliseconds(), "nx", "get"},
			keys: l.keys, parse: parseSetGet(l, value)}
	}
	return spec
}

// maxSplitDelay bounds the random delay after a split vote; it doubles
// with each further split vote in a row, since minority keys that are not
// undone soon (a contender that crashed leaves them to their TTL) would
// otherwise be polled every few milliseconds.
const maxSplitDelay = 15 * time.Millisecond

// splitDelay returns the random delay before the next round after n split
// votes in a row: 1 ms to maxSplitDelay x 2^(n-1).
func splitDelay(n int) time.Duration {
	return time.Millisecond + rand.N(maxSplitDelay<<min(n-1, 12))
}

// splitVote reports whether q is an acquire round that contenders split:
// nodes refused for holders, no holder has a quorum among the answers,
// and the nodes that failed cannot complete one. A node that the round
// did not wait for (OutcomePending) may still hold a holder's key that
// would make a quorum: the delay that doubles with each split in a row
// bounds the rounds spent on such a holder until its keys expire or a
// round hears that node. Each contender undoes its minority, so the
// resource is free: the next round should come soon, at a random moment
// that desynchronizes the contenders (redis.io distlock spec, "Retry on
// failure"), not after a retry delay sized for a held lock; no holder's
// release will end a layer's wait (layer.wait) either.
func splitVote(q *QuorumError) bool {
	if q.weak || slices.ContainsFunc(q.sentinels, func(e error) bool {
		return e == ErrUnavailable || e == ErrMisconfigured || e == ErrClosed
	}) {
		return false
	}
	if q.Count(OutcomeHeld) == 0 || q.HolderUnknown() {
		return false
	}
	_, held := quorumHolder(q)
	return !held
}
