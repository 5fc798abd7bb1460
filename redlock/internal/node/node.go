// Package node sends commands to one Redis node and knows nothing of
// locks. Concurrent callers' commands queue up and one sender goroutine per
// node writes whatever is queued as one go-redis pipeline (one write, one
// read), so that many rounds in flight cost one round trip per node, not
// one each.
//
// Ordering: calls go out in queue order, batch by batch, and a batch is
// sent only after the previous one was answered or its context ended (or
// its calls' Wait passed).
//
// Lifecycle: Send starts the sender when none runs; a sender that has had
// nothing to send for Idle ends. Close stops it and waits for it.
//
// Scripts: a script goes as EVAL until the node has run it once, then as
// EVALSHA. A NOSCRIPT reply (the node restarted or flushed its scripts) is
// handled here only: the call goes again as EVAL, after the rest of its
// batch, unless a later call of the batch that ran names one of its keys and
// the call is not Reorderable; then it keeps the NOSCRIPT error, since
// running it after that later call could change the outcome.
package node

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is the error of a call made after Close, or still queued when
// Close gave up waiting.
var ErrClosed = errors.New("node closed")

// Idle is how long a sender waits for more calls before it ends.
const Idle = 100 * time.Millisecond

// Script is a Lua script, known to nodes by its SHA1.
type Script struct {
	src, hash string
}

// NewScript returns the script of source src.
func NewScript(src string) *Script { return &Script{src: src, hash: redis.NewScript(src).Hash()} }

// Command returns the EVALSHA command that runs s with keys and args.
func (s *Script) Command(keys []string, args ...any) []any {
	cmd := make([]any, 0, 3+len(keys)+len(args))
	cmd = append(cmd, "evalsha", s.hash, len(keys))
	for _, k := range keys {
		cmd = append(cmd, k)
	}
	return append(cmd, args...)
}

// eval returns cmd, an EVALSHA command of s, as EVAL.
func (s *Script) eval(cmd []any) []any {
	e := slices.Clone(cmd)
	e[0], e[1] = "eval", s.src
	return e
}

// Call is one command for the node.
type Call struct {
	// Ctx bounds the call: a call whose Ctx has ended when its turn comes
	// is not sent, and its deadline bounds the wait for the reply (with
	// ContextTimeoutEnabled on the go-redis client). Its values reach
	// go-redis hooks when the call goes alone.
	Ctx context.Context
	// Script, when set, is the script that Args runs: Args is its
	// EVALSHA command (Script.Command), which the node sends as EVAL until
	// it knows the script. Otherwise Args is a plain command. Keys are the
	// keys the command names (for ordering only). Args is only read, so
	// one slice may serve the calls of several nodes.
	Script *Script
	Keys   []string
	Args   []any
	// Reorderable says that the call may run after later calls of its
	// batch on the same keys (a compare-and-delete of the caller's own
	// value): it is sent again after NOSCRIPT whatever follows it.
	Reorderable bool
	// Wait, when positive, bounds the wait for the reply from the moment
	// the call goes out (and Ctx's deadline, if earlier, still applies),
	// so that a call without a deadline of its own (a cleanup, sent
	// however late its turn comes) holds the node's later calls at most
	// that long once sent (with ContextTimeoutEnabled on the go-redis
	// client; else its ReadTimeout applies).
	Wait time.Duration
	// Done receives the call and its reply, once, on the node's sender
	// goroutine (an Inline call's caller's, when it was sent inline); it
	// must not block. It may call Send.
	Done func(c *Call, reply *redis.Cmd)
	// Owner is the caller's, for Done.
	Owner any
	// Inline lets Send send the call on the caller's goroutine, and
	// return after Done ran, when the node has no sender running and
	// nothing queued: a caller that would only wait for this one reply
	// (a round on a Client of one node) saves the two goroutine handoffs
	// of the sender. Calls queued meanwhile go to a sender started
	// afterwards, so the ordering above holds. Send then returns only when
	// the call does: set it only when the go-redis client applies Ctx's
	// deadline to the socket (ContextTimeoutEnabled) and Ctx has one, or
	// Wait is set.
	Inline bool
}

// Node is the transport to one Redis node. Its methods are safe for
// concurrent use. The zero value is not usable: use New.
type Node struct {
	rdb redis.UniversalClient

	mu      sync.Mutex
	queue   []*Call
	running bool          // a sender runs
	ended   chan struct{} // closed when the running sender ends
	closed  bool
	kick    chan struct{} // 1-buffered: the queue is not empty
	stop    chan struct{} // closed by Close: drain, then end
	halt    context.CancelFunc
	base    context.Context // ends when Close gives up

	known map[string]bool // SHA1s of the scripts the node has run; sender only
}

