package redlock

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/tracing"
)

// Lock is a lock held on a quorum of nodes, as returned by Acquire and
// TryAcquire. Its methods are safe for concurrent use. The lock value (a
// random 128-bit owner token) is never exposed or logged.
type Lock struct {
	c         *Client
	resources []string
	keys      []string // lock keys, holds hashes (reentrant), fencing counters, gate marker
	nlock     int      // number of lock keys
	aid       string   // acquisition ID of a reentrant lock (WithOwner), else ""
	value     string   // owner token, trace context, metadata (see buildValue)
	fencing   bool
	// keyArgs and valueArg are keys and value as command arguments, boxed
	// once: each boxing (string to any) is an allocation, and every round
	// sends them. keyArg holds keyArgs of a one-key lock.
	keyArgs  []any
	valueArg any
	keyArg   [1]any
	token    uint64 // fencing token, set once held

	mu      sync.Mutex
	state   lockState
	ttl     time.Duration
	until   time.Time
	granted time.Time // when the lock was first held (hold duration metric)
	// undone is the last undo round's results (attempt).
	undone []NodeResult
	// final is closed once every script of the last round that deletes
	// the lock's keys (the Release, or the undo of the last failed attempt)
	// has been answered or dropped; their results are then in finalRS (see
	// lateGrant). Made on first use (finalLocked); finalDone says closed.
	final     chan struct{}
	finalRS   []NodeResult
	finalDone bool
}

type lockState int

const (
	statePending  lockState = iota // acquisition in progress
	stateHeld                      // acquired, validity per until
	stateLost                      // known lost; keys may remain until Release
	stateReleased                  // released, or the acquisition failed for good
)

// Resources returns a copy of the lock's resource names, in the order given
// to Acquire.
func (l *Lock) Resources() []string {
	if l == nil {
		return nil
	}
	return slices.Clone(l.resources)
}

// FencingToken returns the lock's fencing token: a number that strictly
// increases across successive holders of each of its resources, or 0 when
// the lock was acquired without fencing (WithFencing). One token covers all
// resources of a multi-resource lock. Pass it with every write to the
// protected resource, which must reject a token lower than the highest it
// has seen. docs/fencing.md gives the guarantee and its assumptions.
func (l *Lock) FencingToken() uint64 {
	if l == nil {
		return 0
	}
	return l.token
}

// Metadata returns the metadata stored with the lock (WithMetadata).
func (l *Lock) Metadata() string {
	if l == nil {
		return ""
	}
	_, md, _ := splitValue(l.value)
	return md
}

// tokenLen is the length of the owner token at the start of a lock value.
const tokenLen = 32

// buildValue lays out a lock value: the owner token (token's 16 bytes as
// 32 hex digits), then "T" and the W3C traceparent of the acquiring span
// (55 characters) or "-" when there is none, then the metadata. Other
// clients read the trace context and metadata of a holder from a refused
// round; the owner token never leaves this package.
//
// On a node, a waiting Acquire that the key refused turns the byte after
// the token into its wait mark, '-' into '_' and 'T' into 't' (see
// acquireScript), so that the holder's release publishes a notice; the
// owner token, which every ownership check compares, stays as it is.
func buildValue(token []byte, tp, metadata string) string {
	var h [tokenLen]byte
	hex.Encode(h[:], token[:tokenLen/2])
	var v strings.Builder // one allocation: the value itself
	v.Grow(tokenLen + 1 + len(tp) + len(metadata))
	v.Write(h[:])
	if tp == "" {
		v.WriteByte('-')
	} else {
		v.WriteByte('T')
		v.WriteString(tp)
	}
	v.WriteString(metadata)
	return v.String()
}

// splitValue returns the trace context and metadata of a lock value,
// marked or not; ok is false for a value not written by this package.
func splitValue(v string) (tp, metadata string, ok bool) {
	switch {
	case len(v) > tokenLen && (v[tokenLen] == '-' || v[tokenLen] == '_'):
		return "", v[tokenLen+1:], true
	case len(v) >= tokenLen+1+traceparentLen && (v[tokenLen] == 'T' || v[tokenLen] == 't'):
		return v[tokenLen+1 : tokenLen+1+traceparentLen], v[tokenLen+1+traceparentLen:], true
	}
	return "", "", false
}

