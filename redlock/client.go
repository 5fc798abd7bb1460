package redlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/node"
)

// Client acquires locks on a fixed set of independent Redis nodes. It is
// immutable after New and safe for concurrent use by many goroutines.
//
// New starts nothing. A command for a node starts that node's sender
// goroutine (internal/node), which ends after 100 ms without commands, and
// a waiting Acquire starts the release-notice subscribers
// (WithReleaseNotices), which end when no Acquire waits. Close stops them
// all at once and returns once they have ended. The Client does not own
// the go-redis clients: close them after Close.
type Client struct {
	peers  []*peer
	quorum int
	cfg    config
	log    *slog.Logger
	tel    *telemetry
	// services are the features' state shared by the Client's Locks
	// (layer.go).
	services []service

	closed atomic.Bool
}

// peer is one configured node.
type peer struct {
	idx  int
	addr string
	rdb  redis.UniversalClient
	tx   *node.Node
	// down is set when a call got no answer within the node timeout, and
	// cleared by the node's next answer: acquire rounds do not wait for a
	// node that is down (round.go).
	down atomic.Bool
	// noSetGet is set once the node rejected SET NX GET (Redis before
	// 7.0): it gets the acquire script instead (acquire.go).
	noSetGet atomic.Bool
	// health is what is known of the node's failures (diagnose.go).
	health health
	// deadlines says that go-redis applies a call's deadline to the
	// node's socket (a *redis.Client with ContextTimeoutEnabled), so that
	// a call sent inline (round.go) ends within the node timeout.
	deadlines bool
}

// New returns a Client over nodes, each one independent Redis master (no
// replication between them; redis.io distlock spec, "The Redlock
// algorithm"). The quorum is len(nodes)/2+1 of the configured nodes, never of
// the nodes that happen to answer. One node is the single-instance lock of the
// redis.io page: correct while that node runs, not fault tolerant.
//
// Give the go-redis clients ContextTimeoutEnabled: true if you can: go-redis
// then ends a request at its deadline (the node timeout; for a release or
// undo, the node timeout after it went out) instead of at its ReadTimeout
// (5 s by default in go-redis v9.23), so a frozen or unreachable node holds
// up the later commands for it at most about the node timeout.
//
// A *redis.ClusterClient may stand for one node only if every key of one
// call maps to one hash slot: the scripts touch all keys of a lock at once,
// and a fenced, reentrant or gated lock and the scheduler's runs use
// several keys even for one resource. Give the Client a key prefix with a
// hash tag (WithKeyPrefix("{locks}:")); docs/integrations.md. A
// *redis.Ring is not a node: when it drops a shard it moves the keys to
// others, which loses locks; New warns about one.
//
// SharedOptions given to New set the default of every call. New errors
// (matching ErrInvalidArgument, naming the bad value) on no nodes, a nil
// node, the same client or address twice, and options out of range; it
// performs no I/O. It warns on the logger (WithLogger) about node sets
// that work but tolerate fewer failures than their size suggests: 2 nodes
// (no node may fail), an even count, two names of one local server.
//
// New adds a go-redis hook (redis.Hook, DialHook only; one per client
// however many Clients use it) to each node's client that records the
// node's last failure to connect, so that errors and logs name it
// ("connection refused", "no such host"): go-redis retries a failed dial
// until the deadline and reports only the deadline. Close stops the
// recording for its nodes. (A *redis.ClusterClient does not run it.)
func New(nodes []redis.UniversalClient, opts ...Option) (*Client, error) {
	cfg := config{
		driftFactor: DefaultDriftFactor,
		nodeTimeout: DefaultNodeTimeout,
		minValidity: DefaultMinValidity,
		lock:        lockConfig{retry: DefaultRetry},
	}
	for _, setDefault := range clientDefaults {
		setDefault(&cfg)
	}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("option %d of %d is nil", i+1, len(opts))
		}
		o.applyClient(&cfg)
	}
	if err := cfg.validate(len(nodes)); err != nil {
		return nil, err
	}
	log := cfg.logger
	if log == nil {
		log = slog.Default()
	}
	tel, err := newTelemetry(cfg)
	if err != nil {
		return nil, fmt.Errorf("redlock: creating the OpenTelemetry instruments: %w", err)
	}
	c := &Client{quorum: len(nodes)/2 + 1, cfg: cfg, log: log, tel: tel}
	seen := make(map[string]int, len(nodes))
	for i, rdb := range nodes {
		if rdb == nil || (reflect.ValueOf(rdb).Kind() == reflect.Pointer && reflect.ValueOf(rdb).IsNil()) {
			return nil, invalidf("nodes[%d] is nil", i)
		}
		id, addr := nodeIdentity(i, rdb)
		if j, dup := seen[id]; dup {
			if _, ok := rdb.(*redis.Client); ok {
				return nil, invalidf("nodes[%d] and nodes[%d] are the same node (%s): each must be a separate Redis server", j, i, addr)
			}
			return nil, invalidf("nodes[%d] and nodes[%d] are the same client: each must be a separate Redis server", j, i)
		}
		seen[id] = i
		c.peers = append(c.peers, newPeer(i, addr, rdb))
	}
	for _, p := range c.peers { // once every node is valid
		watchDials(p)
	}
	for _, newService := range services {
		c.services = append(c.services, newService(c))
	}
	c.warnLayout()
	return c, nil
}

