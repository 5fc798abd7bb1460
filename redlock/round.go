package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock/internal/node"
)

// A round is a broadcast and a decision: one call goes to every node at
// once (broadcast), and decide says, from the answers so far alone, when
// the outcome is known. The round kinds below differ only in the rule of
// decide they use and in how long their calls live; each is one function.
//
//   - vote: extend (voteUntil: never after the lock's validity), eval and
//     the layers' own rounds (layer.granted): decided at a quorum of OK
//     answers, or once so many others came that a quorum is impossible.
//   - read: HolderMetadata, Holders: every node's answer.
//   - release and undo: cleanups (below), decided as a vote; an undo is
//     not waited for at all.
//   - acquire (acquire.go, acquireSpec): a vote that may settle (wait
//     for the answers due once a quorum is impossible) and may count the
//     nodes that are down as failed.

// call is what a round sends to every node, and how to read a reply.
type call struct {
	op      string        // names the round in errors and telemetry
	timeout time.Duration // the node timeout, if not the Client's (WithNodeTimeout given to the call)
	script  *node.Script  // nil: args is a plain command
	keys    []string      // the script's keys, or those args names
	args    []any         // the script's arguments, or a plain command
	// parse reads a reply that is not an error (redis.Nil included). A
	// reply outside the command's contract (one Redis never sends, such
	// as nil from a script that always returns a value) is OutcomeError
	// (badReply), never a grant.
	parse func(*redis.Cmd) NodeResult
}

// waitRule says when a round's outcome is known (decide).
type waitRule uint8

const (
	// untilKnown: a quorum of OK answers, or so many others (and nodes
	// counted as down) that a quorum is impossible.
	untilKnown waitRule = iota
	// untilSettled: a quorum of OK answers, or every answer: a lost
	// acquire still waits for the answers due (up to the node timeout),
	// so that its undo goes only to the nodes that may have granted.
	untilSettled
	// untilAll: every answer.
	untilAll
)

// tally is what a round has heard so far.
type tally struct {
	nodes, quorum int
	ok, bad       int // answers for and against a quorum
	down          int // nodes counted as failed that have not answered (skipDown)
	unsent        int // nodes the round gave up without asking them (forgoLocked)
}

// decide reports whether the outcome of a round with tally t is known
// under rule w. It is a pure function of its arguments.
func decide(t tally, w waitRule) bool {
	all := t.ok+t.bad+t.unsent == t.nodes
	switch w {
	case untilAll:
		return all
	case untilSettled:
		return all || t.ok >= t.quorum
	}
	return all || t.ok >= t.quorum || t.bad+t.down > t.nodes-t.quorum
}

// broadcast is one round's call with its kind's rules; the round kinds
// fill it (vote, read, release, undo, acquireRound).
type broadcast struct {
	call
	wait waitRule
	// cleanup (release, undo): the calls ignore the caller's cancellation
	// (they clean up also for a caller that gave up) and are never
	// dropped: each goes out when its node's sender gets to it, however
	// late, so that it always runs after the acquire it follows on that
	// node (which go-redis may have delayed: a new connection to dial
	// first). A delete of our own value is harmless at any time. Once
	// sent, a call waits for its reply at most the node timeout
	// (node.Call.Wait), so a cleanup sent into a black hole holds its
	// node's later calls no longer than an acquire does. The round still
	// waits at most the node timeout.
	cleanup bool
	async   bool   // return at once, without results (undo)
	skip    []bool // nodes not called, counted as OutcomeOK
	// skipDown counts the nodes that are down (peer.down) as failed until
	// they answer, so that an acquire round does not wait for them.
	skipDown bool
	// deadline, if earlier than the node timeout, ends the round and drops
	// its calls not sent by then (extend: never after Until).
	deadline time.Time
	// plain, when set, goes instead of the script to the nodes that take
	// SET NX GET (TryAcquire of a plain lock).
	plain *call
	// order, when set, says which nodes the round asks at once and when
	// it asks the others (askingOrder); nil asks every node at once.
	order   askingOrder
	attempt int           // acquire: 1-based, for telemetry
	ttl     time.Duration // acquire: for the validity attribute
}