// unmarked returns v without its wait mark (buildValue): the value as its
// owner wrote it, the same on every node.
func unmarked(v string) string {
	if len(v) <= tokenLen {
		return v
	}
	switch v[tokenLen] {
	case '_':
		return v[:tokenLen] + "-" + v[tokenLen+1:]
	case 't':
		return v[:tokenLen] + "T" + v[tokenLen+1:]
	}
	return v
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

// TTL returns the TTL of the last successful acquire or extend.
func (l *Lock) TTL() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// newLock validates resources and ttl and prepares an acquisition with a new
// random value.
func (c *Client) newLock(ctx context.Context, resources []string, ttl time.Duration, a acquireConfig) (*Lock, error) {
	if err := c.checkTTL(ttl); err != nil {
		return nil, err
	}
	if len(a.metadata) > MaxMetadata {
		return nil, invalidf("metadata of %d bytes exceeds %d", len(a.metadata), MaxMetadata)
	}
	if a.ownerSet && (a.owner == "" || len(a.owner) > MaxOwner) {
		return nil, invalidf("owner ID of %d bytes is empty or exceeds %d", len(a.owner), MaxOwner)
	}
	if len(resources) == 0 {
		return nil, invalidf("empty resource list")
	}
	if c.cfg.gate > 0 && ttl > c.cfg.gate {
		return nil, invalidf("TTL %v exceeds the restart gate's maximum TTL %v", ttl, c.cfg.gate)
	}
	n := len(resources)
	nkeys := n // lock keys, then holds hashes, fencing counters, gate marker
	if a.owner != "" {
		nkeys += n
	}
	if a.fencing {
		nkeys += n
	}
	if c.cfg.gate > 0 {
		nkeys++
	}
	// One array holds the resources (a copy) and the keys.
	names := make([]string, n+nkeys)
	copy(names, resources)
	resources, keys := names[:n:n], names[n:n]
	for i, r := range resources {
		if r == "" {
			return nil, invalidf("resource %d is empty", i)
		}
		if j := slices.Index(resources[:i], r); j >= 0 {
			return nil, invalidf("resource %q appears twice (at %d and %d)", r, j, i)
		}
		keys = append(keys, c.cfg.keyPrefix+r)
	}
	var b [tokenLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	token, aid := b[:], ""
	if a.owner != "" {
		// Every acquisition of one owner shares the owner token; each has
		// its own acquisition ID, its hold.
		sum := sha256.Sum256([]byte("schedlock/redlock owner\x00" + a.owner))
		token, aid = sum[:tokenLen/2], hex.EncodeToString(b[:8])
		for _, k := range keys[:n] {
			keys = append(keys, k+holdsSuffix)
		}
	}
	if a.fencing {
		for _, k := range keys[:n] {
			keys = append(keys, k+fencingSuffix)
		}
	}
	if c.cfg.gate > 0 {
		keys = append(keys, c.cfg.keyPrefix+gateKey)
	}
	value := buildValue(token, traceparent(trace.SpanContextFromContext(ctx)), a.metadata)
	l := &Lock{c: c, resources: resources, keys: keys, nlock: n, aid: aid,
		value: value, valueArg: value, fencing: a.fencing, ttl: ttl}
	l.keyArgs = l.keyArg[:0]
	if len(keys) > 1 {
		l.keyArgs = make([]any, 0, len(keys))
	}
	for _, k := range keys {
		l.keyArgs = append(l.keyArgs, k)
	}
	return l, nil
}

// fencingSuffix turns a lock key into its fencing counter's key, and
// holdsSuffix into the hash of a reentrant lock's holds.
const (
	fencingSuffix = ":fencing"
	holdsSuffix   = ":holds"
)

// gateKey is the restart gate marker on each node (after the key prefix).
const gateKey = "redlock:restart-gate"

func (c *Client) acquireConfig(opts []AcquireOption) (acquireConfig, error) {
	a := acquireConfig{retry: c.cfg.retry, fencing: c.cfg.fencing}
	if len(opts) == 0 {
		return a, nil // a stays on the stack: options take its address
	}
	p := new(acquireConfig)
	*p = a
	for _, o := range opts {
		if o == nil {
			return *p, invalidf("nil AcquireOption")
		}
		o.applyAcquire(p)
	}
	if p.retry == nil {
		return *p, invalidf("nil retry policy factory")
	}
	return *p, nil
}

// Acquire takes a lock on all resources at once (all or nothing on each
// node), retrying quorum rounds with the retry policy (WithRetry; default
// DefaultRetry: jittered exponential backoff, at most 30 s) until it holds
// the lock, ctx ends, or the policy gives up. A release of the lock wakes
// it before the policy's delay ends, and while every node confirms its
// subscription to release notices the delay is stretched to the holder's
// expiry, at most 1 s (WithReleaseNotices). Each round sends one script to
// every node in parallel, with the per-node timeout enforced here; the lock
// is held when a quorum granted and the validity left (TTL - elapsed - drift,
// measured from this round's own start) is at least the minimum. A failed
// round is undone on every node, including those that did not answer.
// ttl is rounded down to whole milliseconds.
//
// Errors: ErrInvalidArgument for bad input (no I/O then); otherwise an error
// matching ErrNotAcquired, with the last round's *QuorumError (errors.As),
// ErrUnavailable when too many nodes failed, and ctx's cause when ctx ended.
// Safe for concurrent use. (redis.io distlock spec, steps 1-5.)
func (c *Client) Acquire(ctx context.Context, resources []string, ttl time.Duration, opts ...AcquireOption) (l *Lock, err error) {
	ctx, span := c.tel.startOp(ctx, tracing.SpanAcquire, resources, ttl)
	start := time.Now()
	attempts := 0
	defer func() { c.endAcquire(ctx, span, start, attempts, l, err) }()
	a, err := c.acquireConfig(opts)
	if err != nil {
		return nil, err
	}
	l, err = c.newLock(ctx, resources, ttl, a)
	if err != nil {
		return nil, err
	}
	policy := a.retry()
	policy.Reset()
	var last *QuorumError
	var channels []string // release notices, once contended (wake.go)
	var gen uint64
	for attempts = 1; ; attempts++ {
		if ctx.Err() != nil {
			attempts--
			return nil, l.fail(ctx, attempts, last)
		}
		if channels != nil {
			gen = c.wake.gen(channels)
		}
		q := c.attempt(ctx, l, attempts, false)
		if q == nil {
			return l, nil
		}
		if ctx.Err() != nil && last != nil && q.Count(OutcomeError)+q.Count(OutcomeTimeout) == len(q.Nodes) {
			// ctx ended this round before any node answered: the error
			// keeps the last round that learned something.
			return nil, l.fail(ctx, attempts, last)
		}
		last = q
		d := policy.NextBackOff()
		if d == backoff.Stop {
			l.abandon()
			return nil, fmt.Errorf("redlock: retry policy gave up after %d attempts: %w", attempts, last)
		}
		if channels == nil && !c.cfg.noWake && last.Count(OutcomeHeld) > 0 {
			channels = l.releaseChannels()
			defer c.wake.watch(channels)()
			gen = c.wake.gen(channels)
		}
		if channels != nil {
			c.wake.sleep(ctx, channels, gen, d, last.holderExpires())
		} else {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		if ctx.Err() != nil {
			return nil, l.fail(ctx, attempts, last)
		}
	}
}

// noticeID returns the payload of l's release notices: 16 hex digits of a
// hash of its value, the same on every node, which says nothing about the
// owner token.
func (l *Lock) noticeID() string {
	var buf [256]byte // the value, hashed without an allocation of its own
	sum := sha256.Sum256(append(buf[:0], l.value...))
	return hex.EncodeToString(sum[:8])
}

// detached returns ctx without its cancellation (context.WithoutCancel),
// or ctx itself when it can never be cancelled.
func detached(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// releaseChannels returns the channels of the release notices of l's lock
// keys (releaseScript).
func (l *Lock) releaseChannels() []string {
	chs := make([]string, l.nlock)
	for i, k := range l.keys[:l.nlock] {
		chs[i] = k + releasedSuffix
	}
	return chs
}

// endAcquire records an Acquire or TryAcquire call's outcome on its span
// and metrics.
func (c *Client) endAcquire(ctx context.Context, span trace.Span, start time.Time, attempts int, l *Lock, err error) {
	outcome, _ := classify(err)
	if c.tel.acquireDur.Enabled(ctx) {
		c.tel.acquireDur.Record(ctx, time.Since(start).Seconds(), outcomeAttrs(outcome))
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.Attempts.Int(attempts))
		if err == nil && l.fencing {
			span.SetAttributes(tracing.FencingToken.Int64(int64(l.token)))
		}
	}
	endOp(span, err)
}

// TryAcquire is Acquire with exactly one quorum round and no retry. For
// one resource without WithOwner, WithFencing or restart gating that round
// is SET NX GET rather than the acquire script (Redis 7.0 or later; a node
// that rejects it gets the script): it reports the holder's metadata
// (QuorumError.Holder) like the script. Errors: ErrInvalidArgument for bad
// input (no I/O then); a *QuorumError (matching ErrNotAcquired, and
// ErrUnavailable when too many nodes failed); or, when ctx had ended, an
// error matching ErrNotAcquired and ctx's cause.
func (c *Client) TryAcquire(ctx context.Context, resources []string, ttl time.Duration, opts ...AcquireOption) (l *Lock, err error) {
	ctx, span := c.tel.startOp(ctx, tracing.SpanTryAcquire, resources, ttl)
	start := time.Now()
	attempts := 0
	defer func() { c.endAcquire(ctx, span, start, attempts, l, err) }()
	a, err := c.acquireConfig(opts)
	if err != nil {
		return nil, err
	}
	l, err = c.newLock(ctx, resources, ttl, a)
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, l.fail(ctx, 0, nil)
	}
	attempts = 1
	if qerr := c.attempt(ctx, l, 1, true); qerr != nil {
		if ctx.Err() != nil {
			return nil, l.fail(ctx, 1, qerr)
		}
		l.abandon()
		return nil, qerr
	}
	return l, nil
}

// fail marks the acquisition abandoned and returns the error for an
// acquisition ended by ctx.
func (l *Lock) fail(ctx context.Context, attempts int, last *QuorumError) error {
	l.abandon()
	if last == nil {
		return fmt.Errorf("%w after %d attempts: %w", ErrNotAcquired, attempts, context.Cause(ctx))
	}
	return fmt.Errorf("%w after %d attempts: %w (last round: %w)", ErrNotAcquired, attempts, context.Cause(ctx), last)
}

// abandon marks a failed acquisition, so that grants arriving late are
// deleted by the goroutine that receives them. attempt already cleaned up
// every node it reached.
func (l *Lock) abandon() {
	l.mu.Lock()
	l.state = stateReleased
	l.finishLocked(l.undone)
	l.mu.Unlock()
}

// finishRelease is the settled function of a release round (roundSpec):
// a plain function, as a closure over l cost an allocation per release.
func finishRelease(l *Lock, all []NodeResult) {
	l.mu.Lock()
	l.finishLocked(all)
	l.mu.Unlock()
}

// finishLocked records the results of the last round that deleted the
// lock's keys, for late grants (lateGrant). l.mu must be held.
func (l *Lock) finishLocked(rs []NodeResult) {
	if l.finalDone {
		return
	}
	l.finalDone, l.finalRS = true, rs
	if l.final != nil {
		close(l.final)
	}
}

// finalLocked returns the channel that finishLocked closes, made on first
// use: only late grants wait on it (cleanLate), and a channel made for
// every lock cost an allocation per acquisition. l.mu must be held.
func (l *Lock) finalLocked() <-chan struct{} {
	if l.final == nil {
		l.final = make(chan struct{})
		if l.finalDone {
			close(l.final)
		}
	}
	return l.final
}

// attempt runs acquire round number n for l and returns nil when l is now
// held. once is true for TryAcquire, which never waits for the holder.
func (c *Client) attempt(ctx context.Context, l *Lock, n int, once bool) *QuorumError {
	ttl := l.ttl
	start := time.Now()
	wait := !once && !c.cfg.noWake // a refusal marks the key for a release notice
	spec := roundSpec{
		op: "acquire", attempt: n, ttl: ttl,
		parse: parseAcquireReply,
		early: true,
		late:  l,
		lock:  l,
	}
	if once && n == 1 && l.nlock == 1 && l.aid == "" && !l.fencing && c.cfg.gate == 0 {
		// TryAcquire of a plain one-key lock sends SET NX GET: the key
		// can hold this new value only if this very command ran before
		// (go-redis sends it again after a connection error), which
		// parseAcquireReply counts as granted, and the script's other
		// cases (reentrancy, fencing, gating) cannot arise. Redis runs a
		// plain command 2-3x faster than a script.
		// (Its reply is read raw, so that go-redis's retry classifier
		// never sees the nil that means granted, 17 allocations per node:
		// pipeline.go, cook. The script instead cost about 12% of the
		// sequential ops/s on 3 nodes, docs/design.md.)
		// It returns the holder's value like the script, but not its
		// TTL, which only a waiting Acquire needs (its wait is stretched
		// to the holder's expiry: without it a contended Acquire polled
		// one round more, +50% commands per contended acquisition).
		// A node that rejects it (Redis before 7.0) gets the script.
		spec.cmd = []any{"set", l.keyArgs[0], l.valueArg, "px", ttl.Milliseconds(), "nx", "get"}
		spec.alt, spec.altScript = tryAcquireCmd, acquireScript
	} else {
		spec.script, spec.cmd = acquireScript, c.acquireCmd(l, wait)
	}
	rs := c.round(ctx, spec)
	// A reentrant hold keeps the token its owner's hold recorded (kept),
	// unless another owner has recorded a larger one since: a hold that
	// some node still reports may be stale (its release did not reach that
	// node, or ran there out of order). Any larger token was recorded on a
	// majority, which shares a node with this round's grants, and that
	// node's fresh token (1 + its counter) then exceeds kept + 1: the
	// acquisition is a new hold, with the largest fresh token, recorded by
	// a fence round. Counting the nodes that report the hold cannot tell
	// the two apart (a live hold's quorum may have a slow node). The shared
	// node may have answered, though, before a holder whose hold
	// overlapped this round recorded its token there: so a re-entry is
	// confirmed by a check round after the grants (checkScript: every
	// counter at most kept, on a majority), or becomes a new hold.
	var token, kept uint64
	again := false
	for _, r := range rs {
		switch {
		case r.Outcome != OutcomeOK:
		case r.reentered:
			again = true
			kept, token = max(kept, r.token), max(token, r.fresh)
		default:
			token = max(token, r.token)
		}
	}
	reentered := again && kept+1 >= token && count(rs, OutcomeOK) >= c.quorum
	var checkErr *QuorumError
	if reentered {
		// A node with a larger counter makes it a new hold; too few
		// answers leave it unknown, and the attempt fails (a new token
		// would fence off the outer hold's writes for nothing).
		crs := c.check(ctx, l, kept)
		switch {
		case count(crs, OutcomeOK) >= c.quorum:
		case count(crs, OutcomeHeld) > 0:
			reentered = false
			for _, r := range crs {
				if r.Outcome == OutcomeOK || r.Outcome == OutcomeHeld {
					token = max(token, r.token+1)
				}
			}
		default:
			checkErr = c.quorumError("check", l.resources, crs, ErrNotAcquired)
		}
	}
	if reentered {
		token = kept
	}
	var qerr *QuorumError
	switch ok := count(rs, OutcomeOK); {
	case ok < c.quorum:
		qerr = c.quorumError("acquire", l.resources, rs, ErrNotAcquired)
	case checkErr != nil:
		qerr = checkErr
	case l.fencing && !reentered:
		// Record the token on a majority before handing out the lock, so
		// that every later acquisition's quorum sees it.
		if frs := c.fence(ctx, l, token); count(frs, OutcomeOK) < c.quorum {
			qerr = c.quorumError("fence", l.resources, frs, ErrNotAcquired)
		} else if l.aid != "" {
			c.note(ctx, l, token)
		}
	}
	validity := ttl - time.Since(start) - c.drift(ttl)
	if qerr == nil && validity >= time.Duration(float64(ttl)*c.cfg.minValidity) && validity > 0 {
		l.mu.Lock()
		l.state = stateHeld
		l.until = start.Add(ttl - c.drift(ttl))
		l.token = token
		l.granted = time.Now()
		l.mu.Unlock()
		c.tel.held.Add(ctx, 1)
		return nil
	}
	if qerr == nil {
		qerr = c.quorumError("acquire", l.resources, rs, ErrNotAcquired)
		qerr.Validity = validity
	}
	// Undo the attempt everywhere, also where the answer was missing or
	// an error: the script may have run there (redis.io distlock spec,
	// step 5). Detached from ctx, so a cancelled caller still cleans up.
	// A node that answered "held" set nothing of ours (the script is all
	// or nothing, and our own keys would have counted as ours; it may have
	// marked the holder's key for a release notice): skip it.
	skip := make([]bool, len(rs))
	for i, r := range rs {
		skip[i] = r.Outcome == OutcomeHeld
	}
	undone := c.releaseAll(detached(ctx), l, "undo", "", skip)
	l.mu.Lock()
	// A copy: round's results live in its state, which holds the caller's
	// ctx, and a Lock that a later attempt acquires may live long.
	l.undone = slices.Clone(undone)
	l.mu.Unlock()
	return qerr
}

// acquireCmd returns the acquire script's command for l (see acquireScript
// for its arguments); wait asks a refusal to mark the holder's key.
func (c *Client) acquireCmd(l *Lock, wait bool) []any {
	fencing, marks := "0", "0"
	if l.fencing {
		fencing = "1"
	}
	if wait {
		marks = "1"
	}
	return evalArgs(acquireScript, l.keyArgs, l.valueArg, l.ttl.Milliseconds(), l.nlock, fencing, c.cfg.gate.Milliseconds(), l.aid, marks)
}

// tryAcquireCmd is the acquire script's command for a TryAcquire round of
// l, the script form of its SET NX GET for old servers (roundSpec.alt).
func tryAcquireCmd(c *Client, l *Lock) []any { return c.acquireCmd(l, false) }

// parseAcquireReply reads the reply of the acquire script (parseAcquire)
// or of SET NX GET: nil when it set the key, else the holder's value. A
// value with the owner token of the command's own value means that the
// command ran before: go-redis sent it again after a connection error
// (EOF after the write, say), so the key is ours, set in this round with
// the lock's TTL (the acquire script's idempotence, scripts.go).
func parseAcquireReply(cmd *redis.Cmd) (reply, error) {
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return reply{ok: true}, nil
	case err != nil:
		return reply{}, err
	}
	if s, ok := v.(string); ok {
		if args := cmd.Args(); len(args) > 2 && sameOwner(s, args[2]) {
			return reply{ok: true}, nil
		}
		tp, holder, _ := splitValue(s) // never expose the other owner's token
		return reply{holder: holder, traceparent: tp}, nil
	}
	a, _ := v.([]any)
	return parseAcquire(a, nil)
}

// sameOwner reports whether the lock value v starts with the owner token
// of own, a lock value (a waiter may have marked the byte after it).
func sameOwner(v string, own any) bool {
	o, _ := own.(string)
	return len(o) >= tokenLen && len(v) >= tokenLen && v[:tokenLen] == o[:tokenLen]
}

// parseAcquire reads the acquire script's reply {1, token} or {0, holder}.
func parseAcquire(v []any, err error) (reply, error) {
	if err != nil {
		return reply{}, err
	}
	if len(v) < 2 {
		return reply{}, fmt.Errorf("redlock: unexpected acquire reply %v", v)
	}
	switch code, _ := v[0].(int64); code {
	case 1:
		token, _ := v[1].(int64)
		var again, fresh int64
		if len(v) > 2 {
			again, _ = v[2].(int64)
		}
		if len(v) > 3 {
			fresh, _ = v[3].(int64)
		}
		return reply{ok: true, token: uint64(token), reentered: again == 1, fresh: uint64(fresh)}, nil
	case 2:
		return reply{gated: true}, nil
	}
	value, _ := v[1].(string)
	tp, holder, _ := splitValue(value) // never expose the other owner's token
	r := reply{holder: holder, traceparent: tp}
	if len(v) > 2 {
		if ms, _ := v[2].(int64); ms > 0 {
			r.expires = time.Duration(ms) * time.Millisecond
		}
	}
	return r, nil
}

// fence records token on the fencing counters of l on every node (see
// fenceScript) and returns the round's results.
func (c *Client) fence(ctx context.Context, l *Lock, token uint64) []NodeResult {
	return c.round(ctx, roundSpec{
		op:     "fence",
		script: fenceScript, cmd: evalArgs(fenceScript, l.fenceKeys(), token, c.cfg.fencingRetention.Milliseconds()),
		parse: okParse(1),
		early: true,
		lock:  l,
	})
}

// check runs checkScript with kept, the token a re-entry of reentrant l
// would keep, on every node: OK where every counter of l is at most kept,
// and each node's largest counter as its token.
func (c *Client) check(ctx context.Context, l *Lock, kept uint64) []NodeResult {
	return c.round(ctx, roundSpec{
		op:     "check",
		script: checkScript, cmd: evalArgs(checkScript, l.fenceKeys(), kept),
		parse: parseCheck,
		early: true,
		lock:  l,
	})
}

// parseCheck reads checkScript's reply {ok, largest counter}.
func parseCheck(cmd *redis.Cmd) (reply, error) {
	v, err := cmd.Slice()
	if err != nil {
		return reply{}, err
	}
	if len(v) < 2 {
		return reply{}, fmt.Errorf("redlock: unexpected check reply %v", v)
	}
	ok, _ := v[0].(int64)
	m, _ := v[1].(int64)
	return reply{ok: ok == 1, token: uint64(m)}, nil
}

// note notes token, recorded on a majority, in the holds of reentrant l
// on every node (see noteScript), for the owner's re-entries. Best
// effort: a node without it gives the next re-entry a new token
// (Client.attempt), which is larger, so tokens stay monotonic.
func (c *Client) note(ctx context.Context, l *Lock, token uint64) {
	c.round(ctx, roundSpec{
		op:     "note",
		script: noteScript, cmd: evalArgs(noteScript, l.holdKeys(), token, l.aid),
		parse: okParse(1),
		early: true,
		lock:  l,
	})
}

// lateGrant handles an acquire answer that arrived after its round was
// decided. A grant for a pending or held lock belongs to it: the next undo
// or the Release deletes it, since a node runs its scripts in the order
// they were sent (pipeline.go: one batch in flight per node) and those
// rounds are sent after it. A grant for an acquisition that has ended
// (released, or failed for good) waits for that last deleting round and is
// deleted here only if that round did not delete it on this node: its
// script was dropped at the round's deadline, or failed.
func (l *Lock) lateGrant(n *node, _ reply) {
	l.mu.Lock()
	ended := l.state == stateReleased
	l.mu.Unlock()
	if !ended {
		return
	}
	l.c.cleanups.Add(1)
	go l.cleanLate(n)
}

// cleanLate waits for the last round that deleted l's keys and deletes
// them on n if that round did not (lateGrant).
func (l *Lock) cleanLate(n *node) {
	defer l.c.cleanups.Add(-1)
	l.mu.Lock()
	final := l.finalLocked()
	l.mu.Unlock()
	<-final // closed once the last deleting round has settled on every node
	l.mu.Lock()
	rs := l.finalRS
	l.mu.Unlock()
	if n.idx < len(rs) && rs[n.idx].Outcome == OutcomeOK {
		return
	}
	var err error
	for try := 0; try < 2; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), l.c.cfg.nodeTimeout)
		err = n.run(ctx, releaseScript, l.ownedKeys(), l.valueArg, l.aid, "").Err()
		cancel()
		// NOSCRIPT here means that the node answered after the deadline,
		// too late for EVAL; the script has been loaded meanwhile (redo),
		// so once more.
		if err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			break
		}
	}
	if err != nil {
		l.c.log.Warn("redlock: cleanup of a late grant failed; the key expires with its TTL",
			"resources", l.resources, "node", n.addr, "err", err)
	}
}

