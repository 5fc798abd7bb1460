package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/tracing"
)

// Run is one entry of a job's run record (History): a run, scheduled
// times that ran nowhere, or a run skipped as late.
type Run struct {
	// Job is the job's name.
	Job string `json:"job"`
	// Kind is "scheduled" (a run of a scheduled time), "manual" (RunNow),
	// "catch-up" (a missed scheduled time run late, WithCatchUp),
	// "missed" (scheduled times that ran nowhere) or "late" (a run of
	// Instance skipped: too late for its scheduled time).
	Kind string `json:"kind"`
	// Scheduled is the scheduled time served; for a missed entry the
	// first one missed; zero for a manual run. History decodes it from
	// RFC 3339 with its writer's offset, so its location is time.UTC for
	// offset zero, time.Local where Local uses that offset, else a fixed
	// zone: not necessarily TickFromContext's. Compare it with
	// time.Time.Equal, not ==, and key maps by UnixMilli().
	Scheduled time.Time `json:"scheduled,omitzero"`
	// Last is, for a missed entry, the last scheduled time missed.
	Last time.Time `json:"last,omitzero"`
	// Missed is, for a missed entry, how many scheduled times from
	// Scheduled to Last ran nowhere.
	Missed int `json:"missed,omitempty"`
	// Instance is the instance that ran it (missed: that found the miss;
	// late: that skipped it): its Locker.InstanceID.
	Instance string `json:"instance"`
	// Started and Ended are when the run started and ended on Instance's
	// clock (Ended is zero for missed and late entries).
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	// Outcome is "ok", "failed" (the task returned an error or
	// panicked, as gocron reports it), "lost" (the run's lock was lost),
	// "ended" (a Locker without the Scheduler's monitor: outcome not
	// known), "missed", "late" or "paused" (a scheduled time of a job
	// paused across the fleet: taken by Instance, not run; see
	// Scheduler.Pause).
	Outcome string `json:"outcome"`
	// Error is the task's error or the reason for a late skip, cut to at
	// most 300 bytes (maxErrorText) of valid UTF-8.
	Error string `json:"error,omitempty"`
}

// maxErrorText bounds Run.Error.
const maxErrorText = 300

// Outcomes of Run.
const (
	outcomeOK     = "ok"
	outcomeFailed = "failed"
	outcomeLost   = "lost"
	outcomeEnded  = "ended"
)

