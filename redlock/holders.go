package redlock

import (
	"context"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Holding is what a quorum of nodes says of one resource (Client.Holders).
type Holding struct {
	// Held reports whether one lock holds the resource on a quorum of
	// the nodes.
	Held bool
	// Metadata is that lock's metadata (WithMetadata) when Held, else "".
	Metadata string
	// TTL is, when Held, how long the lock stays on a quorum of the nodes
	// unless it is released or extended: the quorum-th longest remaining
	// TTL among the nodes that hold it (whole milliseconds); else 0.
	TTL time.Duration
	// Unknown reports, when not Held, that the nodes that failed leave
	// the answer unknown: counted as holding it, they would complete a
	// quorum for the lock that most answering nodes hold (as
	// HolderMetadata's error says).
	Unknown bool
}

// holdersWait is the shortest wait of Holders for each node.
const holdersWait = 2 * time.Second

// Holders returns, for each of resources in order, what HolderMetadata
// returns for it, with the lock's remaining TTL, from one round with one
// script per node whatever the number of resources: a status page reads
// the holders of all its locks at once. It waits for every node, as
// HolderMetadata does, at most the node timeout or holdersWait (2 s),
// whichever is longer: its reply grows with the number of resources.
//
// Errors: ErrInvalidArgument for no resources, an empty one, a duplicate
// or one with a NUL byte (no I/O then); ErrClosed after Close; a
// *QuorumError matching ErrUnavailable (op "holder") when fewer than a
// quorum of nodes answered, returned with what the nodes that answered
// say (Unknown set where that is not enough). Safe for concurrent use.
func (c *Client) Holders(ctx context.Context, resources []string) ([]Holding, error) {
	if err := c.checkResources(resources); err != nil {
		return nil, err
	}
	if c.closed.Load() {
		return nil, wrapf([]error{ErrClosed}, "holders of %s unknown: the client is closed", quoteNames(resources))
	}
	keys := make([]string, len(resources))
	for i, r := range resources {
		keys[i] = c.cfg.keyPrefix + r
	}
	rs := c.read(ctx, call{op: "holder", timeout: max(c.cfg.nodeTimeout, holdersWait), script: holdersScript, keys: keys,
		parse: parseHolders(len(keys))})
	out := make([]Holding, len(resources))
	failed := failures(rs)
	for i := range resources {
		votes := map[string][]time.Duration{} // by value: the TTLs of the nodes holding it
		best := 0
		for _, r := range rs {
			if r.Outcome != OutcomeOK {
				continue
			}
			v, _ := r.reply[2*i].(string)
			if _, _, ok := splitValue(v); !ok {
				continue
			}
			v = asWritten(v) // the same on every node (keys.go)
			ttl, _ := r.reply[2*i+1].(int64)
			votes[v] = append(votes[v], time.Duration(max(ttl, 0))*time.Millisecond)
			best = max(best, len(votes[v]))
		}
		for v, ttls := range votes {
			if len(ttls) >= c.quorum {
				_, md, _ := splitValue(v)
				slices.Sort(ttls)
				out[i] = Holding{Held: true, Metadata: md, TTL: ttls[len(ttls)-c.quorum]}
			}
		}
		if !out[i].Held && best+failed >= c.quorum {
			out[i].Unknown = true
		}
	}
	if count(rs, OutcomeOK) < c.quorum {
		return out, newQuorumError("holder", resources, c.quorum, rs, true)
	}
	return out, nil
}

// parseHolders reads the holders script's reply for n keys: n pairs of a
// value (or nil) and a PTTL; any other reply is a faulty node's
// (badReply).
func parseHolders(n int) func(*redis.Cmd) NodeResult {
	return func(cmd *redis.Cmd) NodeResult {
		v, ok := cmd.Val().([]any)
		if !ok || len(v) != 2*n {
			return badReply("holders script", cmd.Val())
		}
		for i := range n {
			_, isString := v[2*i].(string)
			_, isInt := v[2*i+1].(int64)
			if (!isString && v[2*i] != nil) || !isInt {
				return badReply("holders script", cmd.Val())
			}
		}
		return NodeResult{Outcome: OutcomeOK, reply: v}
	}
}