// newPeer returns node i, rdb at addr.
func newPeer(i int, addr string, rdb redis.UniversalClient) *peer {
	p := &peer{idx: i, addr: addr, rdb: rdb, tx: node.New(rdb)}
	if cl, ok := rdb.(*redis.Client); ok {
		p.deadlines = cl.Options().ContextTimeoutEnabled
	}
	return p
}

// validate checks the options, naming the bad value.
func (cfg *config) validate(nodes int) error {
	switch {
	case nodes == 0:
		return invalidf("no nodes: give New at least one Redis client")
	case math.IsNaN(cfg.driftFactor) || cfg.driftFactor < 0 || cfg.driftFactor >= 0.5:
		return invalidf("drift factor %v (WithDriftFactor) must be at least 0 and below 0.5", cfg.driftFactor)
	case cfg.nodeTimeout <= 0:
		return invalidf("node timeout %v (WithNodeTimeout) is not positive", cfg.nodeTimeout)
	case math.IsNaN(cfg.minValidity) || cfg.minValidity < 0 || cfg.minValidity >= 1:
		return invalidf("minimum validity %v (WithMinValidity) must be at least 0 and below 1", cfg.minValidity)
	case cfg.driftFactor+cfg.minValidity >= 1:
		return invalidf("drift factor %v (WithDriftFactor) and minimum validity %v (WithMinValidity) add up to 1 or more: no TTL would leave the minimum validity", cfg.driftFactor, cfg.minValidity)
	case hasNUL(cfg.keyPrefix):
		return invalidf("key prefix %s (WithKeyPrefix) contains a NUL byte", quoteName(cfg.keyPrefix))
	}
	if err := cfg.lock.validate(); err != nil { // the SharedOptions given to New
		return err
	}
	for _, check := range clientChecks {
		if err := check(cfg); err != nil {
			return err
		}
	}
	return nil
}

// nodeIdentity returns a key that is equal for two entries that reach the
// same Redis database, and a printable address.
func nodeIdentity(i int, rdb redis.UniversalClient) (id, addr string) {
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		return fmt.Sprintf("%s/%s/%d", o.Network, o.Addr, o.DB), o.Addr
	case *redis.ClusterClient:
		if addrs := c.Options().Addrs; len(addrs) > 0 {
			return fmt.Sprintf("%p", rdb), "cluster " + strings.Join(addrs, ",")
		}
	}
	return fmt.Sprintf("%p", rdb), fmt.Sprintf("node%d", i)
}

// Quorum returns the number of nodes that must agree: N/2+1.
func (c *Client) Quorum() int { return c.quorum }

// NodeTimeout returns the Client's node timeout (WithNodeTimeout).
func (c *Client) NodeTimeout() time.Duration { return c.cfg.nodeTimeout }

// Nodes returns the number of configured nodes N.
func (c *Client) Nodes() int { return len(c.peers) }

