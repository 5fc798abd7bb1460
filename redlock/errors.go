package redlock

import (
	"errors"
	"fmt"
	"slices"
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
	// held: its validity (Lock.Until) has passed, too many nodes report that
	// the key no longer holds this lock for a quorum to remain, or the lock
	// was already released. It is also the cause of the context that Do
	// and Keep cancel when the lock is lost.
	ErrLockLost = errors.New("redlock: lock lost")

	// ErrUnavailable matches a round in which so many nodes failed (an
	// error, no answer within the node timeout, or a restart gate) that
	// the outcome on a quorum is unknown: "Redis is down" rather than
	// "someone else holds the lock". Calls that the caller's own ctx cut
	// short are not failures of their nodes. A failed acquisition can match
	// both ErrNotAcquired and ErrUnavailable. An Extend that fails this way
	// leaves the lock valid until its unchanged Until().
	ErrUnavailable = errors.New("redlock: quorum unavailable")

	// ErrInvalidArgument matches errors about bad configuration or input,
	// reported before any I/O: no nodes, a nil or repeated node, an option
	// out of range, a TTL too short or above the restart gate, an empty,
	// repeated or NUL-containing resource name, a nil *Lock.
	ErrInvalidArgument = errors.New("redlock: invalid argument")

	// ErrClosed matches calls made on a Client after Close.
	ErrClosed = errors.New("redlock: client closed")
)

// invalidf returns an error matching ErrInvalidArgument that reads
// "redlock: invalid argument: <message>".
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// Outcome is what one node answered in one quorum round.
type Outcome int

const (
	// OutcomeOK: the node granted the lock (acquire), confirmed ownership
	// and set the TTL (extend), or deleted every key of the lock (release).
	OutcomeOK Outcome = iota
	// OutcomeHeld: the node answered, and a key is held by another owner
	// (acquire) or no longer holds this lock (extend, release).
	OutcomeHeld
	// OutcomeError: the node answered with an error, or the connection
	// failed.
	OutcomeError
	// OutcomeTimeout: the node did not answer within the node timeout
	// (WithNodeTimeout), or the caller's ctx ended first (then Err is
	// ctx's cause, and the node does not count as failed).
	OutcomeTimeout
	// OutcomeGated: the node refused to vote because it lost its data
	// recently and is within its restart gate (WithRestartGating). It
	// counts as a failure for ErrUnavailable; it votes again once the gate
	// has passed.
	OutcomeGated
	// OutcomePending: the round was decided by the other nodes' answers
	// (a quorum, or so many refusals that a quorum was impossible) before
	// this node answered. Nothing is wrong with the node; a grant it makes
	// of a failed acquisition is deleted by the undo that follows it.
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
	// OutcomeTimeout and OutcomePending, the time the round waited.
	Latency time.Duration
	// Holder is, for OutcomeHeld in an acquire round, the metadata that the
	// other holder stored with its lock (WithMetadata); "" otherwise. The
	// holder's owner token is never exposed.
	Holder string
	// Resource is, for OutcomeHeld in an acquire round, the resource whose
	// key refused: one of the lock's, or its record (WithRecord); ""
	// otherwise.
	Resource string
	// HolderTTL is, for OutcomeHeld in an acquire round, how long the
	// refusing key had left to live (whole milliseconds; 0 when unknown).
	HolderTTL time.Duration

	canceled    bool   // the caller's ctx ended the call: not a node failure
	traceparent string // acquire, OutcomeHeld: the holder's trace context
	reply       []any  // the script's reply, for the layers (fencing)
	value       string // holder round: the key's value (never leaves the package)
}

// failed reports whether r counts as a failure of its node.
func (r NodeResult) failed() bool {
	switch r.Outcome {
	case OutcomeError, OutcomeTimeout, OutcomeGated:
		return !r.canceled
	}
	return false
}

// QuorumError describes a quorum round that did not succeed, with every
// node's outcome, so that callers can tell "held by another owner" from
// "Redis unavailable". Reach it with errors.As. It unwraps to the sentinels
// that apply: ErrNotAcquired for acquisitions, ErrLockLost when the lock is
// certainly gone, ErrUnavailable when too many nodes failed.
type QuorumError struct {
	// Op is the round: "acquire", "fence" (recording a fencing token),
	// "check" (confirming a reentrant hold's token), "extend", "release"
	// or "holder" (Client.HolderMetadata).
	Op string
	// Resources are the lock's resource names (without key prefix).
	Resources []string
	// Quorum is the number of OK answers needed: N/2+1 of the configured N.
	Quorum int
	// Nodes holds one entry per configured node, in the order given to New.
	Nodes []NodeResult

	validity  time.Duration // a quorum granted, with less validity than the minimum
	sentinels []error
}

