// Package scheduler makes each scheduled time of a gocron v2 job run once
// across a fleet of instances that share Redis nodes, on top of package
// redlock, and keeps a record of who ran what.
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
//			at, _ := scheduler.TickFromContext(ctx) // the scheduled time
//			return report(ctx, at) // runs on one instance per scheduled time
//		}),
//		gocron.WithName("report"), // required: the lock's name on every instance
//	)
//	s.Start()
//	defer s.Shutdown() // then locks.Close, then the go-redis clients
//
// Instances other than the one that runs a scheduled time skip it: gocron's
// AfterLockError listener gets ErrHeldElsewhere (normal), ErrStopped
// (shutdown: normal), ErrPaused (a job paused across the fleet), ErrLate
// (a run that came too late: recorded) or an error worth an alert
// (redlock.ErrUnavailable, redlock.ErrMisconfigured, ErrDuplicateInstance,
// ErrUnstableName). Scheduler.History reads the run record.
//
// Two ways in:
//
//   - New returns a *Scheduler: a gocron.Scheduler with the Locker
//     installed, that reads each job's schedule, rejects unstable or
//     duplicate job names and schedules without shared times, anchors
//     duration jobs to a wall-clock grid, learns each run's outcome and
//     makes RunNow a manual run. Start here.
//   - NewLocker returns a gocron.Locker for an existing scheduler
//     (gocron.WithDistributedLocker). Give it the scheduler (Locker.Follow),
//     its clock (WithClock) and location (WithLocation), name every job
//     (gocron.WithName), and anchor duration jobs yourself
//     (gocron.WithStartAt(gocron.WithStartDateTimePast(
//     time.Now().Truncate(d)))). docs/scheduling.md says what differs.
//
// # Each scheduled time once
//
// gocron asks the Locker before each run (Locker.Lock with the job's name).
// Lock finds the scheduled time the run serves: the latest one of the
// job's schedule at or before the instance's clock. A scheduled time this
// instance already served, or one older than the misfire threshold
// (WithMisfireThreshold, 1 min), makes the run late (ErrLate): a queued
// run never takes another scheduled time. Then Lock takes, in one quorum
// round (one script per node, asking first the node the job's key
// chooses: an instance refused there by the record below asks no other;
// redlock.WithHighWaterFirst):
//
//   - a run lock on the job, extended every TTL/3 while the job runs
//     (WithTTL, default 10 s) and released by Unlock: no other instance
//     starts the job while a run goes on;
//   - with it, the job's record of the latest scheduled time taken
//     (redlock.WithHighWater), raised to this one and never lowered: an
//     instance whose clock lags, or whose run comes late, finds its
//     scheduled time taken, or a later one, whatever the difference.
//     Releasing the lock at the end of the run, as most lockers do, lets
//     such an instance run the same scheduled time again when the job is
//     fast (gocron issue #841).
//
// A busy job is a skip, not a wait: Lock returns ErrHeldElsewhere at once.
// When Redis nodes fail, Lock returns an error matching
// redlock.ErrUnavailable (with the *redlock.QuorumError), so an
// AfterLockError listener can tell the two apart; nodes that answered
// with an error an operator must fix (a wrong password, an ACL, a cluster
// or replica node) give redlock.ErrMisconfigured instead, at once, without
// retrying; a Lock cut short because
// gocron stopped the job (Shutdown, RemoveJob, Update) returns ErrStopped.
// Misconfigurations are errors too: ErrUnstableName for a job without a
// stable name, ErrDuplicateInstance when two live instances share an
// instance ID; clocks further apart than the tolerance, and instances
// that run a job on different schedules, are warned about (WithLogger)
// and counted (schedlock.scheduler.warnings).
//
// A scheduled time whose run has started is never given back, even when
// the run is interrupted: at most once, and an interrupted run is not
// re-run. Scheduled times that ran nowhere are reported once, by the next
// run of the job that finds them (WithMissedHandler, the run record);
// WithCatchUp runs the latest of them at Start.
//
// # The run record
//
// Each run, missed scheduled times and late skips are written to the
// job's run record on every node (the newest 100 entries,
// WithHistoryLength), which Scheduler.History reads from any instance:
// scheduled time, instance, start, end, outcome and error.
//
// # The fleet: status, pause, run now
//
// From Start to Shutdown, a Scheduler's fleet loop writes its heartbeat
// (instance ID, clock, settings) and its jobs' registry (names and
// schedules) to the nodes, and reads the fleet's pauses and run-now
// requests every fleet poll (WithFleetPoll, 1 s). Scheduler.Status reads
// all of it, with every job's run record and run lock, in two rounds per
// node whatever the number of jobs; Handler serves it as a web page and
// JSON. Pause and Resume stop and restart a job's scheduled times on every
// instance (each recorded once as paused meanwhile: ErrPaused);
// RequestRun runs a job once, now, on one instance (a manual run).
// docs/scheduling.md says how fast each takes effect.
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
// settings.
package scheduler
