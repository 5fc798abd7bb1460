package redlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// luaScript is a script with its source, for EVAL when a node answers
// NOSCRIPT.
type luaScript struct {
	*redis.Script
	src string
}

func newScript(src string) *luaScript { return &luaScript{Script: redis.NewScript(src), src: src} }

// Pipelining. Concurrent rounds send their scripts for one node through
// that node's batcher: a caller that finds no batch in flight sends its own
// script at once (one EVALSHA, as without batching); callers that arrive
// while a batch is in flight queue up, and when it returns, the first of
// them sends everything queued as one pipeline (one write, one read). No
// goroutine is started: the callers take turns. Per-lock semantics are
// unchanged: each round still has its own deadline (a caller whose context
// ends while queued leaves the queue, so its script never runs; one whose
// script was sent keeps waiting for the reply, so that a late grant is
// cleaned up as without batching), and batches go out one at a time in
// arrival order, so a release sent after an acquire on the same node runs
// after it.

// batcher queues the scripts waiting for one node.
type batcher struct {
	mu       sync.Mutex
	queue    []*op
	flushing bool // a caller is sending a batch
}

// op is one script call waiting for, or sent in, a batch.
type op struct {
	ctx    context.Context // the caller's; used when the op is sent alone
	script *luaScript
	keys   []string
	args   []any
	res    *redis.Cmd
	done   chan struct{} // closed once res is set; nil for the sender's own op
	lead   chan struct{} // 1-buffered: this caller is to send the next batch
}

// run sends script to n through its batcher and returns its reply, or ctx's
// error when ctx ends first.
func (n *node) run(ctx context.Context, script *luaScript, keys []string, args ...any) *redis.Cmd {
	o := &op{ctx: ctx, script: script, keys: keys, args: args}
	b := &n.batch
	b.mu.Lock()
	if !b.flushing {
		b.flushing = true
		b.mu.Unlock()
		n.sendOne(o)
		return o.res
	}
	o.done, o.lead = make(chan struct{}), make(chan struct{}, 1)
	b.queue = append(b.queue, o)
	b.mu.Unlock()
	select {
	case <-o.done:
		return o.res
	case <-o.lead:
		b.mu.Lock()
		batch := b.queue
		b.queue = nil
		b.mu.Unlock()
		n.send(batch)
		return o.res
	case <-ctx.Done():
		b.mu.Lock()
		i := slices.Index(b.queue, o)
		if i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1) // never sent
		}
		select {
		case <-o.lead: // promoted while leaving: pass the turn on
			b.handOffLocked()
		default:
		}
		b.mu.Unlock()
		if i < 0 {
			// Already sent: wait for the real reply, so that a grant
			// landing late is seen and handled (lateGrant), as the round
			// has stopped waiting for this node.
			<-o.done
			return o.res
		}
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(context.Cause(ctx))
		return cmd
	}
}

// handOffLocked gives the next turn to the first queued caller, or ends
// the flushing state. b.mu must be held.
func (b *batcher) handOffLocked() {
	if len(b.queue) > 0 {
		b.queue[0].lead <- struct{}{}
		return
	}
	b.flushing = false
}

// sendOne sends the op of a caller that found no batch in flight, with the
// caller's own context, and passes the turn.
func (n *node) sendOne(o *op) {
	o.res = n.exec(o)
	n.passTurn()
}

// exec sends one op unless its caller's context has already ended: a script
// is never sent after its round's deadline.
func (n *node) exec(o *op) *redis.Cmd {
	if err := ended(o.ctx); err != nil {
		cmd := redis.NewCmd(o.ctx)
		cmd.SetErr(err)
		return cmd
	}
	return n.evalOne(o)
}

// evalOne sends one op as EVALSHA and, on NOSCRIPT, as EVAL, unless its
// deadline has passed meanwhile (no script leaves after its round's
// deadline, also not a fallback).
func (n *node) evalOne(o *op) *redis.Cmd {
	cmd := n.rdb.EvalSha(o.ctx, o.script.Hash(), o.keys, o.args...)
	if !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") || ended(o.ctx) != nil {
		return cmd
	}
	return n.rdb.Eval(o.ctx, o.script.src, o.keys, o.args...)
}

// send sends a batch of queued ops: alone with its caller's context, or as
// a pipeline under the latest of their deadlines (but none's cancellation:
// the others still wait for it). It fills in every op's reply and passes
// the turn.
func (n *node) send(batch []*op) {
	live := batch[:0:0]
	for _, o := range batch {
		if err := ended(o.ctx); err != nil {
			o.res = redis.NewCmd(o.ctx)
			o.res.SetErr(err) // its deadline passed while queued
		} else {
			live = append(live, o)
		}
	}
	if len(live) == 1 {
		live[0].res = n.evalOne(live[0])
	} else if len(live) > 1 {
		var deadline time.Time
		for _, o := range live {
			if d, ok := o.ctx.Deadline(); ok && d.After(deadline) {
				deadline = d
			}
		}
		ctx := context.Background()
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		n.sendPipeline(ctx, live)
	}
	for _, o := range batch {
		close(o.done)
	}
	n.passTurn()
}

// passTurn lets the first queued caller send the next batch.
func (n *node) passTurn() {
	b := &n.batch
	b.mu.Lock()
	b.handOffLocked()
	b.mu.Unlock()
}

// sendPipeline sends batch as one pipeline of EVALSHA, then the scripts the
// node did not know (NOSCRIPT) as one pipeline of EVAL, in order.
func (n *node) sendPipeline(ctx context.Context, batch []*op) {
	pipe := n.rdb.Pipeline()
	for _, o := range batch {
		o.res = pipe.EvalSha(ctx, o.script.Hash(), o.keys, o.args...)
	}
	_, _ = pipe.Exec(ctx)
	var again []*op
	for _, o := range batch {
		// Re-send as EVAL only the scripts whose round is still on.
		if redis.HasErrorPrefix(o.res.Err(), "NOSCRIPT") && ended(o.ctx) == nil {
			again = append(again, o)
		}
	}
	if len(again) == 0 {
		return
	}
	pipe = n.rdb.Pipeline()
	for _, o := range again {
		o.res = pipe.Eval(ctx, o.script.src, o.keys, o.args...)
	}
	_, _ = pipe.Exec(ctx)
}

// ended returns ctx's cause once ctx is done or its deadline has been
// reached, checked against the clock rather than the context's timer, which
// may not have fired yet at the deadline itself.
func ended(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}