// An askingOrder asks a round's nodes in an order of its own instead of
// all at once: a layer's, for the Lock's acquire rounds (layer.order;
// docs/design.md, "A round"). It is made for one round. The round calls
// it at fixed points, and it acts on the round only by asking a node it
// has not asked yet (askLocked), by giving one up (forgoLocked), by
// taking a refusal as final (refusedForGoodLocked) and through
// whileUndecided.
type askingOrder interface {
	// first returns the nodes to ask at once, before the round counts or
	// sends anything (rs.mu is not held); nil asks every node. The round
	// neither sends to nor waits for the others until the order asks them.
	first(rs *roundState) []bool
	// sent runs once the calls to the first nodes are sent (rs.mu is not
	// held).
	sent(rs *roundState)
	// answered runs after node i answered r, while the round is undecided
	// (rs.mu is held, r is counted).
	answered(rs *roundState, i int, r NodeResult)
	// waiting reports whether node i was neither asked nor given up; the
	// round's result for it is then unsent. stop ends the order (its
	// timers). Both run when the round ends (finish, rs.mu held for stop).
	waiting(i int) bool
	stop()
}

// allAtOnce is the asking order of a round without one: every node at
// once.
type allAtOnce struct{}

func (allAtOnce) first(*roundState) []bool              { return nil }
func (allAtOnce) sent(*roundState)                      {}
func (allAtOnce) answered(*roundState, int, NodeResult) {}
func (allAtOnce) waiting(int) bool                      { return false }
func (allAtOnce) stop()                                 {}

// vote runs k on every node and returns once the outcome is known.
func (c *Client) vote(ctx context.Context, k call) []NodeResult {
	return c.round(ctx, broadcast{call: k})
}

// voteUntil is vote, ended at deadline if that comes before the node
// timeout; calls not sent by then are dropped.
func (c *Client) voteUntil(ctx context.Context, k call, deadline time.Time) []NodeResult {
	return c.round(ctx, broadcast{call: k, deadline: deadline})
}

// read runs k on every node and waits for every answer.
func (c *Client) read(ctx context.Context, k call) []NodeResult {
	return c.round(ctx, broadcast{call: k, wait: untilAll})
}

// release runs the cleanup k on every node not in skip and returns once
// the outcome is known (broadcast.cleanup).
func (c *Client) release(ctx context.Context, k call, skip []bool) []NodeResult {
	return c.round(ctx, broadcast{call: k, cleanup: true, skip: skip})
}

// undo queues the cleanup k for every node not in skip, and returns at
// once. On each node the undo runs after every call queued there before
// it (node.Node sends a node's calls in queue order, a batch only once
// the one before was answered or its context ended, and a cleanup has no
// deadline of its own, so it is never dropped): queued after an acquire,
// it deletes that acquire's grant even when the grant comes after the
// round was decided, and it runs before a later acquire of the same
// Client on that node. The one exception: a node frozen for longer than
// go-redis's read timeout loses its connection, and an acquire it runs
// after it wakes may run after the undo, which went on a new connection;
// its key then waits for its TTL (liveness only: nobody holds that
// value; docs/design.md, "Late grants").
func (c *Client) undo(ctx context.Context, k call, skip []bool) {
	c.round(ctx, broadcast{call: k, cleanup: true, async: true, skip: skip})
}

// roundState is one round in progress.
type roundState struct {
	c       *Client
	cmd     []any // the command every node gets (node.Call.Args), made by command
	cmdOnce sync.Once
	ctx     context.Context // the caller's, with the round's span
	callCtx context.Context // the calls': deadline, detached or not
	cancel  context.CancelFunc
	b       broadcast
	start   time.Time
	end     time.Time // when the round stops waiting: the node timeout, or b.deadline
	span    trace.Span

	mu       sync.Mutex
	results  []NodeResult
	counted  []bool // nodes counted as failed until they answer (skipDown)
	calls    int    // calls sent
	answered int    // calls answered
	t        tally
	decided  bool
	done     chan struct{} // closed once decided
}

