package scheduler

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock"
)

// Pausing a job across the fleet. A pause is a field of the hash
// "<prefix>fleet:paused" on every node: job -> "<version>|<pauseEntry>".
// Pause and Resume write it through Client.Eval (a quorum must answer);
// the script makes each write's version larger than the one on the node
// and at least the writer's clock in Unix ms, and a reader takes the
// largest version of the nodes that answered, so that the later of a
// pause and a resume wins unless the two writers' clocks differ by more
// than the time between them.
//
// Every Lock honours the pause as this instance last read it: the fleet
// loop of a Scheduler reads the pauses every poll (WithFleetPoll); with no
// fleet loop running (NewLocker, or a Scheduler not started), a Lock
// reads them itself first when the last try is older than three polls,
// bounded by the node timeout and a quarter of the lock timeout. While the
// nodes fail, the last view holds. A Lock
// of a scheduled time of a paused job takes it as usual, so that one
// instance serves it, and releases it at once without running the job:
// the run record keeps the scheduled time, on the instance that took it,
// with outcome "paused", and gocron's AfterLockError gets ErrPaused there
// (ErrHeldElsewhere on the others, as for any scheduled time). A paused
// scheduled time is not a miss. Manual runs (RunNow, RequestRun) run
// while the job is paused.
func (l *Locker) pausedKey() string { return l.cfg.prefix + "fleet:paused" }

// pauseEntry is a job's pause.
type pauseEntry struct {
	Paused bool   `json:"paused"`
	By     string `json:"by"` // the instance that wrote it
	At     int64  `json:"at"` // its clock then, Unix ms
}

// outcomePaused is Run.Outcome of a scheduled time skipped because the
// job was paused.
const outcomePaused = "paused"

var pauseScript = redlock.NewScript(`-- Pause: set job ARGV[1]'s pause to ARGV[3] in the hash
-- KEYS[1], with a version above the node's and at least ARGV[2].
-- Reply: the version written.
local v = tonumber(ARGV[2])
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ov = tonumber(string.match(old, '^(%d+)|') or '')
  if ov and ov >= v then v = ov + 1 end
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', v) .. '|' .. ARGV[3])
return v`, redlock.WithScriptTimeout(controlTimeout))

// setPause writes job's pause on the nodes. Errors: an error matching
// redlock.ErrUnavailable when fewer than a quorum of nodes took it.
func (l *Locker) setPause(ctx context.Context, job string, paused bool) error {
	now := l.cfg.clock.Now()
	b, _ := json.Marshal(pauseEntry{Paused: paused, By: l.cfg.instance, At: now.UnixMilli()})
	if _, err := l.client.Eval(ctx, pauseScript, []string{l.pausedKey()}, job, now.UnixMilli(), string(b)); err != nil {
		what := "pausing"
		if !paused {
			what = "resuming"
		}
		return &textError{msg: "scheduler: " + what + " job " + strconv.Quote(job) + ": " + redlock.ErrorText(err), errs: []error{err}}
	}
	l.mu.Lock()
	if l.pauses == nil {
		l.pauses = map[string]pauseEntry{}
	}
	l.pauses[job] = pauseEntry{Paused: paused, By: l.cfg.instance, At: now.UnixMilli()} // seen here at once
	l.mu.Unlock()
	return nil
}

// readPauses merges the pauses of a poll's or status read's replies
// (the hash at index 1 of each reply).
func readPauses(replies []redlock.NodeReply) map[string]pauseEntry {
	return decodePauses(replies, func(v any) any { return listAt(v, 1) })
}

// decodePauses merges the pause hashes that pick finds in replies.
func decodePauses(replies []redlock.NodeReply, pick func(any) any) map[string]pauseEntry {
	version := func(v string) (int64, bool) {
		n, _, ok := strings.Cut(v, "|")
		x, err := strconv.ParseInt(n, 10, 64)
		return x, ok && err == nil
	}
	out := map[string]pauseEntry{}
	for job, v := range newest(replies, pick, version) {
		_, rest, _ := strings.Cut(v, "|")
		var e pauseEntry
		if json.Unmarshal([]byte(rest), &e) == nil {
			out[job] = e
		}
	}
	return out
}

// listAt returns element i of a script's array reply, or nil.
func listAt(v any, i int) any {
	list, _ := v.([]any)
	if i < len(list) {
		return list[i]
	}
	return nil
}

// setPauses replaces the Locker's view of the pauses.
func (l *Locker) setPauses(p map[string]pauseEntry) {
	l.mu.Lock()
	l.pauses = p
	l.mu.Unlock()
}

// Paused reports whether job is paused as this instance last read the
// fleet's pauses: its scheduled times are then skipped here. It does no
// I/O. Safe for concurrent use.
func (l *Locker) Paused(job string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pauses[job].Paused
}