// New returns the transport to rdb. It starts nothing: the sender starts
// with the first Send.
func New(rdb redis.UniversalClient) *Node {
	base, halt := context.WithCancel(context.Background())
	return &Node{rdb: rdb, kick: make(chan struct{}, 1), stop: make(chan struct{}),
		base: base, halt: halt, known: map[string]bool{}}
}

// Send queues c; c.Done runs later on the sender goroutine. It never
// blocks, unless c.Inline lets it send c itself (then for as long as the
// call lasts: its Ctx and Wait bound it). After Close it queues nothing
// and returns ErrClosed.
func (n *Node) Send(c *Call) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	if c.Inline && !n.running && len(n.queue) == 0 {
		n.sendInline(c)
		return nil
	}
	n.queue = append(n.queue, c)
	if !n.running {
		n.running, n.ended = true, make(chan struct{})
		go n.run(n.ended)
	}
	n.mu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
	return nil
}

// sendInline sends c on the caller's goroutine as the node's sender (n.mu
// held on entry, released on return), then hands what was queued meanwhile
// to a sender goroutine.
func (n *Node) sendInline(c *Call) {
	n.running, n.ended = true, make(chan struct{})
	ended := n.ended
	n.mu.Unlock()
	n.send([]*Call{c})
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.queue) > 0 {
		go n.run(ended)
		return
	}
	n.running = false
	close(ended)
}

// Flush returns once every call queued before it has been answered or
// dropped, or when ctx ends (with ctx's cause).
func (n *Node) Flush(ctx context.Context) error {
	done := make(chan struct{})
	if err := n.Send(&Call{Ctx: context.Background(), Done: func(*Call, *redis.Cmd) { close(done) }}); err != nil {
		return nil // closed: nothing is queued any more once Close returned
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Close stops taking calls, lets the sender send what is queued until ctx
// ends, then cancels what is left (ErrClosed) and returns once the sender
// has ended. A command that go-redis is reading a reply for when ctx ends
// ends with the go-redis client's read timeout at the latest. It returns
// ctx's cause if ctx ended first, else nil. Safe to call more than once.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		close(n.stop)
	}
	running, ended := n.running, n.ended
	n.mu.Unlock()
	if !running {
		n.halt()
		return nil
	}
	select {
	case <-ended:
		n.halt()
		return nil
	case <-ctx.Done():
		n.halt()
		<-ended
		return context.Cause(ctx)
	}
}

// run is the sender: it sends the queue's calls, batch by batch, until it
// has been idle for Idle, or until Close, then what is left.
func (n *Node) run(ended chan struct{}) {
	defer close(ended)
	idle := time.NewTimer(Idle)
	defer idle.Stop()
	for {
		for n.sendQueued() {
		}
		idle.Reset(Idle)
		select {
		case <-n.kick:
		case <-n.stop:
			for n.sendQueued() {
			}
			return
		case <-idle.C:
			n.mu.Lock()
			if len(n.queue) == 0 {
				n.running = false
				n.mu.Unlock()
				return
			}
			n.mu.Unlock()
		}
	}
}

// sendQueued sends what is queued as one batch and reports whether there
// was anything.
func (n *Node) sendQueued() bool {
	n.mu.Lock()
	batch := n.queue
	n.queue = nil
	n.mu.Unlock()
	if len(batch) == 0 {
		return false
	}
	n.send(batch)
	return true
}

// send sends batch: a call whose ctx has ended (or every call, once Close
// gave up) gets that error unsent; one live call goes alone with its own
// ctx, several as a pipeline under the latest of their deadlines. Every
// call's Done runs, in queue order.
func (n *Node) send(batch []*Call) {
	replies := make([]*redis.Cmd, len(batch))
	var live []int
	for i, c := range batch {
		switch {
		case n.base.Err() != nil:
			replies[i] = failed(c, ErrClosed)
		case c.Script == nil && c.Args == nil: // Flush's marker
			replies[i] = redis.NewCmd(c.Ctx)
		case c.Ctx.Err() != nil:
			replies[i] = failed(c, context.Cause(c.Ctx))
		default:
			live = append(live, i)
		}
	}
	switch len(live) {
	case 0:
	case 1:
		i := live[0]
		replies[i] = n.sendOne(batch[i])
	default:
		ctx, cancel := n.batchContext(batch, live)
		n.sendPipeline(ctx, batch, live, replies)
		cancel()
	}
	for i, c := range batch {
		c.Done(c, replies[i])
	}
}

