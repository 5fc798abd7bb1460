package scheduler

import (
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// What a run serves (Run.Kind, the span attribute schedlock.run.kind), and
// the kinds of the run record's other entries.
const (
	kindScheduled = "scheduled" // a scheduled time of the job's schedule
	kindManual    = "manual"    // RunNow: no scheduled time
	kindCatchUp   = "catch-up"  // a scheduled time run late (WithCatchUp)
	kindMissed    = "missed"    // scheduled times that ran nowhere
	kindLate      = "late"      // a run skipped: too late for its scheduled time
)

// jobState is what a Locker knows of one job on this instance.
type jobState struct {
	table    timetable // nil until known
	readAt   time.Time // when table was read through Follow
	served   time.Time // the latest scheduled time a Lock here served or tried
	hint     time.Time // latest's last answer
	requests []*request
	busy     int      // Locks in flight and runs in progress here
	run      *runLock // the run in progress here, if any
	// ran is the metadata of the latest run here that took a scheduled
	// time (its run lock's and its record's): a run lock of it found later
	// was left by a run whose release failed, not by a failed attempt
	// (orphan). Manual runs raise no record and are left out, so that a
	// failed attempt with a manual run's metadata (the same clock reading)
	// still has its record put back.
	ran string
}

// A request is a run asked for by RunNow (at zero) or a catch-up (at the
// scheduled time), waiting for the Lock of the run gocron starts for it.
type request struct {
	at    time.Time
	asked time.Time // on the Locker's clock
	done  chan error
}

// requestTTL bounds how long a request waits for its Lock: gocron drops a
// run that its singleton or limit mode reschedules before calling Lock,
// and a request left behind must not turn a later scheduled run into a
// manual one.
const requestTTL = 30 * time.Second

// A claim is what one Lock serves: a scheduled time, or a manual run.
type claim struct {
	kind string
	at   time.Time // the scheduled time; zero for a manual run
	now  time.Time // when the Lock began, on the Locker's clock
	next time.Time // the job's first scheduled time after now; zero: none
	req  *request  // the request it serves, if any
}

// tick is the time TickFromContext gives the run: the scheduled time, or
// for a manual run its start.
func (c claim) tick() time.Time {
	if c.at.IsZero() {
		return c.now
	}
	return c.at
}

// what names the claim in texts: `scheduled time 2026-12-02T09:00:00Z`
// or `manual run`.
func (c claim) what() string {
	switch c.kind {
	case kindManual:
		return "manual run"
	case kindCatchUp:
		return "catch-up of scheduled time " + c.at.Format(time.RFC3339Nano)
	}
	return "scheduled time " + c.at.Format(time.RFC3339Nano)
}

// answer tells the request's RunNow how its run's Lock ended.
func (c claim) answer(err error) {
	if c.req != nil {
		c.req.done <- err // buffered: never blocks
	}
}

// scheduledAt returns the scheduled time of tt that a run at now serves
// (ok false: none): the latest at or before now (gocron fires a job at or
// after its scheduled time on the same clock); and the scheduled time after
// now (zero: none). hint is an earlier answer, or zero.
func scheduledAt(tt timetable, now, hint time.Time) (s, next time.Time, ok bool) {
	s, ok = latest(tt, now, hint)
	return s, tt.next(now), ok
}

// claim decides what a Lock of job at now serves, and counts the Lock as
// busy until done. Its error, matching ErrLate, skips the run.
func (l *Locker) claim(job string, now time.Time) (claim, error) {
	tt := l.timetable(job)
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(job)
	st.busy++
	c := claim{kind: kindScheduled, now: now}
	if r := st.pop(now); r != nil {
		c.req, c.at, c.kind, c.next = r, r.at, kindCatchUp, tt.next(now)
		if r.at.IsZero() {
			c.kind, c.at = kindManual, time.Time{}
			return c, nil
		}
		if r.at.After(st.served) {
			st.served = r.at
		}
		return c, l.checkLate(st, job, c, l.cfg.catchUp)
	}
	s, next, ok := scheduledAt(tt, now, st.hint)
	c.next = next
	if !ok {
		// A run for no scheduled time (gocron.OneTimeJobStartImmediately,
		// WithStartImmediately before a one-time job's first time): a
		// manual run of this instance.
		c.kind = kindManual
		return c, nil
	}
	st.hint, c.at = s, s
	if !s.After(st.served) {
		st.busy--
		return c, l.lateErr(job, c, "an earlier run of this instance already served it, so this run waited in a queue (gocron's wait modes, a busy executor)")
	}
	st.served = s
	return c, l.checkLate(st, job, c, l.cfg.misfire)
}

// checkLate returns the ErrLate of a claim that came more than bound
// after its scheduled time, releasing its busy count, or nil.
func (l *Locker) checkLate(st *jobState, job string, c claim, bound time.Duration) error {
	if late := c.now.Sub(c.at); late > bound {
		st.busy--
		what := "misfire threshold"
		if c.kind == kindCatchUp {
			what = "catch-up window"
		}
		return l.lateErr(job, c, fmt.Sprintf("it came %v after it, past the %v %s", late.Round(time.Millisecond), bound, what))
	}
	return nil
}

// pop returns the oldest request still within requestTTL, dropping older
// ones, or nil.
func (st *jobState) pop(now time.Time) *request {
	for len(st.requests) > 0 {
		r := st.requests[0]
		st.requests = st.requests[1:]
		if now.Sub(r.asked) <= requestTTL {
			return r
		}
		r.done <- fmt.Errorf("%w: gocron did not start the run within %v (its singleton or limit mode dropped it?)", ErrLate, requestTTL)
	}
	return nil
}

// request queues a run of job for the next Lock of it: a manual run (at
// zero) or a catch-up of the scheduled time at. Its done channel gets the
// Lock's outcome.
func (l *Locker) request(job string, at time.Time) *request {
	r := &request{at: at, asked: l.cfg.clock.Now(), done: make(chan error, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(job)
	st.requests = append(st.requests, r)
	return r
}

// cancel removes r if no Lock has taken it.
func (l *Locker) cancel(job string, r *request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(job)
	for i, q := range st.requests {
		if q == r {
			st.requests = append(st.requests[:i:i], st.requests[i+1:]...)
			return
		}
	}
}

// done ends a busy Lock or run of job (run: the run that ended, or nil).
func (l *Locker) done(job string, run *runLock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(job)
	st.busy--
	if run != nil && st.run == run {
		st.run = nil
	}
}

// state returns job's state, made on first use; l.mu is held.
func (l *Locker) state(job string) *jobState {
	st := l.jobs[job]
	if st == nil {
		st = &jobState{}
		l.jobs[job] = st
	}
	return st
}

// setTimetable sets job's timetable (Scheduler.NewJob and Update); nil
// forgets it.
func (l *Locker) setTimetable(job string, tt timetable) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.state(job)
	st.table, st.readAt, st.hint = tt, time.Time{}, time.Time{}
}

// followEvery is how often a followed job's schedule is read again.
const followEvery = time.Minute

// timetable returns job's timetable: the one Scheduler set, the one read
// through Follow, or the grid of the tick resolution.
func (l *Locker) timetable(job string) timetable {
	l.mu.Lock()
	st, follow := l.state(job), l.follow
	tt, readAt := st.table, st.readAt
	l.mu.Unlock()
	now := l.cfg.clock.Now()
	if follow == nil || (tt != nil && readAt.IsZero()) || (tt != nil && now.Sub(readAt) < followEvery) {
		if tt == nil {
			return grid(l.cfg.resolution)
		}
		return tt
	}
	read := l.readTimetable(follow, job)
	l.mu.Lock()
	if st.readAt.Equal(readAt) {
		st.table, st.readAt, st.hint = read, now, time.Time{} // the hint may be off a new schedule
	}
	l.mu.Unlock()
	return read
}

// readTimetable reads job's schedule from s, falling back to the grid of
// the tick resolution (with a warning) when s has no such job or its
// schedule has no shared scheduled times.
func (l *Locker) readTimetable(s gocron.Scheduler, job string) timetable {
	for _, j := range s.Jobs() {
		if j.Name() != job {
			continue
		}
		tt, err := newTimetable(j.Schedule(), l.cfg.location)
		if err == nil {
			return tt
		}
		l.log.Warn("scheduler: the job's schedule has no scheduled times common to the instances; its runs use the tick resolution's grid",
			"job", job, "err", err)
	}
	return grid(l.cfg.resolution)
}

// Tick returns the scheduled time that a run of job starting now on this
// instance would serve if it were not late (see Lock): the latest
// scheduled time of the job's schedule at or before the Locker's clock,
// or the zero time when there is none.
func (l *Locker) Tick(job string) time.Time {
	s, _, _ := scheduledAt(l.timetable(job), l.cfg.clock.Now(), time.Time{})
	return s
}
