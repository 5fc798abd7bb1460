package redlock

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Match them with errors.Is; the errors returned by this
// package wrap them, often together with a *QuorumError (errors.As) and, when
// a context ended, the context's cause.
var (
	// ErrNotAcquired matches every failed Acquire, TryAcquire and Do
	// acquisition: the resources are held by another owner, too few nodes
	// answered, the grant left too little validity, or ctx ended (then the
	// error also matches ctx's cause, e.g. context.Canceled).
	ErrNotAcquired = errors.New("redlock: not acquired")

	// ErrLockLost matches Extend and Release of a lock that is no longer
	// held: its local validity deadline (Lock.Until) has passed, too many
	// nodes report that the key no longer holds this lock's value for a
	// quorum to remain, or the lock was already released. It is also the
	// cause of the context that Do cancels when the lock is lost.
	ErrLockLost = errors.New("redlock: lock lost")

	// ErrUnavailable matches a round in which so many nodes failed (error,
	// per-node timeout, or restart gate) that the outcome on a quorum is unknown: "Redis is
	// down" rather than "someone else holds the lock". A failed acquisition
	// can match both ErrNotAcquired and ErrUnavailable. An Extend that fails
	// this way leaves the lock valid until its unchanged Until().
	ErrUnavailable = errors.New("redlock: quorum unavailable")

	// ErrInvalidArgument matches errors about bad configuration or input:
	// no nodes, a nil or repeated node, a drift factor out of range, a TTL
	// below 1 ms, an empty or repeated resource name, a nil *Lock.
	ErrInvalidArgument = errors.New("redlock: invalid argument")
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// Outcome is what one node answered in one quorum round.
type Outcome int

const (
	// OutcomeOK: the node granted the lock (acquire), confirmed ownership
	// and refreshed the TTL (extend), or deleted every key of the lock
	// (release).
	OutcomeOK Outcome = iota
	// OutcomeHeld: the node answered, and a key is held by another owner
	// (acquire) or no longer holds this lock's value (extend, release).
	OutcomeHeld
	// OutcomeError: the node answered with an error, or the connection
	// failed.
	OutcomeError
	// OutcomeTimeout: the node did not answer within the per-node timeout
	// (WithNodeTimeout), or the caller's context ended first.
	OutcomeTimeout
	// OutcomeGated: the node refused to vote because it is within its
	// restart gate (WithRestartGating): it lost its data recently and may
	// have granted locks it no longer remembers. Counts as a failure for
	// ErrUnavailable.
	OutcomeGated
	// OutcomePending: the round was decided (quorum reached, or made
	// impossible by the other answers) before this node answered. Its answer
	// is handled when it arrives: a late grant of a failed acquisition is
	// deleted.
	OutcomePending
)

// String returns "ok", "held", "error", "timeout", "gated" or "pending".
func (o Outcome) String() string {
	switch o {
	case OutcomeOK:
		return "ok"
	case OutcomeHeld:
		return "held"
	case OutcomeError:
		return "error"
	case OutcomeTimeout:
		return "timeout"
	case OutcomeGated:
		return "gated"
	case OutcomePending:
		return "pending"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// NodeResult is one node's part in a quorum round.
type NodeResult struct {
	// Node is the node's index in the slice given to New.
	Node int
	// Addr is the node's address ("host:port") when the client exposes one,
	// else "node<i>".
	Addr string
	// Outcome is what the node answered.
	Outcome Outcome
	// Err is the node's error for OutcomeError and OutcomeTimeout, else nil.
	Err error
	// Latency is the time from the round's start to the node's answer; for
	// OutcomeTimeout it is the time the round waited.
	Latency time.Duration
	// Holder is, for OutcomeHeld in an acquire round, the metadata that the
	// other holder stored with its lock (WithMetadata); "" otherwise. The
	// holder's owner token is never exposed.
	Holder string

	token    uint64 // fencing token proposed by the node (acquire with fencing)
	canceled bool   // the caller's ctx ended the call: not a node failure
	value    string // the key's value (Holder only; never leaves the package)

	traceparent string        // acquire: the refusing holder's trace context
	reentered   bool          // acquire: a reentrant hold whose token was reused
	fresh       uint64        // acquire, reentered: the token a new hold would get
	expires     time.Duration // acquire, OutcomeHeld: the holder's key's TTL left
}

// QuorumError describes a quorum round that did not succeed, with every
// node's outcome, so that callers can tell "held by another owner" from
// "Redis unavailable". Reach it with errors.As. It unwraps to the sentinels
// that apply: ErrNotAcquired for acquisitions, ErrLockLost when the lock is
// certainly gone, ErrUnavailable when too many nodes failed.
type QuorumError struct {
	// Op is "acquire", "fence" (recording the fencing token, WithFencing),
	// "check" (confirming a fenced re-entry's token, WithOwner),
	// "extend", "release" or "holder" (Client.Holder).
	Op string
	// Resources are the lock's resource names (without key prefix).
	Resources []string
	// Quorum is the number of OK answers needed: N/2+1 of the configured N.
	Quorum int
	// Nodes holds one entry per configured node, in the order given to New.
	Nodes []NodeResult
	// Validity is set when a quorum granted the lock but the validity left
	// (TTL - elapsed - drift) was below the minimum (WithMinValidity), so the
	// grant was refused and released. Zero otherwise.
	Validity time.Duration

	sentinels []error
}

// Count returns how many nodes had outcome o in this round.
func (e *QuorumError) Count(o Outcome) int {
	n := 0
	for _, r := range e.Nodes {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// Holder returns the metadata (WithMetadata) of the lock that refused this
// acquire round on a quorum of nodes: the resource is really held, by that
// holder. ok is false when no single holder refused on a quorum (the nodes
// were split between contenders, or too few answered), or for other rounds.
func (e *QuorumError) Holder() (metadata string, ok bool) {
	if e.Op != "acquire" {
		return "", false
	}
	votes := map[string]int{}
	for _, r := range e.Nodes {
		if r.Outcome != OutcomeHeld {
			continue
		}
		if votes[r.Holder]++; votes[r.Holder] >= e.Quorum {
			return r.Holder, true
		}
	}
	return "", false
}

// Error reports the counts and every node that did not answer OK.
func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "redlock: %s %q: %d of %d nodes ok, quorum %d", e.Op, e.Resources,
		e.Count(OutcomeOK), len(e.Nodes), e.Quorum)
	if e.Validity != 0 {
		fmt.Fprintf(&b, ", refused: validity %v left is below the minimum", e.Validity)
	}
	for _, r := range e.Nodes {
		if r.Outcome == OutcomeOK {
			continue
		}
		fmt.Fprintf(&b, "; node %d (%s) %s", r.Node, r.Addr, r.Outcome)
		if r.Err != nil {
			fmt.Fprintf(&b, ": %v", r.Err)
		}
	}
	return b.String()
}

// Unwrap returns the sentinels this error matches.
func (e *QuorumError) Unwrap() []error { return e.sentinels }

// holderExpires returns the shortest TTL left that a refusing node
// reported for the holder's key (acquire rounds), or 0.
func (e *QuorumError) holderExpires() time.Duration {
	var d time.Duration
	for _, r := range e.Nodes {
		if r.Outcome == OutcomeHeld && r.expires > 0 && (d == 0 || r.expires < d) {
			d = r.expires
		}
	}
	return d
}