// round sends the command to every node at once and returns every node's
// result, in node order, once the outcome is known (a quorum of OK answers,
// or so many others that a quorum is impossible), at the node timeout, or
// when ctx ends (redis.io distlock spec, step 2: a small per-node timeout).
// A node without an answer by then is OutcomePending (the round was
// decided without it), or OutcomeTimeout: the node timeout passed (the node
// is down until it answers again), or ctx cut the call short (not a
// failure of the node).
func (c *Client) round(ctx context.Context, b broadcast) []NodeResult {
	if b.order == nil {
		b.order = allAtOnce{}
	}
	rs := &roundState{c: c, b: b, start: time.Now(), results: make([]NodeResult, len(c.peers)),
		t: tally{nodes: len(c.peers), quorum: c.quorum}, done: make(chan struct{})}
	rs.ctx, rs.span = c.tel.startRound(ctx, b.op, b.attempt, len(c.peers), c.quorum)
	end := rs.start.Add(rs.nodeTimeout())
	if !b.deadline.IsZero() && b.deadline.Before(end) {
		end = b.deadline
	}
	rs.end = end
	if b.cleanup {
		rs.callCtx, rs.cancel = context.WithCancel(context.WithoutCancel(rs.ctx))
	} else {
		rs.callCtx, rs.cancel = context.WithDeadline(rs.ctx, end)
	}
	rs.sendAll()
	if b.async {
		return nil
	}
	// The calls' context ends at the node timeout (or the caller's end),
	// except for a cleanup's: then a timer does.
	stop, timeout := rs.callCtx.Done(), (<-chan time.Time)(nil)
	if b.cleanup {
		timer := time.NewTimer(time.Until(end))
		defer timer.Stop()
		stop, timeout = nil, timer.C
	}
	var callerDone <-chan struct{}
	if !b.cleanup {
		callerDone = ctx.Done()
	}
	select {
	case <-rs.done:
	case <-stop:
	case <-timeout:
	case <-callerDone:
	}
	return rs.finish()
}

// nodeTimeout returns how long the round waits for each node.
func (rs *roundState) nodeTimeout() time.Duration {
	if rs.b.timeout > 0 {
		return rs.b.timeout
	}
	return rs.c.cfg.nodeTimeout
}

// sendAll sends the round's call to every node not skipped, or to those
// that the round's asking order asks first.
func (rs *roundState) sendAll() {
	first := rs.b.order.first(rs)
	rs.countNodes(first)
	rs.mu.Lock()
	rs.decideLocked()
	none := rs.calls == 0
	rs.mu.Unlock()
	if none {
		rs.ended()
	}
	calls := make([]nodeCall, len(rs.c.peers))
	for i, p := range rs.c.peers {
		if first != nil && !first[i] || rs.results[i].Outcome >= 0 {
			continue // asked later, if at all (the order may ask it already), or skipped
		}
		if err := rs.send(&calls[i], p, rs.b.plain != nil && !p.noSetGet.Load()); err != nil {
			rs.answer(p, NodeResult{Node: i, Addr: p.addr, Outcome: OutcomeError, Err: ErrClosed, canceled: true})
		}
	}
	rs.b.order.sent(rs)
}

// skipped reports whether node i is not called at all (skip).
func (b *broadcast) skipped(i int) bool { return i < len(b.skip) && b.skip[i] }

