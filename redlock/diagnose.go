package redlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file names the real cause of a node's failure: the answers that an
// operator must fix on the node (misconfiguration, ErrMisconfigured), the
// reason a connection failed (recorded by a go-redis dial hook, since
// go-redis retries a failed dial until the node timeout and then reports
// only the deadline), and the log lines of a node that goes bad and
// recovers while the quorum still works.

// misconfigured lists the error replies that an operator must fix on the
// node or in the go-redis client, by reply prefix, with what to do.
var misconfigured = []struct{ prefix, fix string }{
	{"WRONGPASS", "authentication failed: check the Username and Password of the node's go-redis client"},
	{"NOAUTH", "the node requires a password: set Password (and Username) in the node's go-redis client"},
	{"Protocol error: unauthenticated", "the node requires a password: set Password (and Username) in the node's go-redis client"},
	{"NOPERM", "the ACL user lacks a permission this library needs (docs/integrations.md lists them)"},
	{"CROSSSLOT", "a Redis Cluster node: the keys of one call must hash to one slot; use a key prefix with a hash tag (WithKeyPrefix(\"{locks}:\")) or standalone nodes"},
	{"MOVED", "a Redis Cluster node that does not serve this key's slot: use standalone masters"},
	{"ASK", "a Redis Cluster node migrating this key's slot: use standalone masters"},
	{"READONLY", "a read-only replica: every node must be an independent master"},
	{"OOM", "the node is at maxmemory and refuses writes (maxmemory-policy noeviction): raise maxmemory or free memory"},
	{"MISCONF", "the node refuses writes because it cannot save its snapshots (stop-writes-on-bgsave-error): fix its disk or persistence settings"},
	{"WRONGTYPE", "a key this library writes holds another type of value: another key has its name (a WithReleaseLog list, or a key written outside this library under the key prefix)"},
	{"unknown command", "the node does not offer a command this library needs (renamed or disabled?)"},
}

// misconfigError is a node's answer that an operator must fix: it matches
// ErrMisconfigured and the node's error.
type misconfigError struct {
	fix string
	err error
}

func (e *misconfigError) Error() string   { return e.fix + " (the node answered: " + e.err.Error() + ")" }
func (e *misconfigError) Unwrap() []error { return []error{ErrMisconfigured, e.err} }

// nodeError returns err, a node's failed call, as a NodeResult's Err: an
// answer that an operator must fix matches ErrMisconfigured and says what
// to fix.
func nodeError(err error) error {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return err
	}
	for _, m := range misconfigured {
		// Redis before 7.0 wraps the error a script's call raised:
		// "ERR Error running script (...): ... -NOPERM ...".
		if redis.HasErrorPrefix(rerr, m.prefix) || redis.HasErrorPrefix(rerr, "Error running script") && strings.Contains(rerr.Error(), "-"+m.prefix) {
			return &misconfigError{fix: m.fix, err: err}
		}
	}
	return err
}

// dialError is the last failure to connect to a node, as the cause of the
// node's missing answer.
type dialError struct{ err error }

func (e *dialError) Error() string { return "cannot connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dialWatch is the go-redis hook that New adds to a node's client, once
// per client whatever the number of Clients over it (go-redis cannot
// remove a hook): it records each dial's outcome for the peers of the
// live Clients on that client, the last failure to connect or nil after a
// connection. It changes nothing else. A *redis.ClusterClient does not
// run its own dial hooks for its shards' connections, so nothing is
// recorded there.
type dialWatch struct {
	mu    sync.Mutex
	peers map[*peer]struct{}
}

// dialWatches holds the hook of each client that a Client uses.
var dialWatches sync.Map // redis.UniversalClient -> *dialWatch

// watchDials makes the hook of p's client record p's dials, adding the
// hook to the client the first time.
func watchDials(p *peer) {
	w := &dialWatch{peers: map[*peer]struct{}{}}
	if old, loaded := dialWatches.LoadOrStore(p.rdb, w); loaded {
		w = old.(*dialWatch)
	} else {
		p.rdb.AddHook(w)
	}
	w.mu.Lock()
	w.peers[p] = struct{}{}
	w.mu.Unlock()
}

// unwatchDials stops recording p's dials (Close).
func unwatchDials(p *peer) {
	if w, ok := dialWatches.Load(p.rdb); ok {
		w := w.(*dialWatch)
		w.mu.Lock()
		delete(w.peers, p)
		if len(w.peers) == 0 {
			// Forget the client (its hook stays, recording for no one; a
			// later New on it adds another).
			dialWatches.CompareAndDelete(p.rdb, w)
		}
		w.mu.Unlock()
	}
}

func (w *dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		var cause error
		switch {
		case err != nil && ctx.Err() != nil:
			return conn, err // the caller gave up: nothing about the node
		case err != nil:
			cause = &dialError{err: err}
		}
		w.mu.Lock()
		for p := range w.peers {
			p.health.noteDial(cause)
		}
		w.mu.Unlock()
		return conn, err
	}
}

