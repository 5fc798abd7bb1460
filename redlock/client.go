package redlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"

	"github.com/schedlock/schedlock/tracing"
)

// Client acquires locks on a fixed set of independent Redis nodes. It is
// immutable after New and safe for concurrent use by many goroutines. It
// starts no goroutine of its own except while an Acquire waits for a
// contended lock (WithReleaseNotices), and those end with the last such
// Acquire. It does not own the go-redis clients: closing them is the
// caller's job, after the last call has returned and Wait has returned (it
// waits for the commands that calls returning on a quorum left on their way
// to the other nodes).
type Client struct {
	nodes  []node
	quorum int
	cfg    config
	log    *slog.Logger
	tel    *telemetry
	wake   waker // release notices (wake.go)
	// cleanups counts the goroutines that delete late grants (lateGrant).
	cleanups atomic.Int32
}

type node struct {
	idx   int
	rdb   redis.UniversalClient
	addr  string
	queue nodeQueue // scripts waiting for this node (pipeline.go)
	// oldServer is set once the node rejected SET NX GET (Redis before
	// 7.0): it gets the acquire script instead (pipeline.go, redo).
	oldServer atomic.Bool
	timeout   time.Duration // the node timeout, for SCRIPT LOAD (redo)
	// inline: a round may send its op from the caller's goroutine when
	// the node is idle (node.sendInline). Set for the only node of a
	// Client whose *redis.Client has ContextTimeoutEnabled: go-redis then
	// applies the round's deadline to its own I/O, and with one node no
	// other node's answer could decide the round while this one is slow.
	inline bool
	// raw: the client is a *redis.Client, and SET NX GET goes as a
	// RawCmd (pipeline.go, sendsRaw).
	raw bool
	// work is the method value n.drain, made once: "go n.work()" would
	// allocate it at each worker's start (a sequential caller starts one
	// per command).
	work func()
}