// newQuorumError builds the error of a failed round: it matches the given
// sentinels, and ErrUnavailable when node failures alone make a quorum
// impossible, or always with unknown (failed nodes left the outcome
// unknown). The results are copied.
func newQuorumError(op string, resources []string, quorum int, rs []NodeResult, unknown bool, sentinels ...error) *QuorumError {
	failed, closed := 0, false
	for _, r := range rs {
		if r.failed() {
			failed++
		}
		closed = closed || r.Err == ErrClosed
	}
	switch {
	case closed: // Close refused the calls: not the nodes' failure
		sentinels = append(sentinels, ErrClosed)
	case unknown || failed > len(rs)-quorum:
		sentinels = append(sentinels, ErrUnavailable)
	}
	nodes := slices.Clone(rs)
	for i := range nodes {
		nodes[i].reply = nil
	}
	return &QuorumError{Op: op, Resources: resources, Quorum: quorum, Nodes: nodes, sentinels: sentinels}
}

// Count returns how many nodes had outcome o in this round.
func (e *QuorumError) Count(o Outcome) int { return count(e.Nodes, o) }

// HolderMetadata returns the metadata (WithMetadata) of the lock that
// refused this acquire round on a quorum of nodes: the resource is really
// held, by that holder. ok is false when no single holder refused on a
// quorum (the nodes were split between contenders, or too few answered),
// and for rounds other than acquire.
func (e *QuorumError) HolderMetadata() (metadata string, ok bool) {
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

// Holder returns HolderMetadata().
//
// Deprecated: use HolderMetadata; Holder will be removed in the next
// release.
func (e *QuorumError) Holder() (metadata string, ok bool) { return e.HolderMetadata() }

// Error reads, for example, `redlock: acquire ["a"]: 1 of 3 nodes granted,
// 2 needed; node 1 (10.0.0.2:6379) held by another owner; node 2
// (10.0.0.3:6379) no answer within the node timeout`.
func (e *QuorumError) Error() string {
	var b strings.Builder
	verb := map[string]string{"acquire": "granted", "fence": "recorded the fencing token", "check": "confirmed the token",
		"extend": "extended", "release": "released", "holder": "answered"}[e.Op]
	if verb == "" {
		verb = "ok"
	}
	fmt.Fprintf(&b, "redlock: %s %q: %d of %d nodes %s, %d needed", e.Op, e.Resources, e.Count(OutcomeOK), len(e.Nodes), verb, e.Quorum)
	if e.validity != 0 {
		fmt.Fprintf(&b, "; refused: the grant left %v of validity, below the minimum (raise the TTL or WithMinValidity)",
			e.validity.Round(time.Microsecond))
	}
	for _, r := range e.Nodes {
		if r.Outcome == OutcomeOK {
			continue
		}
		fmt.Fprintf(&b, "; node %d (%s) %s", r.Node, r.Addr, describe(e.Op, r))
	}
	return b.String()
}

// describe says in words what node result r means in a round of op.
func describe(op string, r NodeResult) string {
	switch r.Outcome {
	case OutcomeHeld:
		if op == "acquire" {
			if r.Holder != "" {
				return fmt.Sprintf("held by %q", r.Holder)
			}
			return "held by another owner"
		}
		if op == "fence" || op == "check" {
			return "has a newer fencing token"
		}
		return "no longer holds this lock"
	case OutcomeError:
		return fmt.Sprintf("failed: %v", r.Err)
	case OutcomeTimeout:
		if r.canceled {
			return fmt.Sprintf("not awaited: %v", r.Err)
		}
		return fmt.Sprintf("no answer: %v", r.Err)
	case OutcomeGated:
		return "in its restart gate (it lost its data recently)"
	case OutcomePending:
		return "not awaited (the other nodes decided the round)"
	}
	return r.Outcome.String()
}

// Unwrap returns the sentinels this error matches.
func (e *QuorumError) Unwrap() []error { return e.sentinels }

// count returns the number of results with outcome o.
func count(rs []NodeResult, o Outcome) int {
	n := 0
	for _, r := range rs {
		if r.Outcome == o {
			n++
		}
	}
	return n
}