// countNodes sets up the results and the tally before any call is sent:
// skipped nodes count as OK, the nodes in first (all when first is nil)
// as calls, and with skipDown the nodes that are down, asked or not yet,
// as failed until they answer.
func (rs *roundState) countNodes(first []bool) {
	for i, p := range rs.c.peers {
		rs.results[i] = NodeResult{Node: i, Addr: p.addr, Outcome: -1}
		if rs.b.skipped(i) {
			rs.results[i].Outcome = OutcomeOK
			rs.t.ok++
			continue
		}
		if first == nil || first[i] {
			rs.calls++
		}
		if rs.b.skipDown && p.down.Load() {
			if rs.counted == nil {
				rs.counted = make([]bool, len(rs.c.peers))
			}
			rs.counted[i] = true
			rs.t.down++
		}
	}
}

// nodeCall is one node's call in a round, with what its reply needs.
type nodeCall struct {
	node.Call
	rs    *roundState
	p     *peer
	plain bool       // b.plain rather than the script
	span  trace.Span // WithNodeSpans, or nil
}

// send queues the round's call for p, in its slot of calls; plain sends
// b.plain instead of the script. It fails only after Close.
func (rs *roundState) send(nc *nodeCall, p *peer, plain bool) error {
	b := rs.b
	*nc = nodeCall{Call: node.Call{Script: b.script, Keys: b.keys, Reorderable: b.cleanup,
		Done: reply}, rs: rs, p: p, plain: plain}
	if b.cleanup {
		nc.Wait = rs.nodeTimeout()
	}
	if plain {
		nc.Script, nc.Args = nil, b.plain.args
	} else {
		nc.Args = rs.command()
	}
	nc.Ctx, nc.span = rs.c.tel.nodeSpan(rs.callCtx, p, b.op, &nc.Call)
	nc.Owner = nc
	// With one node the caller has nothing to do but wait for this reply
	// (an undo's caller does not wait at all); it sends the call itself
	// when go-redis ends it at its deadline (docs/design.md, "Inline
	// calls").
	nc.Inline = len(rs.c.peers) == 1 && !b.async && p.deadlines
	return p.tx.Send(&nc.Call)
}

// command returns the round's command, made once for every node that gets
// it (none does when each takes b.plain).
func (rs *roundState) command() []any {
	rs.cmdOnce.Do(func() {
		rs.cmd = rs.b.args
		if rs.b.script != nil {
			rs.cmd = rs.b.script.Command(rs.b.keys, rs.b.args...)
		}
	})
	return rs.cmd
}

// reply handles a node's reply to a round's call (node.Call.Done).
func reply(c *node.Call, cmd *redis.Cmd) {
	nc := c.Owner.(*nodeCall)
	err := cmd.Err()
	if nc.span != nil {
		if err != nil && err != redis.Nil {
			nc.span.SetStatus(codes.Error, err.Error())
		}
		nc.span.End()
	}
	if nc.plain && err != nil && err != redis.Nil && redis.HasErrorPrefix(err, "syntax error") && nc.rs.resend(nc) {
		return
	}
	nc.rs.answer(nc.p, nc.rs.classify(nc.p, cmd, nc.plain))
}

// resend handles SET NX GET rejected by a server before 7.0: the node gets
// the script from now on, and now if the round is undecided (once it is,
// its caller may queue an undo or Release that the grant must not pass).
func (rs *roundState) resend(nc *nodeCall) bool {
	nc.p.noSetGet.Store(true)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return !rs.decided && rs.send(new(nodeCall), nc.p, false) == nil
}

// classify turns p's reply into its NodeResult; plain says that the call
// was b.plain.
func (rs *roundState) classify(p *peer, cmd *redis.Cmd, plain bool) NodeResult {
	err := cmd.Err()
	var r NodeResult
	switch {
	case err != nil && err != redis.Nil:
		r = rs.failure(p, err)
	case plain:
		r = rs.b.plain.parse(cmd)
	default:
		r = rs.b.parse(cmd)
	}
	if err == nil || node.IsReply(err) {
		p.down.Store(false) // the node answered
	}
	r.Node, r.Addr, r.Latency = p.idx, p.addr, time.Since(rs.start)
	if !r.canceled && (r.Outcome != OutcomeTimeout || rs.waitedNodeTimeout()) {
		rs.c.observe(p, r) // what the node did, for its failure's log lines
	}
	return r
}