// New returns a Client over nodes, each one independent Redis master (no
// replication between them; redis.io distlock spec, "The Redlock
// algorithm"). The quorum is len(nodes)/2+1 of the configured nodes, never of
// the nodes that happen to answer. One node is the single-instance lock of the
// redis.io page: correct while that node runs, not fault tolerant.
//
// Every command for a node goes through that node's queue and worker
// goroutine (auto-pipelining), so that a node that stops answering costs a
// round at most the node timeout whatever the client's options. One
// exception: when nodes has exactly one element, a *redis.Client with
// ContextTimeoutEnabled, a round that finds no other round in progress on
// it is sent from the calling goroutine instead of being handed to the
// node's worker and back (1.18x the acquire+release/s of one goroutine
// locking in a loop, against the same code with the handoff); go-redis
// then enforces the round's deadline on the I/O itself. Trade-off:
// cancelling ctx does not interrupt such a send, nor go-redis's waits for a
// pool connection or a dial within it; the call returns when the node
// answers, at the latest at the node timeout.
//
// go-redis hooks on a *redis.Client node see TryAcquire's SET NX GET as a
// *redis.RawCmd whose error replies are bytes, not errors (its reply is
// read raw: go-redis would otherwise run its retry classifier on the nil
// reply that means "granted", 17 allocations per node; docs/design.md). An
// error reply that go-redis retries (LOADING, READONLY, ...) to a command
// sent alone goes once more as a *redis.Cmd, which go-redis retries as
// usual; any other error reply is the node's error.
//
// A *redis.ClusterClient or *redis.Ring may stand for one node only if every
// resource of a multi-resource lock maps to one hash slot (use hash tags):
// the scripts touch all keys of a lock at once.
//
// New errors (matching ErrInvalidArgument) on no nodes, a nil node, the same
// client or address twice, and options out of range; it performs no I/O.
func New(nodes []redis.UniversalClient, opts ...Option) (*Client, error) {
	if len(nodes) == 0 {
		return nil, invalidf("no nodes")
	}
	cfg := config{
		driftFactor: DefaultDriftFactor,
		nodeTimeout: DefaultNodeTimeout,
		minValidity: DefaultMinValidity,
		retry:       DefaultRetry,

		fencingRetention: DefaultFencingRetention,
	}
	for _, o := range opts {
		if o == nil {
			return nil, invalidf("nil Option")
		}
		o.applyClient(&cfg)
	}
	switch {
	case math.IsNaN(cfg.driftFactor) || cfg.driftFactor < 0 || cfg.driftFactor >= 0.5:
		return nil, invalidf("drift factor %v is outside [0, 0.5)", cfg.driftFactor)
	case cfg.nodeTimeout <= 0:
		return nil, invalidf("node timeout %v is not positive", cfg.nodeTimeout)
	case math.IsNaN(cfg.minValidity) || cfg.minValidity < 0 || cfg.minValidity >= 1:
		return nil, invalidf("minimum validity %v is outside [0, 1)", cfg.minValidity)
	case cfg.retry == nil:
		return nil, invalidf("nil retry policy factory")
	case cfg.fencingRetention < time.Second:
		return nil, invalidf("fencing retention %v is below 1s", cfg.fencingRetention)
	case cfg.gate < 0 || (cfg.gate > 0 && cfg.gate < time.Millisecond):
		return nil, invalidf("restart gate %v is negative or below 1ms", cfg.gate)
	}
	log := cfg.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tel, err := newTelemetry(cfg)
	if err != nil {
		return nil, fmt.Errorf("redlock: telemetry: %w", err)
	}
	c := &Client{nodes: make([]node, len(nodes)), quorum: len(nodes)/2 + 1, cfg: cfg, log: log, tel: tel}
	c.wake.c = c
	seen := make(map[string]int, len(nodes))
	for i, rdb := range nodes {
		if rdb == nil || (reflect.ValueOf(rdb).Kind() == reflect.Pointer && reflect.ValueOf(rdb).IsNil()) {
			return nil, invalidf("node %d is nil", i)
		}
		id, addr := nodeIdentity(i, rdb)
		if j, dup := seen[id]; dup {
			return nil, invalidf("node %d (%s) repeats node %d: nodes must be independent", i, addr, j)
		}
		seen[id] = i
		c.nodes[i].idx, c.nodes[i].rdb, c.nodes[i].addr = i, rdb, addr
		c.nodes[i].timeout = cfg.nodeTimeout
		c.nodes[i].work = c.nodes[i].drain
		if rc, ok := rdb.(*redis.Client); ok {
			c.nodes[i].raw = true
			c.nodes[i].inline = len(nodes) == 1 && rc.Options().ContextTimeoutEnabled
		}
	}
	return c, nil
}

// nodeIdentity returns a key that is equal for two entries that reach the
// same Redis database, and a printable address.
func nodeIdentity(i int, rdb redis.UniversalClient) (id, addr string) {
	if c, ok := rdb.(*redis.Client); ok {
		o := c.Options()
		return fmt.Sprintf("%s/%s/%d", o.Network, o.Addr, o.DB), o.Addr
	}
	return fmt.Sprintf("%p", rdb), fmt.Sprintf("node%d", i)
}

// Wait blocks until no script is queued or on its way to any node and no
// late grant awaits its cleanup: the work that Release and Acquire leave
// behind when they return on a quorum (the other nodes' scripts, each
// dropped at its node timeout if its node has not taken it by then), and
// the deletion of grants that arrive after their round. Call it after the
// last Acquire or Release has returned and before closing the go-redis
// clients, at shutdown or in a test that inspects every node; under load
// from other goroutines it may never return, so give ctx a deadline. It
// polls every millisecond. nil means nothing is in flight, not that every
// key is gone: a script dropped at the node timeout, or one that failed on
// its node, leaves its key to expire with the TTL.
//
// Errors: ctx's cause when ctx ends first. Safe for concurrent use.
func (c *Client) Wait(ctx context.Context) error {
	var t *time.Timer
	for !c.idle() {
		if t == nil {
			t = time.NewTimer(time.Millisecond)
			defer t.Stop()
		} else {
			t.Reset(time.Millisecond)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// idle reports whether no node has a worker running and no late grant
// awaits its cleanup.
func (c *Client) idle() bool {
	if c.cleanups.Load() > 0 {
		return false
	}
	for i := range c.nodes {
		q := &c.nodes[i].queue
		q.mu.Lock()
		running := q.running
		q.mu.Unlock()
		if running {
			return false
		}
	}
	return true
}

// Quorum returns the number of nodes that must agree: N/2+1.
func (c *Client) Quorum() int { return c.quorum }

// Nodes returns the number of configured nodes N.
func (c *Client) Nodes() int { return len(c.nodes) }

// drift returns the clock drift allowance for ttl (redis.io reference
// implementations: TTL x driftFactor + 2 ms).
func (c *Client) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*c.cfg.driftFactor) + driftConstant
}

// checkTTL rejects TTLs that cannot be sent in milliseconds or can never
// leave enough validity.
func (c *Client) checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return invalidf("TTL %v is below 1ms (TTLs are sent in whole milliseconds)", ttl)
	}
	if ttl-c.drift(ttl) <= time.Duration(float64(ttl)*c.cfg.minValidity) {
		return invalidf("TTL %v is too short: the clock drift allowance %v leaves less than the minimum validity (%v of the TTL)",
			ttl, c.drift(ttl), c.cfg.minValidity)
	}
	return nil
}