// Close stops the Client: calls made afterwards fail with ErrClosed. It
// lets the commands already queued for the nodes go out (the releases and
// cleanups that calls returning at a quorum left on their way) until ctx
// ends, then cancels the rest, stops the release-notice subscribers, and
// returns once every goroutine the Client started has ended. Locks still
// held are not released: release them first; their keys expire with their
// TTL. Close does not close the go-redis clients.
//
// Errors: ctx's cause when ctx ended before the queued commands went out
// (they are cancelled; a command that go-redis is reading a reply for then
// ends with the client's read timeout at the latest, and so does a
// release-notice subscription that is still connecting: Close can return
// that much later than ctx). Safe to call more than once and concurrently:
// each call waits as the first does, bounded by its own ctx; the first ctx
// to end cancels what is still queued, for every caller.
func (c *Client) Close(ctx context.Context) error {
	c.closed.Store(true)
	for _, p := range c.peers {
		unwatchDials(p)
	}
	var wg sync.WaitGroup
	for _, s := range c.services {
		wg.Go(s.close)
	}
	errs := make([]error, len(c.peers))
	for i, p := range c.peers {
		wg.Go(func() { errs[i] = p.tx.Close(ctx) })
	}
	wg.Wait()
	if errors.Join(errs...) != nil {
		return context.Cause(ctx)
	}
	return nil
}

// Wait returns once every command queued for the nodes so far has been
// answered or dropped (the other nodes' part of the rounds that returned
// at a quorum), or when ctx ends (with ctx's cause).
//
// Deprecated: use Close, which also stops the Client's goroutines; Wait
// will be removed in the next release.
func (c *Client) Wait(ctx context.Context) error { return c.flush(ctx) }

// flush returns once every command queued so far has been answered or
// dropped, or when ctx ends.
func (c *Client) flush(ctx context.Context) error {
	for _, p := range c.peers {
		if err := p.tx.Flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

// drift returns the clock drift allowance for ttl (redis.io reference
// implementations: TTL x driftFactor + 2 ms).
func (c *Client) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*c.cfg.driftFactor) + driftConstant
}

// validity returns how long a lock granted by a round that started at
// start with ttl stays valid from now: TTL - elapsed - drift (redis.io
// distlock spec, step 3).
func (c *Client) validity(start time.Time, ttl time.Duration) time.Duration {
	return ttl - time.Since(start) - c.drift(ttl)
}

// CheckTTL returns the error that Acquire, TryAcquire, Do and Extend of
// this Client return for ttl before any I/O, or nil: a TTL that leaves
// no more than the minimum validity (WithMinValidity) after the clock
// drift allowance (below 5 ms with the defaults; the error names the
// shortest accepted and the shortest that a round taking the whole node
// timeout leaves valid, 209 ms with the defaults), or one above a
// feature's limit (the restart gate, WithRestartGating). The error
// matches ErrInvalidArgument and names the limit. Packages built on a Client (scheduler, elector)
// call it when they are configured, so that a TTL every call would reject
// is reported once.
// No I/O; safe for concurrent use.
func (c *Client) CheckTTL(ttl time.Duration) error {
	if p := c.ttlProblem(ttl); p != "" {
		return invalidf("%s", p)
	}
	return nil
}

// ttlProblem says what is wrong with ttl for CheckTTL, or "": the checks
// apply to ttl rounded down to whole milliseconds, as the nodes get it.
func (c *Client) ttlProblem(ttl time.Duration) string {
	ms := ttl.Truncate(time.Millisecond)
	switch {
	case ttl < time.Millisecond:
		least, ok := c.shortestTTL(0)
		if !ok {
			least = time.Millisecond
		}
		return fmt.Sprintf("TTL %v is below the minimum %v", ttl, least)
	case c.tooShort(ms):
		msg := fmt.Sprintf("TTL %v is too short: after the clock drift allowance of %v, less than the minimum validity (%g%% of the TTL, WithMinValidity) would remain",
			ttl, c.drift(ttl), c.cfg.minValidity*100)
		if least, ok := c.shortestTTL(0); ok {
			msg += fmt.Sprintf("; the shortest TTL accepted is %v", least)
			if roomy, ok := c.shortestTTL(c.cfg.nodeTimeout); ok {
				msg += fmt.Sprintf(", but a round uses up part of it: at least %v keeps the minimum validity even when a round takes the whole %v node timeout",
					roomy, c.cfg.nodeTimeout)
			}
		}
		return msg
	}
	for _, check := range ttlChecks {
		if p := check(&c.cfg, ttl); p != "" {
			return p
		}
	}
	return ""
}

