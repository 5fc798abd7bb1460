// Package elector elects one leader among candidates that share Redis
// nodes, on top of package redlock, for singleton workers (a queue
// consumer, a reconciler, the one instance that runs all cron jobs).
//
// # Usage
//
//	e, err := elector.New(locks, "billing-worker",
//		elector.OnStartedLeading(func(ctx context.Context) {
//			term, _ := elector.TermFromContext(ctx) // fence writes with it
//			consume(ctx, term)                      // ctx ends with the leadership
//		}))
//	if err != nil { ... }
//	err = e.Run(ctx) // campaigns until ctx ends, then resigns and returns
//
// Or give e to gocron.WithDistributedElector, so that only the leader runs
// jobs. IsLeader and Leader answer at any time.
//
// # How it works
//
// A candidate's Run campaigns by taking a redlock lease on the election's
// key, with its identity stored beside the owner token and a fencing token
// as its term. The leader renews the lease every renew interval; if renewal
// cannot reach a quorum, the context given to OnStartedLeading is cancelled
// and IsLeader starts failing before the lease's local validity deadline —
// even while a renewal still waits for frozen nodes — and the candidate
// campaigns again. When Run's context ends, the leader resigns (deletes the
// lease), so the next candidate leads within its retry period instead of
// after the TTL.
//
// As its term starts, a leader also records its identity and term, and the
// nodes' time, in a hash at the key prefix itself; Leaderships reads the
// leader, term and start of term of many elections in one round, for
// status pages (scheduler.Status with scheduler.WithElections).
//
// # Timing
//
//	lease TTL (10 s)  >=  2 x renew interval (TTL/3)  ;  retry period (1 s) < TTL
//
// A crashed leader blocks the election for at most the TTL; another
// candidate then leads within TTL + retry period. A leader whose nodes hang
// stops believing it leads at the latest at its validity deadline minus
// TTL/10 (validity = TTL - elapsed - drift, redis.io distlock spec).
//
// # Guarantees and limits
//
// At most one candidate believes it leads at any instant of a shared
// monotonic clock, under the assumptions of redlock (a majority of nodes
// keeps its keys; clocks advance at about the same rate; no process pause
// between a check of IsLeader and the guarded action). A paused leader can
// act after its lease expired: fence its writes with the term
// (Elector.Term, TermFromContext), which strictly increases with every new
// leadership. Term numbers come from the redlock fencing counters of the
// election's key, kept for redlock's fencing retention (7 days by default)
// after the last leadership.
//
// # With gocron
//
// An *Elector is a gocron.Elector: with gocron.WithDistributedElector(e)
// only the leader runs jobs. IsLeader is local and O(1); gocron calls it on
// every run. Scheduled times that fall while no candidate leads (after a
// crash, for up to the TTL) are skipped.
package elector
