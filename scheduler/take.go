package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/schedlock/schedlock/redlock"
)

// Redis keys of a job, after the Locker's prefix (WithKeyPrefix).
func (l *Locker) runKey(job string) string     { return l.cfg.prefix + "job:" + job }
func (l *Locker) takenKey(job string) string   { return l.cfg.prefix + "taken:" + job }
func (l *Locker) historyKey(job string) string { return l.cfg.prefix + "runs:" + job }

// take acquires the run lock of job for the claim c, with the job's
// record of scheduled times raised to c's (not for a manual run), through
// redlock's Acquire, whose retry condition (retryIf) judges each failed
// round. A round that no single holder won (instances that fired at the
// same instant split the nodes between them, and each undid its minority)
// is retried after Acquire's short random split-vote delay until someone
// wins or lctx ends. A round that failed because nodes did not answer (a
// burst of runs queued past the node timeout, a node restarting) is
// retried too, with a growing random delay (retryPolicy), until lctx (the
// Lock bound) ends: every round is a full acquisition, undone where it
// failed, so retrying never runs a scheduled time twice. A round lost to
// one holder (with a quorum, or on the node asked first by the record:
// redlock.WithHighWaterFirst) is final, except to a run lock left by this
// Locker's own failed attempt (see orphan).
//
// When ctx (the job's: gocron cancels it at Shutdown, RemoveJob, Update and
// StopJobs) ends, take returns an error that matches ctx's cause and never
// redlock.ErrUnavailable: the nodes did not fail. When the bound ends, it
// returns the error of the round it cut short if a quorum had decided
// that round, else that of the last round that ran to its end, or, when
// the first round had not ended yet, an error matching
// redlock.ErrUnavailable: no quorum answered within the bound.
func (l *Locker) take(ctx, lctx context.Context, job string, c claim, bound time.Duration) (*redlock.Lock, error) {
	var final, last error
	var judged *redlock.QuorumError
	retryIf := func(_ int, q *redlock.QuorumError) bool {
		stop, e := l.judge(ctx, job, c, q)
		if stop {
			final = e
		}
		last, judged = e, q
		return !stop
	}
	lk, err := l.client.Acquire(lctx, []string{l.runKey(job)}, l.cfg.ttl,
		append(l.acquireOptions(job, c, bound), redlock.WithRetryIf(retryIf))...)
	switch {
	case err == nil:
		return lk, nil
	case final != nil:
		return nil, final
	case ctx.Err() != nil:
		return nil, l.fail(job, c, errStopped, fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)))
	case lctx.Err() == nil:
		return nil, l.fail(job, c, errOther, err) // bad input, or the Client is closed
	}
	return nil, l.expired(ctx, job, c, err, judged, last, bound)
}

// expired returns the error of a Lock whose bound ended with Acquire's
// error err: that of the round the bound cut short when what it heard is
// final (a quorum named a holder while a node was still awaited: the
// retry condition does not see such a round), else that of the last
// round judged, or, when none was, an error matching
// redlock.ErrUnavailable.
func (l *Locker) expired(ctx context.Context, job string, c claim, err error, judged *redlock.QuorumError, last error, bound time.Duration) error {
	var q *redlock.QuorumError
	if errors.As(err, &q) && q != judged {
		if final, e := l.judge(ctx, job, c, q); final {
			return e
		}
	}
	if last != nil {
		return last
	}
	hint := ""
	if bound < l.client.NodeTimeout() && bound < l.cfg.lockTimeout {
		hint = fmt.Sprintf(" (it ends before the job's next scheduled time, %v away, and is shorter than the nodes' %v timeout: "+
			"a schedule this fine leaves no time for a round; use a coarser one)", gapTo(c).Round(time.Microsecond), l.client.NodeTimeout())
	}
	return l.fail(job, c, errUnavailable, &textError{errs: []error{redlock.ErrUnavailable, err},
		msg: fmt.Sprintf("no quorum answered within the %v bound of its Lock%s: %s", bound.Round(time.Microsecond), hint, redlock.ErrorText(err))})
}