// failure returns the result of a call to p that ended with err, not a
// reply: Close gave up on it, the caller's ctx cut it short (neither is
// the node's failure), no answer came in time, or an error reply.
func (rs *roundState) failure(p *peer, err error) NodeResult {
	cut := !rs.b.cleanup && rs.ctx.Err() != nil // the caller gave up
	switch {
	case errors.Is(err, node.ErrClosed):
		return NodeResult{Outcome: OutcomeError, Err: ErrClosed, canceled: true}
	case cut && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return NodeResult{Outcome: OutcomeTimeout, Err: err, canceled: true}
	case isTimeout(err):
		return rs.noAnswer(p, err)
	}
	return NodeResult{Outcome: OutcomeError, Err: nodeError(err)}
}

// noAnswer returns the result of a call to p that timed out with err,
// and marks p down when the round waited the full node timeout.
func (rs *roundState) noAnswer(p *peer, err error) NodeResult {
	r := NodeResult{Outcome: OutcomeTimeout, Err: rs.timedOut(err)}
	na, ok := r.Err.(*noAnswerError)
	if !ok && errors.Is(err, context.DeadlineExceeded) { // the call's own limit (a cleanup's Wait)
		na, ok = &noAnswerError{msg: fmt.Sprintf("no answer within the %v node timeout", rs.nodeTimeout()), err: err}, true
	}
	if ok {
		r.Err = explain(p, na)
	}
	if rs.waitedNodeTimeout() {
		p.down.Store(true)
	}
	return r
}

// answer records p's answer, unless the round was decided before it came.
func (rs *roundState) answer(p *peer, r NodeResult) {
	rs.mu.Lock()
	last := rs.answerLocked(p, r)
	rs.mu.Unlock()
	if last {
		rs.ended()
	}
}

// answerLocked is answer with rs.mu held; it reports whether every call
// sent has been answered.
func (rs *roundState) answerLocked(p *peer, r NodeResult) bool {
	rs.answered++
	if !rs.decided {
		rs.results[p.idx] = r
		if rs.counted != nil && rs.counted[p.idx] {
			rs.t.down--
		}
		if r.Outcome == OutcomeOK {
			rs.t.ok++
		} else {
			rs.t.bad++
		}
		rs.b.order.answered(rs, p.idx, r) // may ask or give up the nodes not asked yet
		rs.decideLocked()
	}
	return rs.answered == rs.calls
}

// ended runs once every call has been answered.
func (rs *roundState) ended() {
	rs.cancel()
	if rs.b.async {
		rs.finish()
	}
}

// askLocked sends the round's call to node i, which its asking order had
// not asked yet. Sent before the round is decided, the call is queued on
// its node ahead of anything the caller sends after the round (an undo, a
// Release). rs.mu is held.
func (rs *roundState) askLocked(i int) {
	p := rs.c.peers[i]
	rs.calls++
	if err := rs.send(new(nodeCall), p, rs.b.plain != nil && !p.noSetGet.Load()); err != nil {
		rs.answerLocked(p, NodeResult{Node: i, Addr: p.addr, Outcome: OutcomeError, Err: ErrClosed, canceled: true})
	}
}

// forgoLocked gives up node i, which its asking order had not asked: it
// is never asked, its result is unsent, and the round no longer waits for
// it (tally.unsent). rs.mu is held.
func (rs *roundState) forgoLocked(i int) {
	rs.results[i] = unsent(rs.c.peers[i], time.Since(rs.start))
	if rs.counted != nil && rs.counted[i] {
		rs.counted[i] = false
		rs.t.down--
	}
	rs.t.unsent++
}

// refusedForGoodLocked marks node i's refusal as one that ends the round
// alone: its asking order gave up the nodes not asked, and the round's
// QuorumError names i's holder as a quorum's (quorumHolder). rs.mu is
// held.
func (rs *roundState) refusedForGoodLocked(i int) {
	rs.results[i].final = true
}

