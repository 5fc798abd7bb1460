package redlock

import (
	"context"
	"time"
)

// Flush returns once every command c has queued so far has been answered
// or dropped.
func Flush(c *Client, ctx context.Context) error { return c.flush(ctx) }

// SetWeakGrant makes q the error of a round that a quorum granted with
// too little validity left: validity, below minimum.
func SetWeakGrant(q *QuorumError, validity, minimum time.Duration) {
	q.weak, q.validity, q.minimum = true, validity, minimum
}

// Down reports whether c counts node i as down: it has not answered since
// a call of a round that waited the node timeout went unanswered.
func Down(c *Client, i int) bool { return c.peers[i].down.Load() }

// MarkDown makes c count node i as down until it answers again, as a
// round that waited the node timeout for it in vain does.
func MarkDown(c *Client, i int) { c.peers[i].down.Store(true) }

// AskedFirst returns the nodes that a round with WithQuorumFirst asks
// first for a lock whose first resource is resource, when no node is down.
func AskedFirst(c *Client, resource string) []bool {
	n := len(c.peers)
	first := make([]bool, n)
	start := int(fnv1a(c.cfg.keyPrefix+resource) % uint32(n))
	for j := range c.quorum {
		first[(start+j)%n] = true
	}
	return first
}

// FirstAsked returns the node that a round with WithHighWaterFirst asks
// first for a lock whose first resource is resource, when it is not down.
func FirstAsked(c *Client, resource string) int {
	return int(fnv1a(c.cfg.keyPrefix+resource) % uint32(len(c.peers)))
}