// The run record's scripts: a capped list per job, newest first, on every
// node.
var (
	appendScript = redlock.NewScript(`-- Append: push ARGV[3..] (oldest first) onto the list KEYS[1], keep its
-- newest ARGV[1] entries and let it live ARGV[2] ms.
for i = 3, #ARGV do redis.call('LPUSH', KEYS[1], ARGV[i]) end
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)
	readScript = redlock.NewScript(`-- Read: the newest ARGV[1] entries of the list KEYS[1].
return redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)`)
)

// record writes entries to job's run record on every node, bounded by the
// node timeout. A failed write is logged: the run record is best effort,
// the runs themselves are not affected.
func (l *Locker) record(ctx context.Context, job string, entries ...Run) {
	args := []any{l.cfg.history, l.retention(job).Milliseconds()}
	for _, e := range encode(job, entries) {
		args = append(args, e)
	}
	if _, err := l.client.Eval(ctx, appendScript, []string{l.historyKey(job)}, args...); err != nil {
		l.log.Warn("scheduler: writing the run record failed on too many nodes", "job", job, "err", err)
	}
}

// encode returns job's entries as the run record keeps them (JSON).
func encode(job string, entries []Run) []string {
	var out []string
	for _, e := range entries {
		e.Job = job
		if len(e.Error) > maxErrorText {
			e.Error = strings.ToValidUTF8(e.Error[:maxErrorText], "")
		}
		if b, err := json.Marshal(e); err == nil {
			out = append(out, string(b))
		}
	}
	return out
}

// History returns the newest n entries (at most the history length,
// WithHistoryLength) of job's run record, newest first: runs, missed
// scheduled times and late skips, merged from every node that answered
// (an entry is on each node its write reached). A job with no record
// gives none and no error, whatever its name: the record is read by name
// from the nodes, where any instance of the fleet may have written it,
// so a misspelled name reads as a job that has not run (unlike Pause,
// which knows this instance's jobs). Errors: redlock.ErrInvalidArgument
// for n < 1; an error matching redlock.ErrUnavailable, with what the nodes
// that answered hold, when fewer than a quorum answered. Safe for
// concurrent use.
func (l *Locker) History(ctx context.Context, job string, n int) ([]Run, error) {
	if n < 1 {
		return nil, invalidf("History of %q: n %d (entries wanted) is below 1", job, n)
	}
	n = min(n, l.cfg.history)
	replies, err := l.client.Eval(ctx, readScript, []string{l.historyKey(job)}, n)
	seen := map[string]bool{}
	var runs []Run
	for _, r := range replies {
		list, _ := r.Val.([]any)
		for _, v := range list {
			s, _ := v.(string)
			if seen[s] {
				continue
			}
			seen[s] = true
			var e Run
			if json.Unmarshal([]byte(s), &e) == nil {
				runs = append(runs, e)
			}
		}
	}
	slices.SortStableFunc(runs, func(a, b Run) int { return cmp.Compare(b.sortKey(), a.sortKey()) })
	return runs[:min(n, len(runs))], err
}

// sortKey orders entries by when they happened: a run by its start, a
// missed entry by its last scheduled time.
func (r Run) sortKey() int64 {
	switch {
	case !r.Last.IsZero():
		return r.Last.UnixNano()
	case !r.Started.IsZero():
		return r.Started.UnixNano()
	}
	return r.Scheduled.UnixNano()
}

// entry returns the run record's entry of the run that ends now; lost is
// the lock's loss, if any.
func (r *runLock) entry(lost error) Run {
	r.mu.Lock()
	outcome, errText := r.outcome, r.errText
	r.mu.Unlock()
	switch {
	case lost != nil:
		outcome, errText = outcomeLost, lost.Error()
	case outcome == "":
		outcome = outcomeEnded
	}
	return Run{Kind: r.claim.kind, Scheduled: r.claim.at, Instance: r.l.cfg.instance, Started: r.started,
		Ended: r.l.cfg.clock.Now(), Outcome: outcome, Error: errText}
}

// late ends the Lock of a claim that came too late: the span and the
// counter, a warning, the run record, and the request's RunNow.
func (l *Locker) late(ctx context.Context, span trace.Span, job string, c claim, now time.Time, err error) {
	l.skipped(ctx, span, job, err)
	l.warn(ctx, warnLate, job, "scheduler: a run came too late for its scheduled time and was skipped", "err", err)
	l.record(context.WithoutCancel(ctx), job, Run{Kind: kindLate, Scheduled: c.at, Instance: l.cfg.instance,
		Started: now, Outcome: kindLate, Error: err.Error()})
	c.answer(err)
}

// maxMissed bounds the scheduled times a Lock reports one by one
// (WithMissedHandler), and how far it looks for them.
const maxMissed = 100

// missed reports the scheduled times of job between prev (the job's
// previous scheduled time taken, in Unix ms; 0: none) and c's that ran
// nowhere: counted, logged and passed to WithMissedHandler; it returns the
// run record's entry for them, if any. Scheduled times during which a run of the job was in
// progress (scheduled or manual: the run record says when each started and
// ended) are skipped, not missed. A prev that is not on the job's schedule
// (the schedule changed since, or the instances differ in schedule or
// location) is warned about as settings_mismatch, and no miss is counted.
func (l *Locker) missed(ctx context.Context, job string, c claim, prev int64) []Run {
	if prev <= 0 || c.kind == kindManual {
		return nil
	}
	tt := l.timetable(job)
	from := time.UnixMilli(prev).In(c.at.Location())
	if !onSchedule(tt, from) {
		l.warn(ctx, warnSettingsMismatch, job, "scheduler: the job's previous scheduled time taken is not on this instance's schedule of the job; "+
			"instances must share the job's schedule and location (WithLocation), or a scheduled time can run once per schedule",
			"theirs", from, "ours", c.at)
		return nil
	}
	times, more := missedTimes(tt, from, c.at)
	if len(times) == 0 {
		return nil
	}
	times = slices.DeleteFunc(times, l.runningAt(ctx, job)) // skipped: a run was in progress
	if len(times) == 0 {
		return nil
	}
	n := len(times) + more
	l.count(ctx, job, tracing.OutcomeMissed, int64(n))
	l.log.WarnContext(ctx, "scheduler: scheduled times of the job ran nowhere (Redis unavailable, every instance stopped, or a crashed run)",
		"job", job, "missed", n, "first", times[0], "last", times[len(times)-1], "found_by", c.what())
	if l.cfg.onMissed != nil {
		for _, t := range times {
			l.cfg.onMissed(job, t)
		}
	}
	last := times[len(times)-1]
	if more > 0 {
		last = c.at // the rest lie between the last listed and this one
	}
	return []Run{{Kind: kindMissed, Scheduled: times[0], Last: last, Missed: n,
		Instance: l.cfg.instance, Started: l.cfg.clock.Now(), Outcome: kindMissed}}
}

// missedTimes returns the scheduled times of tt after from and before to,
// at most maxMissed of them, and how many more there are (counted up to
// maxMissed x 1,000).
func missedTimes(tt timetable, from, to time.Time) (times []time.Time, more int) {
	for t := tt.next(from); !t.IsZero() && t.Before(to); t = tt.next(t) {
		if len(times) < maxMissed {
			times = append(times, t)
			continue
		}
		if more++; more >= maxMissed*1000 {
			break
		}
	}
	return times, more
}

// runningAt returns a test of whether a run of job (scheduled, manual or
// catch-up) was in progress at a given time, as the run record says (its
// start and end on the runner's clock). When the record cannot be read,
// no run was.
func (l *Locker) runningAt(ctx context.Context, job string) func(time.Time) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.client.NodeTimeout())
	defer cancel()
	runs, err := l.History(rctx, job, l.cfg.history)
	if err != nil && !errors.Is(err, redlock.ErrUnavailable) {
		runs = nil
	}
	return func(t time.Time) bool {
		for _, r := range runs {
			if r.Kind != kindMissed && r.Kind != kindLate && !r.Started.After(t) && !r.Ended.Before(t) {
				return true
			}
		}
		return false
	}
}
