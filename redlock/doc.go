// Package redlock is a distributed lock over N independent Redis nodes:
// the Redlock algorithm of redis.io ("Distributed Locks with Redis"), with
// owner-checked extension and release, retries, multi-resource and
// reentrant locks, fencing tokens, restart gating and automatic extension
// while work runs.
//
// # Usage
//
//	locks, err := redlock.New([]redis.UniversalClient{node1, node2, node3})
//	if err != nil { ... }
//	defer locks.Close(context.Background())
//
//	l, err := locks.Acquire(ctx, []string{"invoice:42"}, 10*time.Second)
//	if err != nil { ... } // ErrNotAcquired; ErrUnavailable when nodes are down
//	defer l.Release(ctx)
//	// work until l.Until(); l.Extend(ctx, ttl) to go on
//
//	// or: hold the lock, extended in the background, while fn runs
//	err = locks.Do(ctx, []string{"report"}, 10*time.Second, func(ctx context.Context) error { ... })
//
// # Guarantees
//
// Between Acquire returning a Lock and Until(), no other Client that uses the
// same nodes and follows this algorithm holds an overlapping lock, provided
// that: a majority of nodes keep their keys (a node that restarts empty must
// stay out of quorums for the maximum TTL: the page's "delayed restarts",
// WithRestartGating), the nodes' clocks advance at about the same rate
// (drift is bounded by the drift allowance), and this process is not
// paused past Until without noticing. Redlock cannot detect a process pause
// (GC, a stopped VM) between a check of Until and the guarded write: for
// work where that matters, have the protected resource reject stale writers
// (WithFencing). A lock expires on every node at most its longest TTL (of
// the acquire and the extends) after its last acquire or extend (for a
// reentrant owner, of any of its holds), so a holder that dies frees its
// resources within that time: the nodes never lower a key's TTL, so an
// Extend to a shorter TTL moves Until earlier but not the keys' expiry.
// Each extension also sets the lock's keys again where they are missing
// (not on a node within its restart gate), so a lock granted by a bare
// quorum regains the fault tolerance of a fresh one.
//
// # Errors
//
// Failed acquisitions match ErrNotAcquired; a lock that is gone matches
// ErrLockLost; rounds that failed because nodes were down match
// ErrUnavailable (never because the caller's ctx ended). Release returns
// nil only when a quorum deleted the keys and no node answered that it
// could not run the release; otherwise its error names the nodes that keep
// the keys and how long they may stay. A reply that Redis does not send is
// the node's error, never a grant. A *QuorumError
// (errors.As) carries every node's outcome. Bad input matches
// ErrInvalidArgument and is reported before any I/O.
//
// # Concurrency and lifecycle
//
// A Client and a Lock are safe for concurrent use. New starts nothing; the
// Client starts one sender goroutine per node at its first command, and
// release-notice subscribers while an Acquire waits. Close stops them and
// returns once they have ended; close the go-redis clients after it.
//
// # How it works
//
// docs/design.md describes the algorithm as implemented, step by step
// against the redis.io page, and the package's structure: acquire.go (the
// steps), round.go (one quorum round), lock.go (a held lock), replies.go
// (reading the nodes' replies), layer.go (the seam the features plug
// into), the layers fencing.go, reentrant.go, gating.go, wake.go,
// record.go, highwater.go and releaselog.go, each with its Lua fragment,
// quorumfirst.go (an asking order, in no script), and internal/node (the
// transport, which batches concurrent commands per node).
package redlock