// tooShort reports whether ttl leaves no more than the minimum validity
// after the drift allowance.
func (c *Client) tooShort(ttl time.Duration) bool {
	return ttl-c.drift(ttl) <= time.Duration(float64(ttl)*c.cfg.minValidity)
}

// shortestTTL returns the shortest whole-millisecond TTL that is not too
// short once a round has taken elapsed of it (0: the shortest accepted),
// for the errors about one that is; false when none up to an hour is.
func (c *Client) shortestTTL(elapsed time.Duration) (time.Duration, bool) {
	rest := 1 - c.cfg.driftFactor - c.cfg.minValidity // of the TTL, left after the factors
	if rest <= 0 {
		return 0, false
	}
	ttl := max(time.Duration(float64(driftConstant+elapsed)/rest).Truncate(time.Millisecond), time.Millisecond)
	for ; ttl <= time.Hour; ttl += time.Millisecond {
		if ttl-elapsed-c.drift(ttl) > time.Duration(float64(ttl)*c.cfg.minValidity) {
			return ttl, true
		}
	}
	return 0, false
}

// HolderMetadata returns the metadata (WithMetadata) of the lock that
// holds resource on a quorum of nodes, from one parallel round of reads
// bounded by the node timeout; held is false when no single lock holds it
// on a quorum (free, expiring, or contested). A lock without metadata gives
// "" and true.
//
// Errors: a *QuorumError matching ErrUnavailable when the nodes that failed
// leave the answer unknown: counted as holding it, they would complete a
// quorum for the lock that most answering nodes hold (or, with none, they
// are a quorum themselves); ErrInvalidArgument for an empty resource;
// ErrClosed after Close.
// Safe for concurrent use.
func (c *Client) HolderMetadata(ctx context.Context, resource string) (metadata string, held bool, err error) {
	if err := c.checkResources([]string{resource}); err != nil {
		return "", false, err
	}
	if c.closed.Load() {
		return "", false, wrapf([]error{ErrClosed}, "holder of %s unknown: the client is closed", quoteName(resource))
	}
	rs := c.read(ctx, call{op: "holder", keys: []string{c.cfg.keyPrefix + resource},
		args: []any{"get", c.cfg.keyPrefix + resource}, parse: parseGet})
	votes, best := map[string]int{}, 0
	for _, r := range rs {
		if r.Outcome != OutcomeOK || r.value == "" {
			continue
		}
		v := asWritten(r.value) // the same on every node (keys.go)
		if votes[v]++; votes[v] >= c.quorum {
			_, md, _ := splitValue(v)
			return md, true, nil
		}
		best = max(best, votes[v])
	}
	if best+failures(rs) >= c.quorum {
		return "", false, newQuorumError("holder", []string{resource}, c.quorum, rs, true)
	}
	return "", false, nil
}

// Holder returns HolderMetadata(ctx, resource).
//
// Deprecated: use HolderMetadata; Holder will be removed in the next
// release.
func (c *Client) Holder(ctx context.Context, resource string) (metadata string, held bool, err error) {
	return c.HolderMetadata(ctx, resource)
}

// parseGet reads a GET reply: OK, with the value if this package wrote
// it; nil (no key) is OK without a value; any other reply is a faulty
// node's (badReply).
func parseGet(cmd *redis.Cmd) NodeResult {
	v, ok := cmd.Val().(string)
	if !ok && cmd.Val() != nil {
		return badReply("GET", cmd.Val())
	}
	if _, _, ok := splitValue(v); !ok {
		v = ""
	}
	return NodeResult{Outcome: OutcomeOK, value: v}
}
