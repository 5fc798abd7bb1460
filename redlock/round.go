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

// roundSpec describes one quorum round: the same command on every node.
type roundSpec struct {
	op      string        // names the round in errors and telemetry
	attempt int           // acquire rounds: 1-based, for telemetry
	ttl     time.Duration // acquire rounds: for the validity attribute
	timeout time.Duration // the node timeout, if not the Client's (WithNodeTimeout given to the call)
	script  *node.Script  // nil: args is a plain command
	keys    []string      // the script's keys, or those args names
	args    []any         // the script's arguments, or a plain command
	// setGet, when set, goes instead of the script to the nodes that take
	// SET NX GET (TryAcquire of a plain lock); parseSet reads its replies.
	setGet   []any
	parseSet func(*redis.Cmd) NodeResult
	// parse reads a reply that is not an error (redis.Nil included). A
	// reply outside the command's contract (one Redis never sends, such
	// as nil from a script that always returns a value) is OutcomeError
	// (badReply), never a grant.
	parse func(*redis.Cmd) NodeResult
	// skip marks nodes not called, counted as OutcomeOK.
	skip []bool
	// waitAll waits for every answer instead of deciding as soon as the
	// outcome is known.
	waitAll bool
	// settle, once a quorum is impossible, still waits for the answers
	// due (up to the node timeout), so that the undo of a lost acquire
	// goes only to the nodes that may have granted, not to every node that
	// had not answered yet (TryAcquire: its caller gives up anyway).
	settle bool
	// skipDown counts the nodes that are down (peer.down) as failed until
	// they answer, so that an acquire round does not wait for them.
	skipDown bool
	// deadline, if earlier than the node timeout, ends the round and drops
	// its calls not sent by then (extend: never after Until).
	deadline time.Time
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
	// async returns at once, without results (undo).
	async bool
}