// releaseAll runs the release script on every node and waits for every
// answer up to the node timeout (the undo of a failed attempt; Release
// itself returns on a quorum). It does not wait for acquire calls still
// on their way: on each node the release runs after them (see lateGrant).
func (c *Client) releaseAll(ctx context.Context, l *Lock, op, notice string, skip []bool) []NodeResult {
	return c.round(ctx, c.releaseSpec(l, op, notice, skip))
}

// releaseSpec returns the round that runs the release script on every
// node. op names the round in telemetry: "release" for Release, "undo" for
// the cleanup of a failed attempt (whose "held" answers are the other
// holder's keys, not a lost lock). notice is the payload of the release
// notices, "" for none (only a Release wakes waiters: wake.go).
func (c *Client) releaseSpec(l *Lock, op, notice string, skip []bool) roundSpec {
	return roundSpec{op: op, skip: skip, script: releaseScript, lock: l,
		cmd: evalArgs(releaseScript, l.ownedKeys(), l.valueArg, l.aid, notice), parse: okParse(int64(l.nlock))}
}

// ownedKeys returns the lock keys and, for a reentrant lock, the holds
// hashes after them.
func (l *Lock) ownedKeys() []any {
	if l.aid != "" {
		return l.keyArgs[:2*l.nlock]
	}
	return l.keyArgs[:l.nlock]
}