// unsent is the result of node p, never asked by a round that waited d:
// OutcomePending, and no undo goes to it.
func unsent(p *peer, d time.Duration) NodeResult {
	return NodeResult{Node: p.idx, Addr: p.addr, Outcome: OutcomePending, Latency: d, unsent: true}
}

// whileUndecided runs f with rs.mu held unless the round is decided (an
// asking order's step of its own: its timer), and ends the round when
// every call sent has been answered after f.
func (rs *roundState) whileUndecided(f func()) {
	rs.mu.Lock()
	last := false
	if !rs.decided {
		f()
		last = rs.answered == rs.calls
	}
	rs.mu.Unlock()
	if last {
		rs.ended()
	}
}

// decideLocked closes done once the outcome is known. rs.mu is held.
func (rs *roundState) decideLocked() {
	if !rs.decided && decide(rs.t, rs.b.wait) {
		rs.decided = true
		close(rs.done)
	}
}

// finish ends the round: it marks the nodes that have not answered (see
// round), records the round's telemetry and returns its results.
func (rs *roundState) finish() []NodeResult {
	rs.mu.Lock()
	missing, cut := OutcomePending, false
	var cause error
	switch {
	case rs.decided:
	case !rs.b.cleanup && rs.ctx.Err() != nil:
		missing, cut, cause = OutcomeTimeout, true, context.Cause(rs.ctx)
	default:
		missing, cause = OutcomeTimeout, &noAnswerError{msg: rs.limitText()}
	}
	if !rs.decided {
		rs.decided = true // answers after this are not recorded
		close(rs.done)
	}
	rs.b.order.stop()
	results := rs.results // no one writes it any more
	rs.mu.Unlock()
	for i := range results {
		r := &results[i]
		switch {
		case r.Outcome >= 0:
		case rs.b.order.waiting(i):
			*r = unsent(rs.c.peers[i], time.Since(rs.start))
		case rs.counted != nil && rs.counted[i] && !cut:
			r.Outcome, r.Err, r.Latency = OutcomeTimeout, explain(rs.c.peers[i], errDown), time.Since(rs.start)
		default:
			r.Outcome, r.Err, r.Latency, r.canceled = missing, cause, time.Since(rs.start), cut
			if missing == OutcomeTimeout && !cut && rs.waitedNodeTimeout() {
				p := rs.c.peers[i]
				p.down.Store(true)
				r.Err = explain(p, cause.(*noAnswerError))
				rs.c.observe(p, *r)
			}
		}
	}
	rs.c.tel.endRound(rs.ctx, rs.span, rs.b, results, time.Since(rs.start), rs.c)
	return results
}

// waitedNodeTimeout reports whether the round waits for each node at least
// the Client's node timeout: only a node that did not answer in that time
// is down (peer.down). A shorter wait (an extend round cut at Until, a
// call's own shorter WithNodeTimeout) says nothing about the node.
func (rs *roundState) waitedNodeTimeout() bool {
	return rs.end.Sub(rs.start) >= rs.c.cfg.nodeTimeout
}

// errDown is the error of a node that a round did not wait for: it has not
// answered since a call timed out.
var errDown = &noAnswerError{msg: "not waited for: it has not answered since an earlier call timed out"}

// limitText says which limit a call without an answer missed.
func (rs *roundState) limitText() string {
	if d := rs.b.deadline; !d.IsZero() && d.Before(rs.start.Add(rs.nodeTimeout())) {
		return "no answer before the lock's validity ended"
	}
	return fmt.Sprintf("no answer within the %v node timeout", rs.nodeTimeout())
}

// timedOut returns the Err of a call that timed out with err: err,
// explained when the round's own limit had passed.
func (rs *roundState) timedOut(err error) error {
	if d, ok := rs.callCtx.Deadline(); ok && !time.Now().Before(d) {
		return &noAnswerError{msg: rs.limitText(), err: err}
	}
	return err
}

// isTimeout reports whether err says that no answer came in time.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