// sendOne sends c alone with its own ctx (values and all), bounded by
// c.Wait from now and ended also when Close gives up, so that go-redis
// does not retry it then.
func (n *Node) sendOne(c *Call) *redis.Cmd {
	var ctx context.Context
	var cancel context.CancelFunc
	if c.Wait > 0 {
		ctx, cancel = context.WithTimeout(c.Ctx, c.Wait)
	} else {
		ctx, cancel = context.WithCancel(c.Ctx)
	}
	defer cancel()
	defer context.AfterFunc(n.base, cancel)()
	cmd := n.rdb.Do(ctx, n.command(c)...)
	if c.Script != nil && n.learn(c, cmd) {
		cmd = n.rdb.Do(ctx, c.Script.eval(c.Args)...)
		n.learn(c, cmd)
	}
	return cmd
}

// command returns c's command: a script as EVALSHA if the node knows it,
// else as EVAL.
func (n *Node) command(c *Call) []any {
	if c.Script == nil || n.known[c.Script.hash] {
		return c.Args
	}
	return c.Script.eval(c.Args)
}

// learn records from reply whether the node knows c's script, and reports
// whether the reply is NOSCRIPT.
func (n *Node) learn(c *Call, reply *redis.Cmd) (noscript bool) {
	switch err := reply.Err(); {
	case err == nil || IsReply(err):
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			delete(n.known, c.Script.hash)
			return true
		}
		n.known[c.Script.hash] = true // it ran (a script error is an answer too)
	}
	return false
}

// IsReply reports whether err, a command's error, is a reply of the node
// (an error reply, or redis.Nil), not a failure to reach it.
func IsReply(err error) bool {
	switch err {
	case nil:
		return false
	case redis.Nil:
		return true
	}
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// batchContext returns the context of a pipeline of the live calls: the
// latest of their deadlines (none if one has none), ended also by Close.
// A call's deadline is its Ctx's, or now + Wait if that is earlier.
func (n *Node) batchContext(batch []*Call, live []int) (context.Context, context.CancelFunc) {
	now := time.Now()
	var latest time.Time
	for _, i := range live {
		d, ok := batch[i].Ctx.Deadline()
		if w := batch[i].Wait; w > 0 && (!ok || now.Add(w).Before(d)) {
			d, ok = now.Add(w), true
		}
		if !ok {
			return context.WithCancel(n.base)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(n.base, latest)
}

// sendPipeline sends the live calls of batch as one pipeline, then, as a
// second one, as EVAL, those the node answered NOSCRIPT that may go after
// the rest of the batch (see the package doc).
func (n *Node) sendPipeline(ctx context.Context, batch []*Call, live []int, replies []*redis.Cmd) {
	pipe := n.rdb.Pipeline()
	for _, i := range live {
		replies[i] = pipe.Do(ctx, n.command(batch[i])...)
	}
	_, _ = pipe.Exec(ctx)
	noscript := make([]bool, len(batch))
	for _, i := range live {
		noscript[i] = batch[i].Script != nil && n.learn(batch[i], replies[i])
	}
	var again []int
	for j, i := range live {
		if noscript[i] && batch[i].Ctx.Err() == nil && (batch[i].Reorderable || !passes(batch, live[j+1:], noscript, i)) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return
	}
	pipe = n.rdb.Pipeline()
	for _, i := range again {
		replies[i] = pipe.Do(ctx, batch[i].Script.eval(batch[i].Args)...)
	}
	_, _ = pipe.Exec(ctx)
	for _, i := range again {
		n.learn(batch[i], replies[i])
	}
}

// passes reports whether batch[i], sent again, would pass a call of
// later that ran (not NOSCRIPT) and names one of its keys.
func passes(batch []*Call, later []int, noscript []bool, i int) bool {
	for _, j := range later {
		for _, k := range batch[j].Keys {
			if !noscript[j] && slices.Contains(batch[i].Keys, k) {
				return true
			}
		}
	}
	return false
}

// failed returns a reply holding err for c.
func failed(c *Call, err error) *redis.Cmd {
	cmd := redis.NewCmd(c.Ctx)
	cmd.SetErr(err)
	return cmd
}
