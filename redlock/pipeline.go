package redlock

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// luaScript is a script with its source, for EVAL when a node answers
// NOSCRIPT.
type luaScript struct {
	*redis.Script
	src     string
	hashArg any // Hash() as a command argument, boxed once (evalArgs)
}

func newScript(src string) *luaScript {
	s := &luaScript{Script: redis.NewScript(src), src: src}
	s.hashArg = s.Hash()
	return s
}

// Pipelining. Every command for a node goes through that node's queue,
// which one worker goroutine drains: it sends what is queued (one op
// alone, several as one pipeline: one write, one read),
// delivers the replies, and takes the next batch. Concurrent rounds thus
// share writes (auto-pipelining), and a round starts no goroutine of its
// own: it queues one op per node and waits. The worker is started by an op
// that finds none running and ends as soon as it finds the queue empty, so
// an idle Client runs no goroutine (no linger: tests with goleak or
// testing/synctest find none left), while under load the workers run on.
// On a Client of one node whose client applies context deadlines, a round
// that finds the node idle sends its op itself (sendInline).
//
// Per-lock semantics are unchanged: each op keeps its round's deadline (an
// op whose deadline has passed when its turn comes is never sent), a
// pipeline runs under the latest deadline of its ops (never one op's
// cancellation: the others still wait for it), and batches go out one at
// a time in queue order, so that on each node a release sent after an
// acquire runs after it (lateGrant relies on it). An op re-sent in
// another form (redo: EVAL after NOSCRIPT, the script after a rejected SET
// NX GET) goes behind the rest of its batch, so only when no later op of
// its own lock names one of its keys (sendPipeline).

// nodeQueue holds the ops waiting for one node.
type nodeQueue struct {
	mu      sync.Mutex
	queue   []*op
	spare   []*op // the worker's previous batch, reused as the next queue
	running bool  // a worker is draining the queue
}

// op is one command for one node: a script, or a plain command with a
// script to fall back on. The worker fills in res and calls complete.
//
// deadline bounds when the worker hands the command to go-redis, which may
// still write it later (dialing a new connection first, for one): a grant
// that lands late is a late grant (lateGrant), and validity is measured
// from the round's start, before any of it.
type op struct {
	ctx      context.Context // the round's (with its deadline), or the caller's
	deadline time.Time       // never handed to go-redis at or after it (zero: ctx's deadline only)
	script   *luaScript      // cmd's script, for EVAL on NOSCRIPT; nil: cmd is not EVALSHA
	cmd      []any           // the command, shared by a round's ops (evalArgs for a script)
	// alt reports that cmd, a plain command, has a script form (the
	// round's spec.alt, EVALSHA of spec.altScript) that does what it does,
	// for a node that rejects cmd as a syntax error (SET NX GET before
	// Redis 7.0): useAlt switches to it. The one such command, SET NX
	// GET, is also the one whose reply is read raw (sendsRaw).
	alt bool
	res *redis.Cmd
	// raw is cmd sent as a RawCmd (sendsRaw), until cook sets res from
	// it; cooked: cook has run, cmd goes with Do from then on.
	raw    *redis.RawCmd
	cooked bool
	// complete is called by the worker (or an inline caller) once res is
	// set; it must not block.
	complete func(o *op)

	// Round bookkeeping (client.go).
	rs   *roundState
	nd   *node
	span trace.Span // per-node span (WithNodeSpans), or nil
	done chan struct{}
}

// submit queues o for n, starting n's worker if none runs. On an inline
// node with no worker running, the caller sends o itself (sendInline).
func (n *node) submit(o *op) {
	q := &n.queue
	q.mu.Lock()
	if n.inline && !q.running { // not running: nothing is queued either
		q.running = true // ops that come meanwhile queue behind o
		q.mu.Unlock()
		n.sendInline(o)
		return
	}
	q.queue = append(q.queue, o)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go n.work()
	}
}

// run sends script to n and waits for its reply (outside rounds: the
// cleanup of a late grant).
func (n *node) run(ctx context.Context, script *luaScript, keys []any, args ...any) *redis.Cmd {
	o := &op{ctx: ctx, script: script, cmd: evalArgs(script, keys, args...), done: make(chan struct{}),
		complete: func(o *op) { close(o.done) }}
	n.submit(o)
	<-o.done
	return o.res
}