// reply is one node's answer: ok is OutcomeOK versus OutcomeHeld; holder
// and token carry what an acquire script returned.
type reply struct {
	ok    bool
	gated bool // acquire: the node is within its restart gate
	// reentered: acquire of a reentrant owner that already held every key
	// with a recorded fencing token, which token is the token; fresh is
	// then the token a new hold would get (1 + the largest counter).
	reentered bool
	holder    string
	token     uint64
	fresh     uint64
	value     string // full key value (Holder reads only)

	traceparent string        // acquire: the refusing holder's trace context
	expires     time.Duration // acquire, refused: the holder's key's TTL left
}

// okParse reads a script's integer reply, which means OK when it equals
// want.
func okParse(want int64) func(*redis.Cmd) (reply, error) {
	if want == 1 {
		return parseOne
	}
	return func(cmd *redis.Cmd) (reply, error) {
		v, err := cmd.Int64()
		return reply{ok: v == want}, err
	}
}

// parseOne is okParse(1), the common case, without an allocation.
var parseOne = func(cmd *redis.Cmd) (reply, error) {
	v, err := cmd.Int64()
	return reply{ok: v == 1}, err
}

// roundState collects the answers of one quorum round. Answers that arrive
// after the round was decided are "late" and go to the late callback.
type roundState struct {
	c       *Client
	spec    roundSpec
	start   time.Time
	opsBuf  [5]op         // ops of rounds on up to 5 nodes: no allocation of their own
	resBuf  [3]NodeResult // results of rounds on up to 3 nodes, likewise
	running atomic.Int32  // node calls not yet answered
	ctx     roundCtx      // the node calls' context, stopped by the last answer
	mu      sync.Mutex
	closed  bool
	results []NodeResult
	ok, bad int
	decided chan struct{}
	// all collects every answer, also those after the decision, for
	// spec.settled (nil without it).
	all []NodeResult
}

// roundCtx is the context of a round's node calls: the caller's values
// and a deadline, the round's or the caller's if that comes first. Its
// Done channel closes at that deadline (a timer armed before the first
// call is handed out: go-redis waits on Done, not on the deadline, for
// dials and pool slots), when the last node answers, or when round sees
// the caller's ctx end while it waits; once round has returned, the
// caller's end drops the calls still queued (ended) but leaves Done open.
// A detached round (Release) ignores the caller's end and deadline, as
// under context.WithoutCancel.
//
// It does the work of context.WithDeadline(ctx, end) with three
// allocations per round (its Done channel, its timer and the timer's
// function) where that cost five, or six with WithoutCancel, which also
// allocates on every Value lookup through it (it boxes itself). Reusing
// timers across rounds through a sync.Pool saved two more, but a timer made
// in a testing/synctest bubble must not be reset outside it, which crashed
// the tests that use bubbles.
type roundCtx struct {
	parent   context.Context // the caller's: values only
	end      time.Time       // the round's deadline
	deadline time.Time       // end, or the caller's deadline if earlier
	detach   bool            // ignore the caller's cancellation and deadline
	done     chan struct{}
	mu       sync.Mutex
	stopped  bool
	err      error // context.Canceled or DeadlineExceeded once done is closed
	cause    error // err, or the caller's cause (stop)
	timer    *time.Timer
	afters   []*afterFunc // AfterFunc's, not yet run or stopped
}

