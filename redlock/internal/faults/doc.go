// Package faults is the fault-injection suite of this module: scenario
// runners that drive redlock (and the scheduler and elector built on it)
// through node, link, process and clock faults, and a checker that judges
// what every client believed against one clock. docs/reliability.md has
// the command, the latest table and how to read it.
//
// # The checker
//
// Every holder logs its believed-ownership window (History.Begin when
// Acquire returned, Hold.End when it began to release or noticed the
// loss) and every guarded action (Hold.Act, which records an action only
// while the lock is valid; the negative controls act blindly). Check
// counts, per resource:
//
//   - overlaps: pairs of windows of different locks that intersect. A
//     window ends at its End, or at the lock's validity deadline
//     (Lock.Until) if that is earlier, since a holder that respects validity
//     does nothing guarded after it; a holder marked IgnoresValidity keeps
//     its window to End (negative control);
//   - token violations: a fencing token (Lock.FencingToken) not above every
//     token of the windows that started before it;
//   - late work: a guarded action started at or after the deadline the
//     holder knew.
//
// porcupine checks the same history for linearizability of the lock as a
// register of (holder, fencing token) (linearizable.go); its verdict
// must agree with the checker's.
//
// Scenarios add their own figures: time to recover after a fault
// (FirstStartAfter), executions per cron tick (Tally), keys left on the
// nodes, extensions sent after the deadline (a go-redis hook that learns
// the extend script's SHA1), stale writes accepted by a Store.
//
// All instants are on the monotonic clock of the test process. Holders in
// child processes (the test binary run again to be killed or stopped)
// report CLOCK_MONOTONIC readings, placed on that clock by MonoToTime.
//
// # Tiers
//
// The simulation (RunSim) runs redlock in a testing/synctest bubble against
// in-memory nodes: miniredis engines behind a serve loop of this package
// over net.Pipe connections, with per-link latency, dropped requests or
// replies, frozen nodes and crashes applied where a network and a process
// would apply them; time is fake and exact. The Redis tier runs real
// redis-server processes (package redlocktest) with SIGSTOP/SIGCONT,
// kill -9 and restart, TCP proxies per client-node link
// (redlocktest.Proxy) and skewed scheduler clocks (redlocktest.OffsetClock).
//
// go test runs the PR tier (two seeds per scenario, short runs, a few
// minutes in all); SCHEDLOCK_SOAK=1 runs the soak tier (more seeds, longer
// runs, the end-to-end soak). SCHEDLOCK_SEEDS=3,7 runs exactly those seeds;
// each seed is a subtest "seed=N", so one seed of one scenario is
// reproduced with -run 'TestName/seed=N'. The table of results is printed
// at the end of the run (visible with -v) and written to the file named by
// SCHEDLOCK_FAULTS_TABLE.
//
// A negative control is a scenario built to violate a property; it passes
// only when the checker detects the violation in every seed.
package faults