// acquireOptions returns the options of a claim's Acquire. Each round
// waits for the nodes up to half the Lock's bound (in whole
// milliseconds, so that errors name a round number): a burst of many jobs
// firing at once queues its commands for longer than a node timeout made
// for single locks, and a round that waits costs less than one that fails
// and is retried. Losers do not wait for the winner's release (no release
// notices): a refusal by a holder is final. Its rounds are patient
// (redlock.WithPatientRounds): they wait for every node, also one that
// timed out in the burst, and losers send no undo. A scheduled run's
// rounds ask one node first (redlock.WithHighWaterFirst): a fleet's
// instances fire at the same instant, that node orders them, and every
// instance but the first to reach it is refused there by the job's record
// of scheduled times and sends nothing else (docs/scheduling.md, "Redis
// traffic per run"). A manual run, which raises no record, and a catch-up ask
// every node at once: a catch-up recovers a scheduled time that ran
// nowhere, which a winner that died between the node asked first and the
// others leaves raised on that node alone.
func (l *Locker) acquireOptions(job string, c claim, bound time.Duration) []redlock.LockOption {
	keep := l.retention(job)
	opts := []redlock.LockOption{
		redlock.WithMetadataFunc(func() string { return l.metadata(keep) }),
		redlock.WithNodeTimeout(max(l.client.NodeTimeout(), (bound / 2).Truncate(time.Millisecond))),
		redlock.WithRetry(retryPolicy),
		redlock.WithReleaseNotices(false),
		redlock.WithRefusalText(refusalText),
		redlock.WithPatientRounds(),
	}
	switch c.kind {
	case kindScheduled:
		opts = append(opts, redlock.WithHighWaterFirst(l.takenKey(job), c.at.UnixMilli(), keep))
	case kindCatchUp: // every node: the node asked first may hold the record of the winner that left the time unrun
		opts = append(opts, redlock.WithHighWater(l.takenKey(job), c.at.UnixMilli(), keep))
	}
	return opts
}

// metadata returns the metadata of a run lock and record of scheduled
// times kept for keep, read at the start of each attempt:
// "<instance>@<clock in Unix ms>/<nonce>/<record retention in ms>". The
// clock check (checkRecord) reads it.
func (l *Locker) metadata(keep time.Duration) string {
	return l.cfg.instance + clockSep + strconv.FormatInt(l.cfg.clock.Now().UnixMilli(), 10) + nonceSep + l.nonce +
		nonceSep + strconv.FormatInt(keep.Milliseconds(), 10)
}

// judge classifies a failed round: final errors end the Lock, the others
// are retried.
func (l *Locker) judge(ctx context.Context, job string, c claim, q *redlock.QuorumError) (final bool, e error) {
	switch {
	case ctx.Err() != nil:
		return true, l.fail(job, c, errStopped, fmt.Errorf("%w: %w", ErrStopped, context.Cause(ctx)))
	case errors.Is(q, redlock.ErrUnavailable):
		return down(q), l.fail(job, c, errUnavailable, q)
	case errors.Is(q, redlock.ErrMisconfigured):
		return true, l.fail(job, c, errMisconfigured, q) // an operator must fix a node: retrying will not
	}
	if holder, ok := q.HolderMetadata(); ok {
		return l.refused(ctx, job, c, holder, q)
	}
	if q.HolderUnknown() {
		// Refused without a quorum for one holder, and the nodes that
		// failed could complete one: whether it was taken is unknown.
		return false, l.fail(job, c, errUnavailable, &textError{errs: []error{redlock.ErrUnavailable, q},
			msg: "the nodes that failed leave unknown whether another instance took it: " + redlock.ErrorText(q)})
	}
	return false, l.fail(job, c, errOther, q) // a split vote: retried
}

// retryPolicy is the delay policy of a Lock's rounds after a round that
// nodes did not answer: random up to 10 ms x 2^n, at most 200 ms, and no
// limit of its own (the Lock's bound ends the retries). After a split
// vote, redlock's shorter split-vote delay applies.
func retryPolicy() backoff.BackOff {
	return redlock.FullJitter(&backoff.ExponentialBackOff{InitialInterval: 10 * time.Millisecond, Multiplier: 2,
		MaxInterval: 200 * time.Millisecond, Clock: backoff.SystemClock})
}

// refused classifies a round that holder won on a quorum of nodes, or on
// the node asked first by the job's record (a final refusal): the
// job's record of scheduled times (taken, or a later one taken: late) or
// its run lock (a run in progress).
func (l *Locker) refused(ctx context.Context, job string, c claim, holder string, q *redlock.QuorumError) (bool, error) {
	for _, r := range q.Nodes {
		if r.Outcome == redlock.OutcomeHeld && r.Holder == holder {
			return l.refusedBy(ctx, job, c, r, q)
		}
	}
	return true, l.fail(job, c, errOther, q)
}

