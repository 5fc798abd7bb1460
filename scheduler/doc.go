// Package scheduler makes gocron v2 jobs run once per tick across a fleet of
// instances that share Redis nodes, on top of package redlock.
//
// # Usage
//
//	locks, err := redlock.New([]redis.UniversalClient{node1, node2, node3})
//	if err != nil { ... }
//	s, err := scheduler.New(locks) // a gocron.Scheduler with the Locker installed
//	if err != nil { ... }
//	_, err = s.NewJob(
//		gocron.CronJob("*/10 * * * * *", true),
//		gocron.NewTask(func(ctx context.Context) error {
//			ctx = s.RunContext(ctx) // first: cancelled if the run's lock is lost
//			tick, _ := scheduler.TickFromContext(ctx)
//			return report(ctx, tick) // runs on one instance per tick
//		}),
//		gocron.WithName("report"), // required: the lock's name on every instance
//	)
//	s.Start()
//	defer s.Shutdown() // then locks.Close, then the go-redis clients
//
// Instances other than the one that runs a tick skip it: gocron's
// AfterLockError listener gets ErrHeldElsewhere (normal), ErrStopped
// (shutdown: normal) or an error worth an alert (redlock.ErrUnavailable,
// ErrDuplicateInstance, ErrUnstableName).
//
// Two ways in:
//
//   - New returns a *Scheduler: a gocron.Scheduler with the Locker
//     installed, that also rejects unstable or duplicate job names and
//     anchors duration jobs to a wall-clock grid. Start here.
//   - NewLocker returns a gocron.Locker for an existing scheduler
//     (gocron.WithDistributedLocker). Pass it the scheduler's clock
//     (WithClock), name every job (gocron.WithName), and anchor duration
//     jobs yourself (gocron.WithStartAt(gocron.WithStartDateTimePast(
//     time.Now().Truncate(d)))).
//
// # Exactly once per tick
//
// gocron asks the Locker before each run (Locker.Lock with the job's name).
// Lock identifies the tick the run serves (Locker.Tick: the instance's local
// time on the job's grid, so clock skew between instances does not change
// it), then takes, in one quorum round (one script per node):
//
//   - a run lock on the job, extended every TTL/3 while the job runs
//     (WithTTL, default 10 s) and released by Unlock: no other instance
//     starts the job while a long run goes on;
//   - with it, a tick record (redlock.WithRecord), kept for twice the clock
//     tolerance (WithClockTolerance, default 1 s) plus the job's Lock bound
//     (WithLockTimeout) and never released: an
//     instance whose clock lags, or whose timer fires late, finds the tick
//     taken. Releasing the lock at the end of the run, as most lockers do,
//     lets such an instance run the same tick again when the job is fast
//     (gocron issue #841).
//
// A busy job is a skip, not a wait: Lock returns ErrHeldElsewhere at once.
// When Redis nodes fail, Lock returns an error matching
// redlock.ErrUnavailable (with the *redlock.QuorumError), so an
// AfterLockError listener can tell the two apart; a Lock cut short because
// gocron stopped the job (Shutdown, RemoveJob, Update) returns ErrStopped.
// Misconfigurations are errors too: ErrUnstableName for a job without a
// stable name, ErrDuplicateInstance when two live instances share an
// instance ID; clocks further apart than the tolerance are warned about
// (WithLogger) and counted (schedlock.scheduler.warnings).
//
// A tick whose run has started is never given back, even when the run is
// interrupted: at most once per tick, and an interrupted run is not re-run.
//
// # Lost locks
//
// gocron hands the same context to Lock and to a task whose first parameter
// is context.Context, and lets the locker neither cancel nor replace it. Call
// RunContext with that ctx first thing in the task: the returned context is
// cancelled, with a cause matching redlock.ErrLockLost, before the run
// lock's validity ends if the lock cannot be extended (a majority of nodes
// unreachable), and the loss is logged and passed to WithLostHandler.
//
// # Leader election instead
//
// To run every job on one leader rather than locking each run, use package
// elector with gocron.WithDistributedElector; gocron then consults no
// locker.
//
// docs/scheduling.md states the guarantee, its limits and how to choose the
// TTL and the tolerance.
package scheduler