// holdKeys returns the holds hashes of a reentrant lock (nil otherwise).
func (l *Lock) holdKeys() []any {
	if l.aid == "" {
		return nil
	}
	return l.keyArgs[l.nlock : 2*l.nlock]
}

// fenceKeys returns the fencing counters (nil without fencing).
func (l *Lock) fenceKeys() []any {
	if !l.fencing {
		return nil
	}
	off := l.nlock
	if l.aid != "" {
		off = 2 * l.nlock
	}
	return l.keyArgs[off : off+l.nlock]
}

// Extend sets the TTL of every key of the lock to ttl on the nodes where all
// of them still hold this lock's value (owner-checked in one script per
// node), and on success moves Until to this round's start + ttl - drift. It
// never creates a key and is never attempted after Until has passed.
//
// Errors: ErrInvalidArgument for a bad ttl or nil Lock; ErrLockLost when
// Until has passed, the lock was released, or too many nodes no longer hold
// it; otherwise a *QuorumError matching ErrUnavailable (nodes failed, so no
// quorum confirmed the extension): the lock then stays valid until its
// unchanged Until (a node's failure never
// releases the lock elsewhere). Bounded by the node timeout; ctx can end it
// sooner.
func (l *Lock) Extend(ctx context.Context, ttl time.Duration) (err error) {
	if l == nil {
		return invalidf("Extend on a nil *Lock")
	}
	ctx, span := l.c.tel.startOp(ctx, tracing.SpanExtend, l.resources, ttl)
	defer func() {
		if err != nil {
			l.c.tel.extendFailed.Add(ctx, 1)
		}
		endOp(span, err)
	}()
	return l.extend(ctx, ttl)
}