// afterFunc is a function registered with roundCtx.AfterFunc.
type afterFunc struct{ f func() }

var _ context.Context = (*roundCtx)(nil)

// init sets c up for a round of ctx ending at end; a detached round
// ignores ctx's deadline too.
func (c *roundCtx) init(ctx context.Context, end time.Time, detach bool) {
	c.parent, c.end, c.deadline, c.done, c.detach = ctx, end, end, make(chan struct{}), detach
	if d, ok := ctx.Deadline(); ok && d.Before(end) && !detach {
		c.deadline = d
	}
}

// Deadline returns the round's deadline, or the caller's if it is earlier.
func (c *roundCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done returns a channel closed when the round's calls must end.
func (c *roundCtx) Done() <-chan struct{} { return c.done }

// Err returns nil until Done is closed, then context.Canceled or
// context.DeadlineExceeded.
func (c *roundCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Value returns the caller's value for key, except for the context
// package's own key for the nearest cancellable context (cancelCtxKey),
// for which it returns nil, as context.WithoutCancel does: context.Cause(c)
// then reports c's Err, not the caller's cause.
func (c *roundCtx) Value(key any) any {
	if key == cancelCtxKey {
		return nil
	}
	return c.parent.Value(key)
}

// ended returns the cause of Err once Done is closed (the caller's cause
// when round stopped the calls because ctx ended), else the caller's cause
// once the caller's ctx has ended, unless the round is detached: a call
// still queued when the caller gives up is dropped, also after round has
// returned (decided early), as under context.WithDeadline(ctx, end).
func (c *roundCtx) ended() error {
	c.mu.Lock()
	cause := c.cause
	c.mu.Unlock()
	if cause == nil && !c.detach && c.parent.Err() != nil {
		cause = context.Cause(c.parent)
	}
	return cause
}

// stop closes Done with err (context.Canceled if nil) and cause, once;
// later calls do nothing.
func (c *roundCtx) stop(err, cause error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	if err == nil {
		err = context.Canceled
	}
	if cause == nil {
		cause = err
	}
	c.stopped, c.err, c.cause = true, err, cause
	close(c.done)
	if c.timer != nil {
		c.timer.Stop()
	}
	for _, a := range c.afters {
		go a.f()
	}
	c.afters = nil
}

// AfterFunc arranges to call f in its own goroutine once Done is closed,
// as context.AfterFunc does; stop unregisters f and reports whether it did
// so before f was started. The context package uses it for contexts
// derived from c with WithCancel, WithTimeout and the like (go-redis
// derives one per dial), which would otherwise start a goroutine each to
// watch c: c hides the key by which they would hook to a parent directly
// (Value).
func (c *roundCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	c.afters = append(c.afters, a)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.afters, a)
		if i < 0 {
			return false
		}
		c.afters = slices.Delete(c.afters, i, i+1)
		return true
	}
}

// arm starts the timer that closes Done at the deadline, unless Done is
// closed already.
func (c *roundCtx) arm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stopped && c.timer == nil {
		c.timer = time.AfterFunc(time.Until(c.deadline), c.expire)
	}
}

func (c *roundCtx) expire() { c.stop(context.DeadlineExceeded, context.DeadlineExceeded) }

// cancelCtxKey is the key with which the context package looks up a
// context's nearest cancellable ancestor (context.Cause, and WithCancel
// and the like when they hook a child to its parent). It is unexported
// there: it is found once, by asking context.Cause about a context that
// records the key it is asked for (TestRoundCtx checks that it was found,
// and that Cause reports a round's own cancellation).
var cancelCtxKey = func() any {
	p := &keyProbe{Context: context.Background()}
	_ = context.Cause(p)
	return p.key
}()

// keyProbe records the first key it is asked for (cancelCtxKey); it is
// cancelled, so that Cause looks further than Err.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Err() error { return context.Canceled }

func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

