package redlock

import (
	"context"
	_ "embed"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// Fencing (WithFencing). Each resource has a counter on every node,
// "<key>\x00fencing". The acquire script of a fenced lock proposes
// (scripts/fencing.lua), on each node that grants, a
// token above every counter of the lock's resources there and at least
// the node's clock in microseconds. After a quorum granted, fence takes
// the largest proposal and records it on the counters of a quorum (the
// fence script refuses a token that is not above a counter, so no two
// acquisitions record the same token) before the lock is handed out. Any
// later acquisition's quorum shares a node with that quorum, so its
// proposal is larger. The clock floor keeps tokens rising when that node
// has lost its counters since (a restart without persistence, behind the
// restart gate; or counters expired after WithFencingRetention), as long
// as the nodes' clocks agree within the gate's maxTTL. docs/fencing.md
// has the proof and its assumptions.
//
// A re-entry of a reentrant owner keeps the token of the hold it joins
// (noted in the holds by a note round once the hold's fence round reached
// a quorum) when no granting node has a counter above it, and a check
// round after the grants confirms that on a quorum (another owner may have
// recorded a larger one meanwhile); otherwise it is a new hold, with a new
// token.

//go:embed scripts/fencing.lua
var fencingSrc string

var fencingPart = script.Part{Name: "fencing", PerKey: 1, Reply: 3, Hooks: script.Parse(fencingSrc)}

// fencing is the layer of a fenced Lock.
type fencing struct {
	baseLayer
	c     *Client
	token uint64 // the Lock's token, once held; guarded by the Lock's mu
}

func newFencing(c *Client, cfg *lockConfig, _ []string, _ bool) (layer, error) {
	if !cfg.fencing {
		return nil, nil
	}
	return &fencing{c: c}, nil
}

func (*fencing) part() script.Part { return fencingPart }

// keys returns the counters.
func (*fencing) keys(lockKeys []string) []string { return perKey(lockKeys, fencingSuffix) }

// granted decides and records the fencing token of an attempt whose
// acquire round granted on a quorum (rs), and gives it to the Lock.
func (f *fencing) granted(ctx context.Context, a *attempt, lay *script.Layout, k call, rs []NodeResult) *QuorumError {
	c, l, n := f.c, a.l, a.l.n
	at := lay.Reply("fencing")
	counters := k.keys[lay.Key("fencing", n, 0):][:n]
	var token, largest, kept uint64
	for _, r := range rs {
		if r.Outcome == OutcomeOK {
			token = max(token, uint64(intAt(r.reply, at)))
			largest = max(largest, uint64(intAt(r.reply, at+1)))
			kept = max(kept, uint64(intAt(r.reply, at+2)))
		}
	}
	if kept > 0 && largest <= kept {
		crs := c.vote(ctx, call{op: "check", timeout: l.cfg.nodeTimeout, script: checkScript, keys: counters,
			args: []any{strconv.FormatUint(kept, 10)}, parse: parseCheck})
		switch {
		case count(crs, OutcomeOK) >= c.quorum:
			f.setToken(l, kept)
			return nil
		case count(crs, OutcomeHeld) == 0:
			return newQuorumError("check", l.resources, c.quorum, crs, false, ErrNotAcquired)
		}
		for _, r := range crs { // another owner's token passed the hold's: a new hold
			if r.Outcome == OutcomeOK || r.Outcome == OutcomeHeld {
				token = max(token, uint64(intAt(r.reply, 1))+1)
			}
		}
	}
	frs := c.vote(ctx, call{op: "fence", timeout: l.cfg.nodeTimeout, script: fenceScript, keys: counters,
		args: []any{strconv.FormatUint(token, 10), c.cfg.fencingRetention.Milliseconds()}, parse: parseInt(1)})
	if count(frs, OutcomeOK) < c.quorum {
		return newQuorumError("fence", l.resources, c.quorum, frs, false, ErrNotAcquired)
	}
	if h := lay.Key("reentrant", n, 0); h >= 0 {
		// Best effort: a node without the note gives the next re-entry
		// a new token, which is larger. The hold is the acquisition ID,
		// reentrancy's argument of the acquire.
		c.vote(ctx, call{op: "note", timeout: l.cfg.nodeTimeout, script: noteScript, keys: k.keys[h:][:n],
			args: []any{strconv.FormatUint(token, 10), k.args[lay.Arg("reentrant")]}, parse: parseInt(1)})
	}
	f.setToken(l, token)
	return nil
}

// setToken records l's token.
func (f *fencing) setToken(l *Lock, t uint64) {
	l.mu.Lock()
	f.token = t
	l.mu.Unlock()
}

// FencingToken returns the lock's fencing token: a number that strictly
// increases across successive holders of each of its resources, or 0 when
// the lock was acquired without fencing (WithFencing). One token covers all
// resources of a multi-resource lock. Pass it with every write to the
// protected resource, which must reject a token lower than the highest it
// has seen. docs/fencing.md gives the guarantee and its assumptions.
func (l *Lock) FencingToken() uint64 {
	f := layerOf[*fencing](l)
	if f == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return f.token
}

// parseCheck reads the check script's {1 or 0, largest counter}; any
// other reply is a faulty node's (badReply).
func parseCheck(cmd *redis.Cmd) NodeResult {
	v, ok := cmd.Val().([]any)
	switch {
	case !ok || len(v) != 2 || !allInts(v):
		return badReply("check script", cmd.Val())
	case intAt(v, 0) == 1:
		return NodeResult{Outcome: OutcomeOK, reply: v}
	case intAt(v, 0) == 0:
		return NodeResult{Outcome: OutcomeHeld, reply: v}
	}
	return badReply("check script", cmd.Val())
}

// WithFencing makes acquisitions return fencing tokens (Lock.FencingToken):
// numbers that strictly increase across successive holders of a resource,
// for the protected resource to reject writes that carry an older token. It
// costs one more quorum round per acquisition (fencing.go). A
// SharedOption: given to New, every acquisition of the Client is fenced;
// given to a call (Acquire, TryAcquire, Do), that call's (false turns it
// off for one call). Default off. docs/fencing.md gives the design and
// its assumptions.
func WithFencing(on bool) SharedOption {
	return sharedOption(func(l *lockConfig) { l.fencing = on })
}

// WithFencingRetention sets how long a resource's fencing counter is kept
// after its last fenced acquisition (the counter keys' TTL, refreshed by
// every fenced acquisition). Tokens also rise with the nodes' clocks, so
// they stay monotonic after a counter expired as long as those clocks do
// (docs/fencing.md). Default DefaultFencingRetention (7 days); New rejects
// values below 1 s.
func WithFencingRetention(d time.Duration) Option {
	return clientOption(func(c *config) { c.fencingRetention = d })
}

// defaultFencingRetention sets WithFencingRetention's default.
func defaultFencingRetention(cfg *config) { cfg.fencingRetention = DefaultFencingRetention }

// checkFencingRetention validates WithFencingRetention.
func checkFencingRetention(cfg *config) error {
	if cfg.fencingRetention < time.Second {
		return invalidf("fencing retention %v (WithFencingRetention) is below the minimum 1s", cfg.fencingRetention)
	}
	return nil
}
