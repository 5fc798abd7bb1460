package redlock

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Fencing (WithFencing). Each resource has a counter on every node. The
// acquire script of a fenced lock proposes, on each node that grants, a
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

// fence decides and records the fencing token of an attempt whose acquire
// round granted on a quorum (rs), and returns it.
func (c *Client) fence(ctx context.Context, l *Lock, aid string, rs []NodeResult) (uint64, *QuorumError) {
	var token, largest, kept uint64
	for _, r := range rs {
		if r.Outcome == OutcomeOK {
			token = max(token, uint64(intAt(r.reply, 1)))
			largest = max(largest, uint64(intAt(r.reply, 2)))
			kept = max(kept, uint64(intAt(r.reply, 3)))
		}
	}
	if kept > 0 && largest <= kept {
		crs := c.vote(ctx, call{op: "check", timeout: l.cfg.nodeTimeout, script: checkScript, keys: l.counterKeys(),
			args: []any{strconv.FormatUint(kept, 10)}, parse: parseCheck})
		switch {
		case count(crs, OutcomeOK) >= c.quorum:
			return kept, nil
		case count(crs, OutcomeHeld) == 0:
			return 0, newQuorumError("check", l.resources, c.quorum, crs, false, ErrNotAcquired)
		}
		for _, r := range crs { // another owner's token passed the hold's: a new hold
			if r.Outcome == OutcomeOK || r.Outcome == OutcomeHeld {
				token = max(token, uint64(intAt(r.reply, 1))+1)
			}
		}
	}
	frs := c.vote(ctx, call{op: "fence", timeout: l.cfg.nodeTimeout, script: fenceScript, keys: l.counterKeys(),
		args: []any{strconv.FormatUint(token, 10), c.cfg.fencingRetention.Milliseconds()}, parse: parseInt(1)})
	if count(frs, OutcomeOK) < c.quorum {
		return 0, newQuorumError("fence", l.resources, c.quorum, frs, false, ErrNotAcquired)
	}
	if aid != "" {
		// Best effort: a node without the note gives the next re-entry
		// a new token, which is larger.
		c.vote(ctx, call{op: "note", timeout: l.cfg.nodeTimeout, script: noteScript, keys: l.keys[l.n : 2*l.n],
			args: []any{strconv.FormatUint(token, 10), aid}, parse: parseInt(1)})
	}
	return token, nil
}

// counterKeys returns the fencing counters of the lock keys.
func counterKeys(lockKeys []string) []string {
	keys := make([]string, len(lockKeys))
	for i, k := range lockKeys {
		keys[i] = k + fencingSuffix
	}
	return keys
}

// counterKeys returns l's fencing counters (after its lock keys and holds).
func (l *Lock) counterKeys() []string {
	off := l.n
	if l.token != "" {
		off = 2 * l.n
	}
	return l.keys[off : off+l.n : off+l.n]
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

// intAt returns the integer at v[i], or 0.
func intAt(v []any, i int) int64 {
	if i >= len(v) {
		return 0
	}
	n, _ := v[i].(int64)
	return n
}
