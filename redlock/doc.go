// Package redlock implements the Redlock algorithm of redis.io ("Distributed
// Locks with Redis") over N independent Redis masters, with owner-checked
// extension and release, retries with jittered backoff, multi-resource locks
// and automatic extension while work runs (Client.Do).
//
// # The algorithm as implemented
//
// For each attempt (redis.io distlock spec, "The Redlock algorithm"):
//
//  1. Take the start time T1 from the monotonic clock, before the first send.
//  2. Send one Lua script to all N nodes in parallel. On each node it sets
//     every key of the lock to a random 128-bit value with PX ttl, all or
//     nothing, unless a key holds another value. A key that already holds
//     our value counts as ours (a retry after a lost reply never blocks
//     itself). TryAcquire of a plain one-key lock sends SET NX GET
//     instead, which does the same there (Redis 7.0 or later; older nodes
//     get the script). Each node has a per-node timeout enforced by this package
//     (WithNodeTimeout, default 100 ms), whatever the go-redis client's own
//     settings.
//  3. The round is decided as soon as its outcome is known: N/2+1 grants, or
//     so many refusals and failures that N/2+1 is impossible.
//  4. With a quorum, the validity is TTL - (now - T1) - drift, with drift =
//     TTL x driftFactor + 2 ms (default factor 0.01). The lock is held until
//     Until() = T1 + TTL - drift, if that validity is at least the minimum
//     (WithMinValidity, default half the TTL).
//  5. Otherwise the attempt is undone on every node, including the ones that
//     did not answer, with an owner-checked delete, and Acquire waits a
//     random delay (full-jitter exponential backoff, cenkalti/backoff/v4)
//     before the next attempt, or less when the holder releases (release
//     notices over pub/sub). A grant that arrives after its round was
//     decided is deleted by the goroutine that receives it once the
//     acquisition has failed or the lock was released.
//
// Extend and Release are scripts too: they check on each node that every key
// still holds this lock's value before changing anything. Extend needs a
// quorum and moves Until to its own start + TTL - drift; it is never tried
// after Until and never creates a key. Release deletes on every reachable
// node and runs even when the caller's context is cancelled; like an acquire
// round it returns once a quorum has answered, and its scripts for the other
// nodes finish in the background (Client.Wait waits for them).
//
// # Guarantees
//
// Between Acquire returning a Lock and Until(), no other Client that uses the
// same nodes and follows this algorithm holds an overlapping lock, provided
// that: a majority of nodes keep their keys (a node that restarts empty must
// stay out of quorums for the maximum TTL: the spec's "delayed restarts"),
// clocks of the nodes advance at about the same rate (drift is bounded by the
// drift allowance), and this process is not paused past Until without
// noticing. Redlock cannot detect a process pause (GC, a stopped VM) that
// happens after a check of Until and before the guarded write: for work where
// that matters, have the protected resource reject stale writers (fencing
// tokens). docs/design.md and docs/safety.md discuss each assumption.
//
// A lock expires on every node at most TTL after its last successful
// acquire or extend, so a holder that dies frees its resources within TTL.
//
// # Errors
//
// Failed acquisitions match ErrNotAcquired; a lock that is gone matches
// ErrLockLost; rounds that failed because nodes were down match
// ErrUnavailable. A *QuorumError (errors.As) carries every node's outcome.
// Bad input matches ErrInvalidArgument and is reported before any I/O.
//
// # Concurrency
//
// A Client and a Lock are safe for concurrent use. New starts nothing. Each
// node has a queue of scripts that one worker goroutine drains, sending
// what concurrent rounds queued as one pipeline; the worker is started by
// a round that finds none running and ends as soon as the queue is empty
// (for a node that never answers, once the go-redis client's read timeout
// fires: at once with ContextTimeoutEnabled). A Client of one node whose
// *redis.Client has ContextTimeoutEnabled sends a round on the idle node
// from the caller's goroutine instead (see New). A waiting Acquire subscribes
// to release notices (WithReleaseNotices): one PubSub connection and two
// goroutines per node, ended when no Acquire waits any more. A grant that
// arrives after its round was released is handled in a goroutine that ends
// once the lock's last release round has settled on every node. There is
// no Close: nothing outlives the calls that started it by more than these
// bounds, and Client.Wait waits for the scripts and cleanups still on their
// way (before closing the go-redis clients, or in a test).
package redlock