func (*dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (*dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// health is what a Client knows of one node's failures: its last failure
// to connect, and whether it is failing (since when, why), for the log
// lines of a node that goes bad and recovers.
type health struct {
	mu      sync.Mutex
	dial    error     // the last failed dial, nil after a connection
	cause   error     // why the node is failing; nil while it answers
	since   time.Time // when it started failing
	failed  time.Time // its last failure
	lastErr error     // the last failure's error, for later rounds' texts
}

// noteDial records the outcome of a dial: err, or nil for a connection.
func (h *health) noteDial(err error) {
	h.mu.Lock()
	h.dial = err
	h.mu.Unlock()
}

// why returns what explains the node's missing answer: its last failure to
// connect, else its last failure while it is failing; nil when nothing is
// known.
func (h *health) why() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dial != nil {
		return h.dial
	}
	return h.lastErr
}

// quiet is how long a failing node must answer without a new failure
// before it is logged as recovered: calls queued behind a freeze time out
// and are answered in turns once it ends. A misconfigured node waits
// quietMisconfigured: a read-only replica answers reads, and a write
// that a held key refuses, until the next write fails.
const (
	quiet              = time.Second
	quietMisconfigured = time.Minute
)

// observe records a result of p and logs the node going bad (the first
// failure after it recovered, and again when the failure turns out to be
// a misconfiguration) and recovering (an answer once quiet has passed
// since its last failure). Results that say nothing about the node (cut
// short by the caller, a shorter wait than the node timeout) are not given
// to it.
func (c *Client) observe(p *peer, r NodeResult) {
	if errors.Is(r.Err, context.Canceled) {
		return // Close gave up on the call: nothing about the node
	}
	h := &p.health
	now := time.Now()
	h.mu.Lock()
	var logBad, logGood bool
	var since time.Time
	cause := r.Err
	switch r.Outcome {
	case OutcomeOK, OutcomeHeld, OutcomeGated:
		logGood, since = h.answeredLocked(now)
	case OutcomeError, OutcomeTimeout:
		if cause == nil {
			cause = errors.New("no answer")
		}
		logBad = h.failedLocked(r.Outcome, cause, now)
	}
	h.mu.Unlock()
	switch {
	case logBad && errors.Is(cause, ErrMisconfigured):
		c.log.Error("redlock: node misconfigured ("+c.quorumText()+")",
			"node", p.addr, "cause", cause.Error())
	case logBad:
		c.log.Warn("redlock: node failing ("+c.quorumText()+")",
			"node", p.addr, "cause", cause.Error())
	case logGood:
		c.log.Info("redlock: node answers again", "node", p.addr,
			"failing_for", now.Sub(since).Round(time.Millisecond).String())
	}
}

// quorumText says, for a node's failure log line, whether the nodes that
// are not failing still make a quorum.
func (c *Client) quorumText() string {
	failing := 0
	for _, p := range c.peers {
		p.health.mu.Lock()
		if p.health.cause != nil {
			failing++
		}
		p.health.mu.Unlock()
	}
	if n := len(c.peers); failing > n-c.quorum {
		return fmt.Sprintf("%d of %d nodes failing, fewer than a quorum of %d answer: no lock can be acquired, extended or released until they do",
			failing, n, c.quorum)
	}
	return fmt.Sprintf("%d of %d nodes failing: locks work while a quorum of %d answers", failing, len(c.peers), c.quorum)
}

// answeredLocked records an answer of the node at now; logGood says that
// it ends a failure that began at since. h.mu is held.
func (h *health) answeredLocked(now time.Time) (logGood bool, since time.Time) {
	h.dial, h.lastErr = nil, nil // a later missing answer is not explained by an old failure
	wait := quiet
	if errors.Is(h.cause, ErrMisconfigured) {
		wait = quietMisconfigured
	}
	if h.cause != nil && now.Sub(h.failed) >= wait {
		logGood, since = true, h.since
		h.cause = nil
	}
	return logGood, since
}

// failedLocked records a failure of the node at now (outcome o, with
// cause); logBad says that it is a new one to log. h.mu is held.
func (h *health) failedLocked(o Outcome, cause error, now time.Time) (logBad bool) {
	if o == OutcomeError {
		h.lastErr = cause
	}
	mis := errors.Is(cause, ErrMisconfigured)
	logBad = h.cause == nil || mis && !errors.Is(h.cause, ErrMisconfigured)
	if h.cause == nil {
		h.since = now
	}
	// A misconfigured node's calls also time out (go-redis retries
	// READONLY until the deadline): that does not make it a new
	// failure to log again when its next answer names the cause.
	if o != OutcomeTimeout || !errors.Is(h.cause, ErrMisconfigured) {
		h.cause = cause
	}
	h.failed = now
	return logBad
}

// explain returns err, a node's missing answer, with what is known of the
// node's failure: "no answer within the 100ms node timeout: cannot
// connect: dial tcp ...: connection refused".
func explain(p *peer, err *noAnswerError) error {
	why := p.health.why()
	if why == nil || err.err != nil && !errors.Is(err.err, context.DeadlineExceeded) {
		return err
	}
	return &noAnswerError{msg: err.msg + ": " + causeText(why), err: why}
}

// causeText says what a node's failure was, for a missing answer's text.
func causeText(err error) string {
	var d *dialError
	if errors.As(err, &d) {
		return d.Error()
	}
	return "its last failure: " + err.Error()
}

// warnLayout logs, at New, node sets that work but do not tolerate what
// the user probably expects: an even count (a quorum of 2 of 2 tolerates
// no failure, 3 of 4 one, as 3 nodes do), a *redis.Ring as a node, and
// two names of one server ("localhost:6379" and "127.0.0.1:6379").
func (c *Client) warnLayout() {
	switch n := len(c.peers); {
	case n == 2:
		c.log.Warn("redlock: 2 nodes: the quorum is both, so no node may fail; use 3 (or 5) nodes", "nodes", n)
	case n > 2 && n%2 == 0:
		c.log.Warn(fmt.Sprintf("redlock: %d nodes: the quorum is %d, which tolerates as many failed nodes as %d nodes do; use an odd number", n, c.quorum, n-1),
			"nodes", n)
	}
	for _, p := range c.peers {
		if _, ring := p.rdb.(*redis.Ring); ring {
			c.log.Warn("redlock: a *redis.Ring is one node here, and it moves keys to other shards when one goes down, which loses locks: use one *redis.Client per node",
				"node", p.addr)
		}
	}
	seen := map[string]string{}
	for _, p := range c.peers {
		key, ok := loopbackKey(p.addr)
		if !ok {
			continue
		}
		if other, dup := seen[key]; dup {
			c.log.Warn("redlock: two nodes are one server: a failure of that server counts twice", "node", p.addr, "same_as", other)
			continue
		}
		seen[key] = p.addr
	}
}

// loopbackKey returns the address with the names of this machine
// (localhost, 127.0.0.1, ::1, 0.0.0.0) made one, so that two names of one
// local server compare equal; false for an address without a port.
func loopbackKey(addr string) (string, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false
	}
	switch h := strings.ToLower(host); {
	case h == "localhost" || h == "" || h == "0.0.0.0" || h == "::":
		host = "loopback"
	case net.ParseIP(h) != nil && net.ParseIP(h).IsLoopback():
		host = "loopback"
	}
	return host + ":" + port, true
}