// roundSpec describes one quorum round: one script, with the same keys and
// arguments, on every node.
type roundSpec struct {
	op      string        // for telemetry: acquire, undo, fence, check, note, extend, release, holder
	attempt int           // acquire rounds: 1-based attempt number
	ttl     time.Duration // acquire rounds: the TTL, for the validity attribute
	script  *luaScript    // nil: cmd is a plain command
	cmd     []any         // evalArgs(script, keys, args...), or a plain command
	// alt, optional, builds the script command (evalArgs of altScript)
	// that does what the plain command cmd does, for nodes that reject cmd
	// as a syntax error (op.alt); l is late. A plain function, not a
	// closure: a closure cost an allocation per round, and alt is called
	// only for such nodes.
	alt       func(c *Client, l *Lock) []any
	altScript *luaScript
	parse     func(*redis.Cmd) (reply, error)
	skip      []bool // optional: nodes not to call, counted as OutcomeOK
	early     bool   // decide as soon as the outcome is known
	// late, optional, is the lock of an acquire round: a grant (ok reply)
	// that came after the decision goes to its lateGrant, in the node's
	// worker. (A *Lock, not a method value: that cost an allocation per
	// round.)
	late *Lock
	// lock is the lock whose round this is (acquire, undo, release,
	// extend, fence; nil for Holder): sendPipeline keeps a command from
	// passing a later one of the same lock on the same key.
	lock *Lock
	// detach makes the round ignore the caller's cancellation and
	// deadline (as under context.WithoutCancel): the calls of a release
	// run to their answers or the node timeout.
	detach bool
	// deadline, if set and earlier than the node timeout, ends the round
	// and drops its scripts still queued for a busy node (extend: Until).
	deadline time.Time
	// settled, optional, is called once every node called has answered or
	// dropped its script at the round's deadline, which may be after round
	// has returned (early), with every node's result, also the answers
	// that came after the decision, and with lock. It runs in a node's
	// worker (or in round, when no node was called) and must not block. A
	// plain function, not a closure, for the reason given at alt.
	settled func(l *Lock, all []NodeResult)
}

