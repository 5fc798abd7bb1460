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
	script  *redis.Script // nil: args is a plain command
	keys    []string
	args    []any
	// setGet, when set, is sent instead of the script to nodes that take
	// SET NX GET (TryAcquire of a plain lock); a node that rejects it gets
	// the script from then on.
	setGet []any
	// parse reads a reply that is not an error (redis.Nil included) into
	// an Outcome and its details.
	parse func(*redis.Cmd) NodeResult
	// skip marks nodes not called, counted as OutcomeOK.
	skip []bool
	// waitAll waits for every answer instead of deciding as soon as the
	// outcome is known.
	waitAll bool
	// skipDown counts the nodes that are down (peer.down) as failed until
	// they answer, so that an acquire round does not wait for them.
	skipDown bool
	// detach makes the calls ignore the caller's cancellation and
	// deadline (release and undo rounds clean up also for a caller that
	// gave up).
	detach bool
	// deadline, if earlier than the node timeout, ends the round and drops
	// its calls not sent by then (extend: never after Until).
	deadline time.Time
	// sendUntil, if later than the node timeout, lets the calls go out
	// until then after the round stopped waiting (cleanups: no key of ours
	// should stay behind a slow node).
	sendUntil time.Time
	// async returns at once, without results: the round's calls go on,
	// ordered before any later call to the same nodes (undo).
	async bool
}

// roundState collects the answers of one round.
type roundState struct {
	mu       sync.Mutex
	results  []NodeResult
	counted  []bool // nodes counted as failed until they answer (skipDown)
	calls    int    // calls sent
	answered int    // calls answered
	ok, bad  int    // answers that count for and against a quorum
	down     int    // nodes counted as failed until they answer (skipDown)
	decided  bool
	done     chan struct{} // closed once decided
	cancel   context.CancelFunc
	finished func() // async: ends the round after the last answer
}

// round sends the command to every node at once and returns every node's
// result, in node order, once the outcome is known (a quorum of OK answers,
// or so many others that a quorum is impossible), at the node timeout, or
// when ctx ends (redis.io distlock spec, step 2: a small per-node timeout).
// Nodes without an answer by then are OutcomePending (the round was
// decided), OutcomeTimeout (the node timeout passed: the node is down until
// it answers again) or OutcomeTimeout marked as cut short by ctx.
func (c *Client) round(ctx context.Context, spec roundSpec) []NodeResult {
	start := time.Now()
	ctx, span := c.tel.startRound(ctx, spec.op, spec.attempt, len(c.peers), c.quorum)
	end := start.Add(c.cfg.nodeTimeout)
	if !spec.deadline.IsZero() && spec.deadline.Before(end) {
		end = spec.deadline
	}
	callCtx := ctx
	if spec.detach {
		callCtx = context.WithoutCancel(ctx)
	}
	rs := &roundState{results: make([]NodeResult, len(c.peers)), done: make(chan struct{})}
	callCtx, rs.cancel = context.WithDeadline(callCtx, later(end, spec.sendUntil))
	counted := make([]bool, len(c.peers))
	rs.counted = counted
	for i, p := range c.peers {
		rs.results[i] = NodeResult{Node: i, Addr: p.addr, Outcome: -1}
		switch {
		case i < len(spec.skip) && spec.skip[i]:
			rs.results[i].Outcome = OutcomeOK
			rs.ok++
		default:
			rs.calls++
			if counted[i] = spec.skipDown && p.down.Load(); counted[i] {
				rs.down++
			}
		}
	}
	rs.mu.Lock()
	rs.decide(spec, c.quorum)
	rs.mu.Unlock()
	if rs.calls == 0 {
		rs.cancel()
	}
	if spec.async {
		rs.finished = func() {
			results := rs.finish(c, ctx, spec, start)
			c.tel.endRound(ctx, span, spec, results, c.quorum, time.Since(start), c)
		}
	}
	for i, p := range c.peers {
		if rs.results[i].Outcome >= 0 {
			continue
		}
		if err := c.send(callCtx, ctx, spec, rs, p, start, counted[i], spec.setGet != nil && !p.noSetGet.Load()); err != nil {
			rs.answer(c, spec, p, NodeResult{Node: i, Addr: p.addr, Outcome: OutcomeError, Err: ErrClosed}, counted[i])
		}
	}
	if spec.async {
		if rs.calls == 0 {
			rs.finished()
		}
		return nil
	}

	timer := time.NewTimer(time.Until(end))
	var callerDone <-chan struct{}
	if !spec.detach {
		callerDone = ctx.Done()
	}
	select {
	case <-rs.done:
	case <-timer.C:
	case <-callerDone:
	}
	timer.Stop()
	results := rs.finish(c, ctx, spec, start)
	c.tel.endRound(ctx, span, spec, results, c.quorum, time.Since(start), c)
	return results
}