// drain drains n's queue and ends when it finds it empty. It runs as the
// node's worker (n.work).
func (n *node) drain() {
	growStack(0)
	q := &n.queue
	for {
		q.mu.Lock()
		batch := q.queue
		if len(batch) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.queue, q.spare = q.spare[:0], nil
		q.mu.Unlock()
		n.send(batch)
		clear(batch)
		q.mu.Lock()
		q.spare = batch
		q.mu.Unlock()
	}
}

// sendInline sends o from the calling goroutine, as a worker would, then
// hands the ops queued meanwhile to a worker. Without the handoff to the
// worker and back (two goroutine wakeups), one goroutine locking in a loop
// on one node did 1.18x the acquire+release/s, 12 alternating runs
// (docs/benchmarks.md). Only for a node whose client applies context
// deadlines to its I/O (node.inline): the caller may be kept until the
// round's deadline, never longer, also when its ctx is cancelled sooner.
func (n *node) sendInline(o *op) {
	defer func() { // also if a go-redis hook panics: the node must not stay claimed
		q := &n.queue
		q.mu.Lock()
		start := len(q.queue) > 0
		q.running = start
		q.mu.Unlock()
		if start {
			go n.work()
		}
	}()
	batch := [1]*op{o}
	n.send(batch[:])
}