// refusedBy classifies a refusal by r, with cause (the round's
// *redlock.QuorumError). It checks the clocks against the
// record, and the holder's instance ID against this Locker's.
func (l *Locker) refusedBy(ctx context.Context, job string, c claim, r redlock.NodeResult, cause error) (bool, error) {
	instance, wrote, nonce, _ := splitHolder(r.Holder)
	e := &runError{kind: errRunning, job: job, claim: c, err: cause, holder: instance, self: nonce == l.nonce}
	if r.Resource == l.takenKey(job) {
		e.kind, e.taken = errTaken, time.UnixMilli(r.HolderMark).In(c.at.Location())
		if e.taken.After(c.at) {
			e.kind = errLater
		}
		l.checkRecord(ctx, job, c, r)
	}
	if instance == l.cfg.instance && nonce != "" && nonce != l.nonce && e.kind == errTaken && !wrote.Before(l.started) {
		e.duplicate = true
		l.warn(ctx, warnDuplicateInstance, job, "scheduler: another live instance uses this instance ID; give each instance its own (WithInstanceID)",
			"instance", l.cfg.instance, "scheduled", c.at)
	}
	if nonce == l.nonce && l.ownLeftover(job, c, e.kind, r) {
		return l.orphan(ctx, job, c, r.Holder, e)
	}
	return true, e
}

// ownLeftover reports whether a refusal by this Locker's own metadata is a
// failed attempt's leftover: no other Lock or run of the job is busy
// here, and it is the run lock, or the record raised to this scheduled
// time, which this instance has not served before this Lock (claim), so
// that no run of this Locker took it.
func (l *Locker) ownLeftover(job string, c claim, kind int, r redlock.NodeResult) bool {
	own := kind == errRunning || kind == errTaken && c.kind == kindScheduled && r.HolderMark == c.at.UnixMilli()
	return own && l.alone(job) && (kind == errRunning || !l.ranHere(job, r.Holder))
}

// ranHere reports whether holder is the metadata of the latest run of job
// on this Locker that took a scheduled time (jobState.ran): the record it
// raised is a run's.
func (l *Locker) ranHere(job, holder string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state(job).ran == holder
}

// alone reports whether the calling Lock is the only one of job in
// flight or running on this Locker.
func (l *Locker) alone(job string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state(job).busy == 1
}

// orphan handles a run lock, or a record of this scheduled time, that
// this Locker's own earlier attempt left on the nodes (an attempt whose
// undo came before its grant on a node, or never came): no run of the
// job is in progress here, and the holder is this Locker, so no one runs
// the job or ran this scheduled time. It deletes that attempt's run lock
// and puts back its record (redlock.Client.ReleaseAbandoned) and has the
// round retried, also when nothing was left to delete (this Locker's own
// run released its run lock between the round and the deletion); when
// the deletion fails on a quorum, the Lock fails with an error that names
// the leftover and matches redlock.ErrUnavailable, never ErrHeldElsewhere.
// A run lock of this Locker's latest run that took a scheduled time
// (jobState.ran), whose release failed or is under way, is deleted alone:
// that run took its scheduled time, and its record stays.
func (l *Locker) orphan(ctx context.Context, job string, c claim, holder string, e *runError) (bool, error) {
	mark := l.takenKey(job)
	if l.ranHere(job, holder) {
		mark = ""
	}
	n, err := l.client.ReleaseAbandoned(context.WithoutCancel(ctx), l.runKey(job), holder, mark)
	switch {
	case err != nil:
		e.kind, e.err = errOrphan, err
		return true, e
	case n > 0:
		l.log.Warn("scheduler: deleted a run lock that an earlier failed attempt of this instance left on the nodes",
			"job", job, "nodes", n)
	}
	// Retried also when nothing was left to delete: the run lock was this
	// Locker's run's, released between the round and this call.
	return false, e
}

// down reports whether q's round failed because nodes refused it
// outright (errors, no timeouts): they are down, not slow. A Lock that
// retried them for its whole bound made gocron skip the next scheduled
// time without calling Lock, so that the skip was never reported.
func down(q *redlock.QuorumError) bool {
	return q.Count(redlock.OutcomeTimeout) == 0 && q.Count(redlock.OutcomeError) > 0
}

// The metadata of a run lock and a record of scheduled times is
// "<instance>@<clock in Unix ms>/<the Locker's nonce>/<record retention
// in ms>"; earlier releases wrote the tick record's TTL there, or the
// instance ID alone.
const (
	clockSep = "@"
	nonceSep = "/"
)

// splitHolder splits the metadata of a run lock or record into the
// instance ID, its clock reading, the writing Locker's nonce and the
// record's TTL; nonce is "" for metadata of the instance ID alone, and
// ttl 0 for metadata without it.
func splitHolder(md string) (instance string, clock time.Time, nonce string, ttl time.Duration) {
	i := strings.LastIndex(md, clockSep)
	if i < 0 {
		return md, time.Time{}, "", 0
	}
	at, rest, ok := strings.Cut(md[i+1:], nonceSep)
	ms, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || rest == "" {
		return md, time.Time{}, "", 0
	}
	nonce, ttlText, _ := strings.Cut(rest, nonceSep)
	if n, err := strconv.ParseInt(ttlText, 10, 64); err == nil && n > 0 {
		ttl = time.Duration(n) * time.Millisecond
	}
	return md[:i], time.UnixMilli(ms), nonce, ttl
}

