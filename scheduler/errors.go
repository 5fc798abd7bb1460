package scheduler

import "errors"

// Sentinel errors; match them with errors.Is.
var (
	// ErrHeldElsewhere matches a Lock refused because another instance
	// holds the job: it already took this scheduled time, or a run of the
	// job is in progress there. gocron skips the run and fires
	// AfterLockError with this error; it is the normal outcome on all
	// instances but one. The redlock *QuorumError is wrapped too.
	ErrHeldElsewhere = errors.New("scheduler: job held by another instance")

	// ErrLate matches a Lock skipped because the run came too late for
	// its scheduled time: a later scheduled time of the job was already
	// taken (here or by another instance), or the misfire threshold
	// (WithMisfireThreshold) had passed. The run never takes another
	// scheduled time instead. Late runs come from queues (gocron's wait
	// modes, a busy executor), WithStartImmediately, or an instance whose
	// clock is behind the others' (then with a clock_skew warning). The
	// scheduled time itself ran elsewhere, or is reported missed by the
	// next run that finds it.
	ErrLate = errors.New("scheduler: run too late for its scheduled time")

	// ErrStopped matches a Lock cut short because gocron stopped the job
	// while its lock was being taken (Shutdown, RemoveJob, Update or
	// StopJobs cancel the job's context): the run is skipped here, and
	// the error also matches the context's cause (context.Canceled). It
	// says nothing about the Redis nodes and never matches
	// redlock.ErrUnavailable: do not alert on it.
	ErrStopped = errors.New("scheduler: job stopped")

	// ErrUnstableName matches a job name that is not stable across
	// instances and builds: empty, or gocron's default name for an unnamed
	// closure or method value (a Go function name such as
	// "main.main.func1"). Name jobs with gocron.WithName.
	ErrUnstableName = errors.New("scheduler: job name is not stable across instances")

	// ErrDuplicateInstance matches a Lock refused by the job's record of
	// scheduled times, at this scheduled time, that another process wrote
	// with this Locker's instance ID (WithInstanceID) after this Locker
	// started (an earlier record is a restarted instance's previous
	// process): two live instances share an ID, so neither can tell a
	// split vote from a scheduled time taken, and errors name the wrong
	// holder. It comes with ErrHeldElsewhere (the
	// other process took the scheduled time). Give each instance its own
	// ID; alert on this error.
	ErrDuplicateInstance = errors.New("scheduler: duplicate instance ID")

	// ErrRandomSchedule matches a job on a random interval
	// (gocron.DurationRandomJob) given to Scheduler.NewJob or Update: each
	// instance draws its own intervals, so the instances share no
	// scheduled times and the job would run once per instance.
	ErrRandomSchedule = errors.New("scheduler: a random-interval job has no scheduled times common to the instances")

	// ErrUnsharedSchedule matches a job given to Scheduler.NewJob or
	// Update whose scheduled times gocron computes from each instance's
	// own start, so that instances do not share them: cron's "@every",
	// and daily, weekly or monthly jobs with an interval above 1. Use a
	// duration job (which the Scheduler aligns), a cron expression or an
	// interval of 1.
	ErrUnsharedSchedule = errors.New("scheduler: the job's scheduled times differ between instances")

	// ErrPaused matches a Lock of a scheduled time of a job paused across
	// the fleet (Scheduler.Pause, the status page): the instance took the
	// scheduled time, recorded it as paused and did not run the job. It is
	// not a failure; Scheduler.Resume ends the pause.
	ErrPaused = errors.New("scheduler: job paused")

	// ErrUnknownJob matches a fleet control (Pause, Resume, RequestRun)
	// or a status read of a job that no instance has registered (the
	// fleet's job registry: Scheduler.Status).
	ErrUnknownJob = errors.New("scheduler: no instance has the job")

	// ErrRequestPending matches a RequestRun of a job whose earlier
	// run-now request still waits for an instance to take it: nothing is
	// written; try again once it was taken or expired (30 s).
	ErrRequestPending = errors.New("scheduler: a run-now request of the job is pending")

	// ErrDuplicateName matches a job given, by NewJob or Update, a name
	// that another job of the same Scheduler has: both would share one
	// run lock and one record of scheduled times.
	ErrDuplicateName = errors.New("scheduler: duplicate job name")
)