func (l *Lock) extend(ctx context.Context, ttl time.Duration) error {
	c := l.c
	if err := c.checkTTL(ttl); err != nil {
		return err
	}
	if err := l.checkHeld(); err != nil {
		return err
	}
	owner := "0"
	if l.aid != "" {
		owner = "1"
	}
	start := time.Now()
	rs := c.round(ctx, roundSpec{
		op: "extend",
		// No extension leaves after the validity ends: a script still
		// queued for a busy node at Until is dropped, never sent.
		deadline: l.Until(),
		script:   extendScript, cmd: evalArgs(extendScript, l.ownedKeys(), l.valueArg, ttl.Milliseconds(), owner),
		parse: okParse(1),
		early: true,
		lock:  l,
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateHeld {
		return fmt.Errorf("%w: %q released during Extend", ErrLockLost, l.resources)
	}
	if count(rs, OutcomeOK) >= c.quorum {
		until := start.Add(ttl - c.drift(ttl))
		if !time.Now().Before(until) {
			l.setStateLocked(ctx, stateLost)
			return fmt.Errorf("%w: %q extended too slowly (validity ended at %v)", ErrLockLost, l.resources, until)
		}
		l.until, l.ttl = until, ttl
		return nil
	}
	if count(rs, OutcomeHeld) > len(rs)-c.quorum {
		l.setStateLocked(ctx, stateLost)
		return c.quorumError("extend", l.resources, rs, ErrLockLost)
	}
	if !time.Now().Before(l.until) {
		l.setStateLocked(ctx, stateLost)
		return fmt.Errorf("%w: %q: validity ended at %v before a quorum confirmed the extension: %w",
			ErrLockLost, l.resources, l.until, c.unconfirmed("extend", l.resources, rs))
	}
	// Not lost for sure, not confirmed either: nodes failed.
	return c.unconfirmed("extend", l.resources, rs)
}

// checkHeld returns ErrLockLost unless l is held and within its validity.
func (l *Lock) checkHeld() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case stateReleased:
		return fmt.Errorf("%w: %q already released", ErrLockLost, l.resources)
	case stateLost:
		return fmt.Errorf("%w: %q", ErrLockLost, l.resources)
	}
	if !time.Now().Before(l.until) {
		l.setStateLocked(context.Background(), stateLost)
		return fmt.Errorf("%w: %q validity ended at %v", ErrLockLost, l.resources, l.until)
	}
	return nil
}