// later returns the later of a and b (b may be zero).
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// send queues the round's call for p; plain sends spec.setGet instead of
// the script. counted says that p is counted as failed until it answers
// (skipDown). It fails only after Close.
func (c *Client) send(callCtx, ctx context.Context, spec roundSpec, rs *roundState, p *peer, start time.Time, counted, plain bool) error {
	call := &node.Call{Ctx: callCtx, Script: spec.script, Keys: spec.keys, Args: spec.args,
		Reorderable: spec.op == "release" || spec.op == "undo"}
	if plain {
		call.Script, call.Args = nil, spec.setGet
	}
	var nspan trace.Span
	call.Ctx, nspan = c.tel.nodeSpan(callCtx, p, spec.op)
	call.Done = func(cmd *redis.Cmd) {
		err := cmd.Err()
		if nspan != nil {
			if err != nil && err != redis.Nil {
				nspan.SetStatus(codes.Error, err.Error())
			}
			nspan.End()
		}
		if plain && redis.HasErrorPrefix(err, "syntax error") {
			// Redis before 7.0: the script form from now on, and now if
			// the round is still undecided (once it is, this attempt's
			// undo may already be queued, and must run after the grant).
			p.noSetGet.Store(true)
			rs.mu.Lock()
			again := errors.New("decided")
			if !rs.decided {
				again = c.send(callCtx, ctx, spec, rs, p, start, counted, false)
			}
			rs.mu.Unlock()
			if again == nil {
				return
			}
		}
		rs.answer(c, spec, p, classify(p, cmd, spec, !spec.detach && ctx.Err() != nil, start), counted)
	}
	return p.tx.Send(call)
}

// classify turns p's reply into its NodeResult. cut says that the caller's
// ctx has ended, so that a call it cut short is not the node's failure.
func classify(p *peer, cmd *redis.Cmd, spec roundSpec, cut bool, start time.Time) NodeResult {
	err := cmd.Err()
	var r NodeResult
	switch {
	case err == nil || err == redis.Nil:
		r = spec.parse(cmd)
	case cut && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		r = NodeResult{Outcome: OutcomeTimeout, Err: err, canceled: true}
	case isTimeout(err):
		r = NodeResult{Outcome: OutcomeTimeout, Err: err}
	default:
		r = NodeResult{Outcome: OutcomeError, Err: err}
	}
	var rerr redis.Error
	if err == nil || err == redis.Nil || errors.As(err, &rerr) {
		p.down.Store(false) // the node answered
	} else if r.Outcome == OutcomeTimeout && !r.canceled {
		p.down.Store(true)
	}
	r.Node, r.Addr, r.Latency = p.idx, p.addr, time.Since(start)
	return r
}

// answer records r, p's answer, unless the round was decided before it
// came.
func (rs *roundState) answer(c *Client, spec roundSpec, p *peer, r NodeResult, counted bool) {
	rs.mu.Lock()
	rs.answered++
	last := rs.answered == rs.calls
	if !rs.decided {
		rs.results[p.idx] = r
		if counted {
			rs.down--
		}
		if r.Outcome == OutcomeOK {
			rs.ok++
		} else {
			rs.bad++
		}
		rs.decide(spec, c.quorum)
	}
	rs.mu.Unlock()
	if last {
		rs.cancel() // release the calls' context
		if rs.finished != nil {
			rs.finished()
		}
	}
}

// decide closes done once the outcome is known. rs.mu is held.
func (rs *roundState) decide(spec roundSpec, quorum int) {
	n := len(rs.results)
	all := rs.ok+rs.bad == n
	if rs.decided || !(all || (!spec.waitAll && (rs.ok >= quorum || rs.bad+rs.down > n-quorum))) {
		return
	}
	rs.decided = true
	close(rs.done)
}

// finish ends the round's wait and returns its results, with every node
// that has not answered marked as described at round.
func (rs *roundState) finish(c *Client, ctx context.Context, spec roundSpec, start time.Time) []NodeResult {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	missing, cut := OutcomePending, false
	var cause error
	switch {
	case rs.decided:
	case !spec.detach && ctx.Err() != nil:
		missing, cut, cause = OutcomeTimeout, true, context.Cause(ctx)
	default:
		missing, cause = OutcomeTimeout, fmt.Errorf("no answer within the node timeout %v", c.cfg.nodeTimeout)
	}
	rs.decided = true // later answers are not recorded
	results := make([]NodeResult, len(rs.results))
	copy(results, rs.results)
	for i := range results {
		r := &results[i]
		switch {
		case r.Outcome >= 0:
		case rs.counted[i] && !cut:
			r.Outcome, r.Err, r.Latency = OutcomeTimeout, errDown, time.Since(start)
		default:
			r.Outcome, r.Err, r.Latency, r.canceled = missing, cause, time.Since(start), cut
			if missing == OutcomeTimeout && !cut {
				c.peers[i].down.Store(true)
			}
		}
	}
	return results
}

// errDown is the error of a node that the round did not wait for: it has
// not answered since a call timed out.
var errDown = errors.New("not awaited: no answer since an earlier call timed out")

// isTimeout reports whether err says that no answer came in time.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