// round sends the script to every node in parallel (through the nodes'
// queues, pipeline.go) and waits until every node has answered, the
// per-node timeout has passed, ctx ends, or (with early) the outcome is
// known: quorum OK answers, or so many failures that quorum is impossible.
// Nodes with no answer by then count as OutcomeTimeout, or OutcomePending
// when the round was decided early. The results are in node order.
func (c *Client) round(ctx context.Context, spec roundSpec) (results []NodeResult) {
	ctx, span := c.tel.startRound(ctx, spec.op, spec.attempt, len(c.nodes), c.quorum)
	begin := time.Now()
	defer func() {
		took := time.Since(begin)
		outcome := roundOutcome(spec.op, results, c.quorum)
		if spec.op == "acquire" && outcome == tracing.OutcomeGranted {
			validity := spec.ttl - took - c.drift(spec.ttl)
			if span.IsRecording() {
				span.SetAttributes(tracing.ValidityMillis.Float64(float64(validity.Microseconds()) / 1000))
			}
			if validity < time.Duration(float64(spec.ttl)*c.cfg.minValidity) || validity <= 0 {
				outcome = tracing.OutcomeWeak
			}
		}
		c.tel.endRound(ctx, span, spec.op, results, c.quorum, took, outcome)
	}()
	n := len(c.nodes)
	rs := &roundState{c: c, spec: spec, decided: make(chan struct{})}
	if n <= len(rs.resBuf) {
		rs.results = rs.resBuf[:n:n]
	} else {
		rs.results = make([]NodeResult, n)
	}
	for i := range rs.results {
		rs.results[i] = NodeResult{Node: i, Addr: c.nodes[i].addr, Outcome: -1}
	}
	rs.start = begin
	// One deadline for the whole round: every node has the same per-node
	// timeout. The context lives until the last answer, so that scripts
	// still queued after an early decision are sent until the deadline; it
	// also bounds go-redis's own retries and pool waits.
	end := rs.start.Add(c.cfg.nodeTimeout)
	if !spec.deadline.IsZero() && spec.deadline.Before(end) {
		end = spec.deadline
	}
	rs.ctx.init(ctx, end, spec.detach)
	calls := n
	for i := range spec.skip {
		if spec.skip[i] {
			rs.results[i].Outcome = OutcomeOK
			rs.ok++
			calls--
		}
	}
	if calls == 0 {
		rs.ctx.stop(context.Canceled, context.Canceled)
		close(rs.decided)
		rs.closed = true
		if spec.settled != nil {
			spec.settled(spec.lock, slices.Clone(rs.results))
		}
		return rs.results
	}
	if spec.settled != nil {
		rs.all = slices.Clone(rs.results)
	}
	rs.running.Store(int32(calls))
	if !spec.detach && ctx.Err() != nil {
		rs.ctx.stop(ctx.Err(), context.Cause(ctx)) // every call is dropped unsent
	}
	rs.ctx.arm() // before the first call: one may be sent from here (sendInline)
	var ops []op
	if n > len(rs.opsBuf) {
		ops = make([]op, n)
	} else {
		ops = rs.opsBuf[:n]
	}
	for i := range c.nodes {
		if i < len(spec.skip) && spec.skip[i] {
			continue
		}
		o := &ops[i]
		o.rs, o.nd, o.deadline = rs, &c.nodes[i], end
		o.ctx, o.span = c.tel.nodeSpan(&rs.ctx, o.nd, spec.op)
		o.script, o.cmd, o.complete = spec.script, spec.cmd, completeRound
		o.alt = spec.alt != nil
		if o.alt && o.nd.oldServer.Load() {
			o.useAlt()
		}
		o.nd.submit(o)
	}
	var callerDone <-chan struct{} // nil (never) for a detached round
	if !spec.detach {
		callerDone = ctx.Done()
	}
	var cause error
	select {
	case <-rs.decided:
	case <-rs.ctx.Done(): // the deadline (or the last answer: decided)
	case <-callerDone:
		cause = context.Cause(ctx)
		rs.ctx.stop(ctx.Err(), cause)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	missing := OutcomePending // decided by the answers
	if !rs.closed {
		rs.closed = true // later answers go to spec.late and never touch results
		missing = OutcomeTimeout
		if cause == nil && !spec.detach {
			cause = context.Cause(ctx) // the caller's deadline, if it came first
			if cause == nil && rs.ctx.deadline.Before(rs.ctx.end) {
				cause = context.DeadlineExceeded // it came, its timer has not fired yet
			}
		}
		if cause == nil {
			cause = fmt.Errorf("no answer within the node timeout %v", c.cfg.nodeTimeout)
		}
	}
	// Calls that the caller's end cut short say nothing about their
	// nodes: they do not count as failures (quorumError).
	byCaller := !spec.detach && ctx.Err() != nil
	for i := range rs.results {
		r := &rs.results[i]
		if r.Outcome < 0 {
			r.Outcome, r.Err, r.Latency = missing, cause, time.Since(rs.start)
		}
		if byCaller && (r.Outcome == OutcomeTimeout || r.Outcome == OutcomeError) &&
			(errors.Is(r.Err, context.Canceled) || errors.Is(r.Err, context.DeadlineExceeded)) {
			r.canceled = true
		}
	}
	return rs.results
}

// completeRound records a node's answer in its round. It runs in the
// node's worker (or an inline caller: sendInline) and never blocks.
func completeRound(o *op) {
	rs, spec, nd := o.rs, &o.rs.spec, o.nd
	rep, err := spec.parse(o.res)
	if o.span != nil {
		if err != nil {
			o.span.SetStatus(codes.Error, err.Error())
		}
		o.span.End()
	}
	r := NodeResult{Node: nd.idx, Addr: nd.addr, Outcome: OutcomeOK, Err: err, Latency: time.Since(rs.start),
		Holder: rep.holder, token: rep.token, value: rep.value, traceparent: rep.traceparent,
		reentered: rep.reentered, fresh: rep.fresh, expires: rep.expires}
	switch {
	case err != nil && isTimeout(err):
		r.Outcome = OutcomeTimeout
	case err != nil:
		r.Outcome = OutcomeError
	case rep.gated:
		r.Outcome = OutcomeGated
	case !rep.ok:
		r.Outcome = OutcomeHeld
	}
	n := len(rs.results)
	rs.mu.Lock()
	if rs.all != nil {
		rs.all[nd.idx] = r
	}
	if rs.closed {
		rs.mu.Unlock()
		if spec.late != nil && err == nil && rep.ok {
			spec.late.lateGrant(nd, rep)
		}
	} else {
		rs.results[nd.idx] = r
		if r.Outcome == OutcomeOK {
			rs.ok++
		} else {
			rs.bad++
		}
		if rs.ok+rs.bad == n || (spec.early && (rs.ok >= rs.c.quorum || rs.bad > n-rs.c.quorum)) {
			rs.closed = true
			close(rs.decided)
		}
		rs.mu.Unlock()
	}
	if rs.running.Add(-1) == 0 {
		rs.ctx.stop(context.Canceled, context.Canceled) // the last answer of the round
		if spec.settled != nil {
			spec.settled(spec.lock, rs.all) // no writer is left
		}
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// failures returns the number of nodes that failed: errors, timeouts and
// restart gates, not counting the calls that the caller's end cut short.
func failures(rs []NodeResult) int {
	n := 0
	for _, r := range rs {
		if (r.Outcome == OutcomeError || r.Outcome == OutcomeTimeout || r.Outcome == OutcomeGated) && !r.canceled {
			n++
		}
	}
	return n
}

// count returns the number of results with outcome o.
func count(rs []NodeResult, o Outcome) int {
	n := 0
	for _, r := range rs {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// unconfirmed builds the error for an extend or release round that neither
// reached a quorum nor lost the lock for sure, or a holder round whose
// failed nodes could complete a quorum: failed nodes left the outcome
// unknown, so it always matches ErrUnavailable.
func (c *Client) unconfirmed(op string, resources []string, rs []NodeResult) *QuorumError {
	qerr := c.quorumError(op, resources, rs)
	if !slices.Contains(qerr.sentinels, ErrUnavailable) {
		qerr.sentinels = append(qerr.sentinels, ErrUnavailable)
	}
	return qerr
}

// quorumError builds the error for a round that failed. held is true when
// OutcomeHeld answers alone make a quorum impossible; unavailable when
// failures (errors and timeouts) do.
func (c *Client) quorumError(op string, resources []string, rs []NodeResult, sentinels ...error) *QuorumError {
	n := len(rs)
	if failures(rs) > n-c.quorum {
		sentinels = append(sentinels, ErrUnavailable)
	}
	// A copy: round's results live in its state, which holds the caller's
	// ctx and the round's commands, and an error may be kept for long.
	return &QuorumError{Op: op, Resources: resources, Quorum: c.quorum, Nodes: slices.Clone(rs), sentinels: sentinels}
}

// Holder returns the metadata (WithMetadata) of the lock that holds
// resource on a quorum of nodes, from one parallel round of reads bounded by
// the node timeout; held is false when no single lock holds it on a quorum
// (free, expiring, or contested). A lock without metadata gives "" and true.
// Errors: a *QuorumError matching ErrUnavailable when the nodes that failed
// leave the answer unknown: when, counted as holding it, they would
// complete a quorum for the lock that most answering nodes hold (or, with
// none, when they are a quorum themselves). Safe for concurrent use.
func (c *Client) Holder(ctx context.Context, resource string) (metadata string, held bool, err error) {
	if resource == "" {
		return "", false, invalidf("empty resource")
	}
	key := c.cfg.keyPrefix + resource
	rs := c.round(ctx, roundSpec{op: "holder", script: holderScript, cmd: evalArgs(holderScript, []any{key}),
		parse: func(cmd *redis.Cmd) (reply, error) {
			v, err := cmd.Text()
			if errors.Is(err, redis.Nil) {
				return reply{ok: true}, nil
			}
			return reply{ok: true, value: v}, err
		}})
	votes, best := map[string]int{}, 0
	for _, r := range rs {
		if _, md, ok := splitValue(r.value); r.Outcome == OutcomeOK && ok {
			v := unmarked(r.value) // a waiter may have marked it on some nodes only
			votes[v]++
			if votes[v] >= c.quorum {
				return md, true, nil
			}
			best = max(best, votes[v])
		}
	}
	// The answer is unknown when the nodes that failed could hold the most
	// voted lock and so complete its quorum: "not held" would then be a
	// guess (with one of 3 nodes failed, one holding the lock and one not,
	// the lock may hold on 2).
	if failed := count(rs, OutcomeError) + count(rs, OutcomeTimeout); best+failed >= c.quorum {
		for i := range rs {
			rs[i].value = ""
		}
		return "", false, c.unconfirmed("holder", []string{resource}, rs)
	}
	return "", false, nil
}