// setStateLocked moves l to state to, with l.mu held, and records the end
// of a hold in the metrics when l leaves stateHeld.
func (l *Lock) setStateLocked(ctx context.Context, to lockState) {
	if l.state == stateHeld && to != stateHeld {
		t := l.c.tel
		t.held.Add(ctx, -1)
		t.holdDur.Record(ctx, time.Since(l.granted).Seconds())
		if to == stateLost || !time.Now().Before(l.until) {
			t.lost.Add(ctx, 1)
		}
	}
	l.state = to
}

// Release deletes the lock's keys on every node where they still hold this
// lock's value (compare-and-delete in one script per node), on every node
// that takes its script within the node timeout. It returns as soon as the
// outcome is known: a quorum deleted them, or so many nodes failed or no
// longer held them that no quorum can (at most the node timeout); the
// scripts for the other nodes go on in the nodes' workers and are dropped
// if their node has not taken them by the node timeout (their keys expire
// with the TTL). It runs on a context detached from ctx's cancellation, so
// it cleans up even when ctx is already cancelled.
//
// It returns nil when a quorum confirmed the deletion within the validity.
// Errors: ErrInvalidArgument for a nil Lock; ErrLockLost when the lock was
// already released, its validity had ended, or too many nodes no longer held
// it (its keys are deleted anyway); otherwise a *QuorumError matching
// ErrUnavailable (nodes failed, so no quorum confirmed the deletion; keys
// left on them expire with the TTL). Calling
// Release twice returns ErrLockLost the second time (a plain error, no
// *QuorumError: nothing is sent).
func (l *Lock) Release(ctx context.Context) (err error) {
	if l == nil {
		return invalidf("Release on a nil *Lock")
	}
	ctx, span := l.c.tel.startOp(ctx, tracing.SpanRelease, l.resources, 0)
	defer func() { endOp(span, err) }()
	l.mu.Lock()
	prev, until := l.state, l.until
	l.setStateLocked(ctx, stateReleased)
	l.mu.Unlock()
	if prev == stateReleased {
		return fmt.Errorf("%w: %q already released", ErrLockLost, l.resources)
	}
	notice := ""
	if !l.c.cfg.noWake {
		notice = l.noticeID()
	}
	// The outcome is known once a quorum has deleted the keys (or so many
	// nodes failed that no quorum can): Release returns then, while the
	// rest of its scripts go on in the node workers, bounded by the node
	// timeout. Late grants wait for all of them (settled).
	spec := l.c.releaseSpec(l, "release", notice, nil)
	spec.early = true
	spec.settled, spec.detach = finishRelease, true
	rs := l.c.round(ctx, spec)
	expired := !time.Now().Before(until)
	ok := count(rs, OutcomeOK)
	switch {
	case ok >= l.c.quorum && !expired && prev == stateHeld:
		if !l.c.cfg.noWake {
			l.c.wake.released(l, notice)
		}
		return nil
	case expired || prev == stateLost:
		err := l.c.quorumError("release", l.resources, rs, ErrLockLost)
		return fmt.Errorf("%w: validity ended at %v: %w", ErrLockLost, until, err)
	case count(rs, OutcomeHeld) > len(rs)-l.c.quorum:
		return l.c.quorumError("release", l.resources, rs, ErrLockLost)
	default:
		return l.c.unconfirmed("release", l.resources, rs)
	}
}