// roundState is one round in progress.
type roundState struct {
	c       *Client
	cmd     []any           // the command every node gets (node.Call.Args)
	ctx     context.Context // the caller's, with the round's span
	callCtx context.Context // the calls': deadline, detached or not
	cancel  context.CancelFunc
	spec    roundSpec
	start   time.Time
	end     time.Time // when the round stops waiting: the node timeout, or spec.deadline
	span    trace.Span

	mu       sync.Mutex
	results  []NodeResult
	counted  []bool // nodes counted as failed until they answer (skipDown)
	calls    int    // calls sent
	answered int    // calls answered
	ok, bad  int    // answers for and against a quorum
	down     int    // counted nodes that have not answered
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
func (c *Client) round(ctx context.Context, spec roundSpec) []NodeResult {
	rs := &roundState{c: c, spec: spec, start: time.Now(), results: make([]NodeResult, len(c.peers)),
		done: make(chan struct{})}
	rs.ctx, rs.span = c.tel.startRound(ctx, spec.op, spec.attempt, len(c.peers), c.quorum)
	end := rs.start.Add(rs.nodeTimeout())
	if !spec.deadline.IsZero() && spec.deadline.Before(end) {
		end = spec.deadline
	}
	rs.end = end
	if spec.cleanup {
		rs.callCtx, rs.cancel = context.WithCancel(context.WithoutCancel(rs.ctx))
	} else {
		rs.callCtx, rs.cancel = context.WithDeadline(rs.ctx, end)
	}
	rs.cmd = spec.args
	if spec.script != nil {
		rs.cmd = spec.script.Command(spec.keys, spec.args...) // once, for every node
	}
	rs.sendAll()
	if spec.async {
		return nil
	}
	// The calls' context ends at the node timeout (or the caller's end),
	// except for a cleanup's: then a timer does.
	stop, timeout := rs.callCtx.Done(), (<-chan time.Time)(nil)
	if spec.cleanup {
		timer := time.NewTimer(time.Until(end))
		defer timer.Stop()
		stop, timeout = nil, timer.C
	}
	var callerDone <-chan struct{}
	if !spec.cleanup {
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
	if rs.spec.timeout > 0 {
		return rs.spec.timeout
	}
	return rs.c.cfg.nodeTimeout
}

// sendAll sends the round's call to every node not skipped.
func (rs *roundState) sendAll() {
	for i, p := range rs.c.peers {
		rs.results[i] = NodeResult{Node: i, Addr: p.addr, Outcome: -1}
		if i < len(rs.spec.skip) && rs.spec.skip[i] {
			rs.results[i].Outcome = OutcomeOK
			rs.ok++
			continue
		}
		rs.calls++
		if rs.spec.skipDown && p.down.Load() {
			if rs.counted == nil {
				rs.counted = make([]bool, len(rs.c.peers))
			}
			rs.counted[i] = true
			rs.down++
		}
	}
	rs.mu.Lock()
	rs.decide()
	rs.mu.Unlock()
	if rs.calls == 0 {
		rs.ended()
	}
	calls := make([]nodeCall, len(rs.c.peers))
	for i, p := range rs.c.peers {
		if rs.results[i].Outcome >= 0 {
			continue
		}
		if err := rs.send(&calls[i], p, rs.spec.setGet != nil && !p.noSetGet.Load()); err != nil {
			rs.answer(p, NodeResult{Node: i, Addr: p.addr, Outcome: OutcomeError, Err: ErrClosed, canceled: true})
		}
	}
}

// nodeCall is one node's call in a round, with what its reply needs.
type nodeCall struct {
	node.Call
	rs    *roundState
	p     *peer
	plain bool       // spec.setGet rather than the script
	span  trace.Span // WithNodeSpans, or nil
}

// send queues the round's call for p, in its slot of calls; plain sends
// spec.setGet instead of the script. It fails only after Close.
func (rs *roundState) send(nc *nodeCall, p *peer, plain bool) error {
	spec := rs.spec
	*nc = nodeCall{Call: node.Call{Script: spec.script, Keys: spec.keys, Args: rs.cmd, Reorderable: spec.cleanup,
		Done: reply}, rs: rs, p: p, plain: plain}
	if spec.cleanup {
		nc.Wait = rs.nodeTimeout()
	}
	if plain {
		nc.Script, nc.Args = nil, spec.setGet
	}
	nc.Ctx, nc.span = rs.c.tel.nodeSpan(rs.callCtx, p, spec.op)
	nc.Owner = nc
	return p.tx.Send(&nc.Call)
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
// was spec.setGet.
func (rs *roundState) classify(p *peer, cmd *redis.Cmd, plain bool) NodeResult {
	err := cmd.Err()
	cut := !rs.spec.cleanup && rs.ctx.Err() != nil // the caller gave up
	var r NodeResult
	switch {
	case (err == nil || err == redis.Nil) && plain:
		r = rs.spec.parseSet(cmd)
	case err == nil || err == redis.Nil:
		r = rs.spec.parse(cmd)
	case errors.Is(err, node.ErrClosed): // Close gave up on the queued call: not the node's failure
		r = NodeResult{Outcome: OutcomeError, Err: ErrClosed, canceled: true}
	case cut && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		r = NodeResult{Outcome: OutcomeTimeout, Err: err, canceled: true}
	case isTimeout(err):
		r = NodeResult{Outcome: OutcomeTimeout, Err: rs.timedOut(err)}
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
	default:
		r = NodeResult{Outcome: OutcomeError, Err: nodeError(err)}
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

// answer records p's answer, unless the round was decided before it came.
func (rs *roundState) answer(p *peer, r NodeResult) {
	rs.mu.Lock()
	rs.answered++
	last := rs.answered == rs.calls
	if !rs.decided {
		rs.results[p.idx] = r
		if rs.counted != nil && rs.counted[p.idx] {
			rs.down--
		}
		if r.Outcome == OutcomeOK {
			rs.ok++
		} else {
			rs.bad++
		}
		rs.decide()
	}
	rs.mu.Unlock()
	if last {
		rs.ended()
	}
}

// ended runs once every call has been answered.
func (rs *roundState) ended() {
	rs.cancel()
	if rs.spec.async {
		rs.finish()
	}
}

// decide closes done once the outcome is known. rs.mu is held.
func (rs *roundState) decide() {
	n, q := len(rs.results), rs.c.quorum
	lost := rs.bad+rs.down > n-q && !rs.spec.settle
	known := rs.ok+rs.bad == n || (!rs.spec.waitAll && (rs.ok >= q || lost))
	if known && !rs.decided {
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
	case !rs.spec.cleanup && rs.ctx.Err() != nil:
		missing, cut, cause = OutcomeTimeout, true, context.Cause(rs.ctx)
	default:
		missing, cause = OutcomeTimeout, &noAnswerError{msg: rs.limitText()}
	}
	if !rs.decided {
		rs.decided = true // answers after this are not recorded
		close(rs.done)
	}
	results := rs.results // no one writes it any more
	rs.mu.Unlock()
	for i := range results {
		r := &results[i]
		switch {
		case r.Outcome >= 0:
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
	rs.c.tel.endRound(rs.ctx, rs.span, rs.spec, results, time.Since(rs.start), rs.c)
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

// noAnswerError is the Err of a node that gave no answer within the
// round's limit: msg says which limit; err is the call's own error, if any.
type noAnswerError struct {
	msg string
	err error
}

func (e *noAnswerError) Error() string { return e.msg }
func (e *noAnswerError) Unwrap() error { return e.err }

// limitText says which limit a call without an answer missed.
func (rs *roundState) limitText() string {
	if d := rs.spec.deadline; !d.IsZero() && d.Before(rs.start.Add(rs.nodeTimeout())) {
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

// badReply is the result of a reply outside the contract of the command
// (what): one that Redis does not send, so a node (or a proxy in front of
// it) that sends it is faulty, and its answer counts for nothing.
func badReply(what string, v any) NodeResult {
	text := fmt.Sprintf("%#v", v)
	if len(text) > 100 {
		text = text[:100] + "..."
	}
	return NodeResult{Outcome: OutcomeError, Err: fmt.Errorf("unexpected reply %s to the %s, which Redis does not send (a proxy in between?)", text, what)}
}

// isTimeout reports whether err says that no answer came in time.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