// paused reports whether job is paused. With no fleet loop keeping the
// view (a NewLocker user, a Scheduler not started), it reads the pauses
// first when it last tried more than three polls ago; a fleet loop's view
// is never read here, so that a Lock never waits for failing nodes twice.
func (l *Locker) paused(ctx context.Context, job string) bool {
	l.mu.Lock()
	due := l.watchers == 0 && (l.pausesTried.IsZero() || time.Since(l.pausesTried) > silentPolls*l.cfg.poll)
	l.mu.Unlock()
	if due {
		l.readPausesNow(ctx)
	}
	return l.Paused(job)
}

// readPausesNow reads the pauses, one read at a time: a Lock that finds a
// read in flight waits for it. The read is bounded by the node timeout
// and a quarter of the lock timeout, whichever is shorter; when it fails,
// the view is kept until the next try, three polls later.
func (l *Locker) readPausesNow(ctx context.Context) {
	select {
	case l.pauseRead <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-l.pauseRead }()
	l.mu.Lock()
	tried := l.pausesTried
	if !tried.IsZero() && time.Since(tried) <= silentPolls*l.cfg.poll { // tried while this Lock waited
		l.mu.Unlock()
		return
	}
	l.pausesTried = time.Now()
	l.mu.Unlock()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.client.NodeTimeout(), l.cfg.lockTimeout/4))
	defer cancel()
	replies, err := l.client.Eval(rctx, pollScript, []string{l.instancesKey(), l.pausedKey(), l.requestsKey()}, l.cfg.instance, "", 0)
	if err != nil {
		l.log.Warn("scheduler: reading the fleet's pauses failed; this instance keeps its last view of them", "err", err)
		return
	}
	l.setPauses(readPauses(replies))
}

// watch counts a fleet loop that keeps the Locker's view of the pauses
// (+1 when it starts, -1 when it ends).
func (l *Locker) watch(n int) {
	l.mu.Lock()
	l.watchers += n
	l.mu.Unlock()
}

// skipPaused ends the Lock of a scheduled time of a paused job that
// took its run lock (run): it releases the lock at once, writing the
// scheduled time to the run record as paused (with the misses before
// it), and returns the run's ErrPaused.
func (l *Locker) skipPaused(ctx context.Context, span trace.Span, job string, c claim, run *redlock.Lock, now time.Time) error {
	dctx := trace.ContextWithSpan(context.WithoutCancel(ctx), span)
	e := &runError{kind: errPaused, job: job, claim: c}
	entry := Run{Kind: c.kind, Scheduled: c.at, Instance: l.cfg.instance, Started: now, Outcome: outcomePaused}
	entries := encode(job, append(l.missed(dctx, job, c, run.PreviousMark()), entry))
	if err := run.Release(dctx, redlock.WithReleaseLog(l.historyKey(job), l.cfg.history, l.retention(job), entries...)); err != nil {
		l.log.Warn("scheduler: release of a paused job's run lock failed; the lock expires with its TTL", "job", job, "err", err)
	}
	l.done(job, nil)
	l.skipped(ctx, span, job, e)
	return e
}

// Pause pauses job on every instance of the fleet: from when each
// instance reads it (within about the fleet poll, WithFleetPoll), the
// job's scheduled times are taken and skipped, recorded as paused in the
// run record (outcome "paused"), until Resume. A run in progress goes on;
// manual runs (Job.RunNow, RequestRun) still run. It writes the pause on
// a quorum of nodes, in one round after a lookup round, each waiting up
// to 1 s for a node (ctx bounds both). Pausing a paused job changes
// nothing. Errors: an
// error matching ErrUnknownJob when no instance has registered job (see
// Status) and this Scheduler has no such job; an error matching
// redlock.ErrUnavailable when fewer than a quorum of nodes answered (the
// pause may then have reached some nodes: pause again, or resume). Safe
// for concurrent use.
func (s *Scheduler) Pause(ctx context.Context, job string) error {
	if _, err := s.known(ctx, job); err != nil {
		return err
	}
	return s.locker.setPause(ctx, job, true)
}

// Resume ends a pause of job (Pause) on every instance of the fleet,
// within about the fleet poll; its next scheduled time runs as usual.
// Resuming a job that is not paused changes nothing. Errors as Pause's.
// Safe for concurrent use.
func (s *Scheduler) Resume(ctx context.Context, job string) error {
	if _, err := s.known(ctx, job); err != nil {
		return err
	}
	return s.locker.setPause(ctx, job, false)
}

// Paused reports whether job is paused as this instance last read the
// fleet's pauses (Locker.Paused). It does no I/O.
func (s *Scheduler) Paused(job string) bool { return s.locker.Paused(job) }