// Kinds of runError.
const (
	errOther         = iota // redlock's error, quoted
	errTaken                // another instance took this scheduled time
	errRunning              // a run of the job is in progress elsewhere
	errLater                // a later scheduled time was taken: too late
	errLate                 // too late before any round (claim)
	errUnavailable          // too many nodes failed
	errStopped              // gocron stopped the job
	errOrphan               // an own failed attempt's run lock blocks the job
	errMisconfigured        // too many nodes answered that they are misconfigured
	errPaused               // the job is paused: taken and skipped
)

// runError is the error of a Lock that did not run its job. Its message
// is built only when asked for: gocron skips the run without reading it,
// and in a fleet every instance but one skips every scheduled time.
type runError struct {
	kind      int
	job       string
	claim     claim
	err       error     // redlock's, or the cause
	holder    string    // errTaken, errRunning, errLater: the holder's instance ID
	taken     time.Time // errTaken, errLater: the scheduled time the record holds
	duplicate bool      // errTaken: the holder has this Locker's instance ID
	self      bool      // the holder is this Locker
	reason    string    // errLate
}

// fail returns the runError of kind for c with cause err.
func (l *Locker) fail(job string, c claim, kind int, err error) error {
	return &runError{kind: kind, job: job, claim: c, err: err}
}

// lateErr returns the ErrLate of c, for reason.
func (l *Locker) lateErr(job string, c claim, reason string) error {
	return &runError{kind: errLate, job: job, claim: c, reason: reason}
}

// Error reads `scheduler: job "J" scheduled time T: <what happened>`, for
// example `... held by another instance: "H" took it`, `... skipped:
// too late: <why>`, `... skipped: Redis unavailable: <what redlock
// found>`. The holder's round is not quoted: a quorum named the holder,
// which is all it says.
func (e *runError) Error() string {
	head := fmt.Sprintf("scheduler: job %q %s", e.job, e.claim.what())
	switch e.kind {
	case errStopped:
		cause := strings.TrimPrefix(e.err.Error(), ErrStopped.Error()+": ")
		return head + " skipped: the job was stopped (Shutdown, RemoveJob, Update or StopJobs) while its lock was being taken (" + cause + ")"
	case errUnavailable:
		return head + " skipped: Redis unavailable: " + redlock.ErrorText(e.err)
	case errMisconfigured:
		return head + " skipped: Redis nodes misconfigured: " + redlock.ErrorText(e.err)
	case errTaken:
		reason := fmt.Sprintf("%q took it", e.holder)
		if e.duplicate {
			reason += ", another live instance with this instance's ID; give each instance its own ID (WithInstanceID)"
		}
		return head + " held by another instance: " + reason
	case errRunning:
		if e.self {
			return head + fmt.Sprintf(" held: a run of the job is in progress on this instance (%q)", e.holder)
		}
		return head + fmt.Sprintf(" held by another instance: a run of the job is in progress on %q", e.holder)
	case errLater:
		return head + fmt.Sprintf(" skipped: too late: %q already ran the later scheduled time %s", e.holder, e.taken.Format(time.RFC3339Nano))
	case errLate:
		return head + " skipped: too late: " + e.reason
	case errPaused:
		return head + " skipped: the job is paused across the fleet (Scheduler.Resume or the status page resumes it)"
	case errOrphan:
		return head + " skipped: a run lock or record that an earlier failed attempt of this instance left on the nodes blocks it, and deleting it failed: " + redlock.ErrorText(e.err)
	}
	return head + " skipped: " + redlock.ErrorText(e.err)
}

// Unwrap gives ErrHeldElsewhere for a scheduled time taken or a run in
// progress elsewhere (and ErrDuplicateInstance when the holder has this
// instance's ID), ErrLate for a late run, redlock.ErrUnavailable for an
// orphaned run lock, and redlock's error.
func (e *runError) Unwrap() []error {
	switch {
	case e.duplicate:
		return []error{ErrHeldElsewhere, ErrDuplicateInstance, e.err}
	case e.kind == errTaken || e.kind == errRunning:
		return []error{ErrHeldElsewhere, e.err}
	case e.kind == errLater:
		return []error{ErrLate, e.err}
	case e.kind == errLate:
		return []error{ErrLate}
	case e.kind == errOrphan:
		return []error{redlock.ErrUnavailable, e.err}
	case e.kind == errPaused:
		return []error{ErrPaused}
	}
	return []error{e.err}
}