// send sends a batch: the ops whose deadline has passed get that error
// and are never sent; one live op goes alone with its own context, several
// as a pipeline. Every op's complete is called, in queue order.
func (n *node) send(batch []*op) {
	dead := 0
	now := time.Now() // one clock read per batch: 2% of the client's CPU at 64 goroutines
	for _, o := range batch {
		if err := o.ended(now); err != nil {
			o.res = redis.NewCmd(o.ctx)
			o.res.SetErr(err) // its deadline passed while queued
			dead++
		}
	}
	live := batch // no allocation while every op is live (the common case)
	if dead > 0 {
		live = make([]*op, 0, len(batch)-dead)
		for _, o := range batch {
			if o.res == nil {
				live = append(live, o)
			}
		}
	}
	switch {
	case len(live) == 1:
		n.sendOne(live[0])
	case len(live) > 1:
		var deadline time.Time
		for _, o := range live {
			if d := o.end(); d.After(deadline) {
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
		o.complete(o)
	}
}

// sendOne sends one op with its own context, and again in the form that
// the node's answer asks for (redo).
func (n *node) sendOne(o *op) {
	if n.sendsRaw(o) {
		o.raw = redis.NewRawCmd(o.ctx, o.cmd...)
		_ = n.rdb.Process(o.ctx, o.raw)
		if o.cook(true) && !n.redoAlone(o) {
			return
		}
	}
	for {
		o.res = n.rdb.Do(o.ctx, o.cmd...)
		if !n.redoAlone(o) {
			return
		}
	}
}

// sendPipeline sends batch as one pipeline, then the ops that the node
// asked to get in another form (redo) as another pipeline, in order. An
// op sent again goes after the ops that followed it in its batch, so one
// that would pass a later command of its own lock on one of its keys is
// not sent again and keeps its error: an acquire re-sent after its undo or
// release would set a key that nothing deletes before its TTL, and an undo
// re-sent after its lock's next attempt would delete the key that attempt
// set, on a node it counts as held (today an undo round waits for every
// node it calls, so the next attempt never shares its batch; the rule does
// not rely on it). Passing another lock's command changes no outcome that
// matters (a release that passes another lock's acquire makes it be
// refused there, as if it had come a moment sooner), and an op kept out
// for it would leave its key (a release) or fail (an acquire) for nothing.
// No op is sent again once its end has passed.
//
// A script that met NOSCRIPT and is not sent again (kept out, past its
// end, or dropped at its end as EVAL) is loaded before the next pipeline
// instead, once per batch, unless an EVAL of it goes there anyway: in a
// pipeline of its own, which waits up to the node timeout, also past the
// batch's deadline, so that a node slower than the deadline still learns
// the script (redo); the ops keep the batch's context.
func (n *node) sendPipeline(ctx context.Context, batch []*op) {
	var load []string // sources of scripts to load (SCRIPT LOAD runs nothing)
	for first := true; len(batch) > 0 || len(load) > 0; first = false {
		if !first {
			batch, load = dropEnded(batch, load)
			for {
				load = slices.DeleteFunc(load, func(src string) bool {
					return slices.ContainsFunc(batch, func(o *op) bool { return o.cmd[0] == "eval" && o.cmd[1] == src })
				})
				if len(load) == 0 {
					break
				}
				n.loadAll(ctx, load)
				batch, load = dropEnded(batch, nil) // ended during the load
			}
			if len(batch) == 0 {
				return
			}
		}
		pipe := n.rdb.Pipeline()
		for _, o := range batch {
			if n.sendsRaw(o) {
				o.raw = redis.NewRawCmd(ctx, o.cmd...)
				_ = pipe.Process(ctx, o.raw)
			} else {
				o.res = pipe.Do(ctx, o.cmd...)
			}
		}
		_, _ = pipe.Exec(ctx)
		var again []*op
		for i, o := range batch {
			if o.raw != nil {
				o.cook(false)
			}
			redo, src := n.redo(o)
			switch {
			case src != "": // NOSCRIPT after its end
			case !redo:
			case !passesOwnLock(o, batch[i+1:]):
				again = append(again, o)
			case o.cmd[0] == "eval": // kept out after NOSCRIPT
				src, _ = o.cmd[1].(string)
			}
			if src != "" && !slices.Contains(load, src) {
				load = append(load, src)
			}
		}
		batch = again
	}
}

// dropEnded gives the ops of batch whose end has passed that error, and
// returns the others, and load with the source of each dropped EVAL (its
// script is still to be loaded).
func dropEnded(batch []*op, load []string) ([]*op, []string) {
	now := time.Now()
	live := batch[:0]
	for _, o := range batch {
		if err := o.ended(now); err != nil {
			o.res = redis.NewCmd(o.ctx, o.cmd...)
			o.res.SetErr(err)
			if src, ok := o.cmd[1].(string); o.cmd[0] == "eval" && ok && !slices.Contains(load, src) {
				load = append(load, src)
			}
			continue
		}
		live = append(live, o)
	}
	return live, load
}

// loadAll loads the scripts of sources srcs on n in one pipeline, waiting
// up to the node timeout, or until ctx's deadline if that is later (a
// failure is left to the next NOSCRIPT).
func (n *node) loadAll(ctx context.Context, srcs []string) {
	if len(srcs) == 0 {
		return
	}
	end := time.Now().Add(n.timeout)
	if d, ok := ctx.Deadline(); ok && d.After(end) {
		end = d
	}
	lctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	pipe := n.rdb.Pipeline()
	for _, src := range srcs {
		pipe.ScriptLoad(lctx, src)
	}
	_, _ = pipe.Exec(lctx)
}

// passesOwnLock reports whether o, sent after later, would pass a command
// of its own lock (roundSpec.lock) that names one of its keys.
func passesOwnLock(o *op, later []*op) bool {
	l := o.lock()
	if l == nil {
		return false
	}
	for _, k := range cmdKeys(o.cmd) {
		for _, p := range later {
			if p.lock() == l && slices.Contains(cmdKeys(p.cmd), k) {
				return true
			}
		}
	}
	return false
}

// lock returns the lock of o's round (nil: none, or o is not a round's).
func (o *op) lock() *Lock {
	if o.rs == nil {
		return nil
	}
	return o.rs.spec.lock
}

// cmdKeys returns the keys that cmd names: SET's key, or the numkeys keys
// of EVAL and EVALSHA (evalArgs); nil for anything else.
func cmdKeys(cmd []any) []any {
	if len(cmd) > 1 && cmd[0] == "set" {
		return cmd[1:2]
	}
	if len(cmd) > 2 && (cmd[0] == "evalsha" || cmd[0] == "eval") {
		if nk, ok := cmd[2].(int); ok && nk >= 0 && 3+nk <= len(cmd) {
			return cmd[3 : 3+nk]
		}
	}
	return nil
}

// Raw replies. SET NX GET, TryAcquire's plain command, answers nil when
// it sets the key, and go-redis, reading that nil as redis.Nil for Do,
// runs its retry classifier on it (shouldRetry: a dozen errors.As, 17
// allocations per node and acquisition, docs/design.md). Read as a RawCmd
// the same reply is bytes and no error, and cook parses it: nil, a bulk
// string, or an error reply, which becomes the op's error as Do would
// make it. Only where Do would have sent the command again by itself, for
// an error reply that go-redis retries (LOADING, READONLY, ...: replies to
// commands that did not run), does cook leave it to Do, so that go-redis
// handles it as it always does: its retries, and a connection to a
// demoted master dropped; and only for an op sent alone (sendOne). In a
// pipeline go-redis retries an error reply only when it is the first
// reply, by sending the whole pipeline again, commands that ran included;
// a raw first reply spares it that. Any other error reply may come from a
// proxy after the command ran, and is never sent again by cook. Only SET
// NX GET goes raw (op.alt: scripts answer arrays and integers, never nil),
// and only to a *redis.Client (node.raw): a cluster client redirects on
// MOVED and ASK error replies, which a RawCmd does not report as errors.

// sendsRaw reports whether o goes as a RawCmd: SET NX GET (o.alt), on a
// node whose client is a *redis.Client, not yet left for Do by cook.
func (n *node) sendsRaw(o *op) bool { return n.raw && o.alt && !o.cooked }

// cook sets o.res from o.raw, the reply of o's SET NX GET read raw, and
// reports whether it did: redis.Nil for a nil reply (as Do gives it), the
// string of a bulk string, the error go-redis returned (of the connection
// or the context, after its retries, as for Do), or an error reply as an
// error that redis.HasErrorPrefix reads (any other reply, none known, as
// an error that quotes it). With resend, an error reply that go-redis
// retries is left for Do before o's end: cook returns false. Either way o
// goes as a RawCmd no more.
func (o *op) cook(resend bool) bool {
	b, err := o.raw.Result()
	o.raw, o.cooked = nil, true
	o.res = redis.NewCmd(o.ctx, o.cmd...)
	v, ok := rawBulk(b)
	msg, isErr := rawError(b)
	switch {
	case err != nil:
		o.res.SetErr(err)
	case ok && v == nil:
		o.res.SetErr(redis.Nil)
	case ok:
		o.res.SetVal(string(v))
	case !isErr:
		o.res.SetErr(fmt.Errorf("redlock: unexpected reply %q to %v", b, o.cmd[0]))
	case resend && retriedReply(msg) && o.ended(time.Now()) == nil:
		o.res = nil
		return false
	default:
		o.res.SetErr(replyError(msg))
	}
	return true
}

// rawError returns the message of b, one RESP reply, if it is an error
// reply: a simple error ("-ERR ...") or a RESP3 blob error ("!len").
func rawError(b []byte) (msg string, ok bool) {
	switch {
	case len(b) > 2 && b[0] == '-' && bytes.HasSuffix(b, []byte("\r\n")):
		return string(b[1 : len(b)-2]), true
	case len(b) > 0 && b[0] == '!':
		v, ok := rawBulk(append([]byte{'$'}, b[1:]...))
		return string(v), ok && v != nil
	}
	return "", false
}

// retriedReplies are the error replies that go-redis's Do retries
// (shouldRetry in go-redis v9 error.go): all say that the command did not
// run.
var retriedReplies = []string{"LOADING ", "READONLY ", "MASTERDOWN ", "NOREPLICAS ",
	"TRYAGAIN ", "CLUSTERDOWN ", "ERR max number of clients reached"}

// retriedReply reports whether msg, an error reply's message, starts with
// one of retriedReplies.
func retriedReply(msg string) bool {
	return slices.ContainsFunc(retriedReplies, func(p string) bool { return strings.HasPrefix(msg, p) })
}

// rawBulk parses b, one RESP reply, as a bulk string: ok is true for a
// nil reply (v nil: "$-1" in RESP2, "_" in RESP3) and for a bulk string
// (v its bytes, not nil), false for any other reply or malformed bytes.
func rawBulk(b []byte) (v []byte, ok bool) {
	switch {
	case string(b) == "$-1\r\n" || string(b) == "_\r\n":
		return nil, true
	case len(b) < 4 || b[0] != '$':
		return nil, false
	}
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return nil, false
	}
	n, err := strconv.Atoi(string(b[1:i]))
	if err != nil || n < 0 || len(b) != i+2+n+2 || string(b[i+2+n:]) != "\r\n" {
		return nil, false
	}
	return b[i+2 : i+2+n : i+2+n], true
}

// replyError is an error reply of a node, as go-redis's own: it satisfies
// redis.Error, so that redis.HasErrorPrefix reads it.
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a Redis error reply (redis.Error).
func (replyError) RedisError() {}

// redo reports whether o must be sent again, and changes its command for
// that: a script the node did not know (NOSCRIPT, after SCRIPT FLUSH or a
// restart, or a node's first use) goes as EVAL with its source; a plain
// command the node rejected as a syntax error goes as its alternative
// script, for this op and, from now on, for every op of this node
// (oldServer). Never after o's deadline: no command leaves after its
// round's deadline, also not a second form. Each form is tried at most
// once, so an op is sent at most three times (SET, EVALSHA, EVAL).
//
// A script that met NOSCRIPT after its deadline is to be loaded instead
// (SCRIPT LOAD runs nothing): redo returns its source as load. On a node
// slower than the node timeout every first EVALSHA answers after its
// deadline, and without it the node would answer NOSCRIPT to that script
// for good, so that no release would ever delete a key there.
func (n *node) redo(o *op) (again bool, load string) {
	err := o.res.Err()
	if err == nil || err == redis.Nil {
		return false, ""
	}
	late := o.ended(time.Now()) != nil
	switch {
	case o.script != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
		if late {
			return false, o.script.src
		}
		o.cmd, o.script = evalFallback(o), nil
		return true, ""
	case o.alt && redis.HasErrorPrefix(err, "syntax error"):
		n.oldServer.Store(true)
		if late {
			return false, ""
		}
		o.useAlt()
		return true, ""
	}
	return false, ""
}

// redoAlone is redo for an op sent alone (sendOne): it loads a script
// that redo asks to load itself.
func (n *node) redoAlone(o *op) bool {
	again, load := n.redo(o)
	if load != "" {
		n.load(load)
	}
	return again
}

// useAlt makes o's command its script form (see op.alt).
func (o *op) useAlt() {
	spec := &o.rs.spec
	o.script, o.cmd, o.alt = spec.altScript, spec.alt(o.rs.c, spec.late), false
}

// load loads the script of source src on n (SCRIPT LOAD), waiting at most
// the node timeout; a failure is left to the next NOSCRIPT.
func (n *node) load(src string) {
	ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
	defer cancel()
	_ = n.rdb.ScriptLoad(ctx, src).Err()
}

// evalArgs returns the command EVALSHA sha numkeys keys... args... Built
// once per round, it is shared by every node's command (go-redis only
// reads it).
func evalArgs(script *luaScript, keys []any, args ...any) []any {
	cmd := make([]any, 0, 3+len(keys)+len(args))
	cmd = append(cmd, "evalsha", script.hashArg, len(keys))
	cmd = append(cmd, keys...)
	return append(cmd, args...)
}

// evalFallback returns o's command as EVAL with the script's source.
func evalFallback(o *op) []any {
	cmd := slices.Clone(o.cmd)
	cmd[0], cmd[1] = "eval", o.script.src
	return cmd
}

// end returns the time after which o is never sent: its round's deadline
// or its ctx's, whichever comes first (zero: none).
func (o *op) end() time.Time {
	d, ok := o.ctx.Deadline()
	switch {
	case !ok:
		return o.deadline
	case o.deadline.IsZero() || d.Before(o.deadline):
		return d
	}
	return o.deadline
}

// ended returns o.ctx's cause once it is done (for a round's call, also
// once the caller's ctx of a round that is not detached is: roundCtx.ended),
// or DeadlineExceeded once o's end has been reached at now, checked against
// the clock rather than a context's timer, which may not have fired yet at
// the deadline itself.
func (o *op) ended(now time.Time) error {
	if o.rs != nil { // a round's call: its context is o.rs.ctx (or holds it)
		if err := o.rs.ctx.ended(); err != nil {
			return err
		}
	} else if o.ctx.Err() != nil {
		return context.Cause(o.ctx)
	}
	if d := o.end(); !d.IsZero() && !now.Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// workerStack is the stack, in bytes, a worker takes at once (growStack):
// with 16 KiB runtime.newstack fell from 17% to 2.4% of the client's CPU
// in sequential 3-node rounds, so most batches fit.
const workerStack = 16 << 10

// growStack makes the calling goroutine's stack hold workerStack bytes at
// once, while its stack is still two frames deep. A worker starts with the
// runtime's smallest stack and would otherwise grow it by doubling deep
// inside go-redis's call chain, each time copying and adjusting every frame
// (runtime.newstack was 17% of the client's CPU in sequential rounds).
//
//go:noinline
func growStack(i int) byte {
	var buf [workerStack]byte
	return buf[i]
}
