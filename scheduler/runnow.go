package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schedlock/schedlock/redlock"
)

// Running a job now, once, on one instance of the fleet
// (Scheduler.RequestRun, the status page's "run now"). A request is a
// field of the hash "<prefix>fleet:runnow" on every node: job ->
// "<ms>|<state>|<seq>|<requestEntry>", written through Client.Eval on a
// quorum; one pending request per job at a time. The fleet loop of every
// instance that has the job reads the requests every poll; the first to
// find a pending one claims it by raising the job's run-now mark
// "<prefix>fleet:runnow-taken:<job>" to the request's sequence number
// (redlock.WithHighWater, on a quorum, with the lock
// "<prefix>fleet:runnow-lock:<job>" released at once): a mark is never
// lowered, so no two instances claim one request, whatever their timing.
// The claimer runs the job as Job.RunNow does (a manual run: exclusive
// with the job's runs, no scheduled time taken, recorded as manual) and
// writes the outcome to the request: started, or refused with the Lock's
// error (a run in progress elsewhere). A request that no instance claims
// within requestLife expires. At most once: an instance that crashes
// between its claim and the run loses the request.
func (l *Locker) requestsKey() string              { return l.cfg.prefix + "fleet:runnow" }
func (l *Locker) requestLockKey(job string) string { return l.cfg.prefix + "fleet:runnow-lock:" + job }
func (l *Locker) requestMarkKey(job string) string { return l.cfg.prefix + "fleet:runnow-taken:" + job }

// requestLife is how long a run-now request waits for an instance.
const requestLife = 30 * time.Second

// States of a run-now request.
const (
	requestPending = "pending"
	requestStarted = "started"
	requestRefused = "refused"
)

// requestEntry is a run-now request.
type requestEntry struct {
	Seq      int64  `json:"seq"`                // its sequence number: above every earlier request's of the job
	By       string `json:"by"`                 // the instance that wrote it
	Asked    int64  `json:"asked"`              // when, on that instance's clock, Unix ms
	State    string `json:"state"`              // pending, started or refused
	Instance string `json:"instance,omitempty"` // the instance that claimed it
	Error    string `json:"error,omitempty"`    // why the run was refused
	At       int64  `json:"at,omitempty"`       // when it was claimed, on the claimer's clock, Unix ms

	stamp time.Time // when it was last written, on the node's clock
}

var (
	requestScript = redlock.NewScript(`-- Request: write job ARGV[1]'s run-now request,
-- unless a pending one younger than ARGV[2] ms is there.
-- KEYS[1] the requests (a hash). ARGV[3] seq, ARGV[4] the entry.
-- Reply: {1} written; {0, the pending request} refused.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local at, state = string.match(old, '^(%d+)|(%a+)|')
  if state == 'pending' and now - tonumber(at) < tonumber(ARGV[2]) then return {0, old} end
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now) .. '|pending|' .. ARGV[3] .. '|' .. ARGV[4])
return {1}`, redlock.WithScriptTimeout(controlTimeout))
	answerScript = redlock.NewScript(`-- Answer: set the state of job ARGV[1]'s request of
-- sequence number ARGV[2] to ARGV[3], with the entry ARGV[4].
-- KEYS[1] the requests (a hash). Reply: 1 written, 0 not there.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then return 0 end
local seq = string.match(old, '^%d+|%a+|(%d+)|')
if seq ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now) .. '|' .. ARGV[3] .. '|' .. ARGV[2] .. '|' .. ARGV[4])
return 1`)
)

// parseRequest reads a value of the requests hash.
func parseRequest(v string) (requestEntry, bool) {
	parts := strings.SplitN(v, "|", 4)
	if len(parts) != 4 {
		return requestEntry{}, false
	}
	ms, err1 := strconv.ParseInt(parts[0], 10, 64)
	seq, err2 := strconv.ParseInt(parts[2], 10, 64)
	var e requestEntry
	if err1 != nil || err2 != nil || json.Unmarshal([]byte(parts[3]), &e) != nil {
		return requestEntry{}, false
	}
	e.stamp, e.State, e.Seq = time.UnixMilli(ms), parts[1], seq
	return e, true
}

// readRequests merges the run-now requests of a poll's replies (the hash
// at index 2 of each reply); now is the nodes' time (index 0).
func readRequests(replies []redlock.NodeReply) (reqs map[string]requestEntry, now time.Time) {
	return decodeRequests(replies, func(v any) any { return listAt(v, 2) }), nodeTime(replies, 0)
}

// decodeRequests merges the request hashes that pick finds in replies:
// per job, the request of the largest sequence number, and of it the
// latest write.
func decodeRequests(replies []redlock.NodeReply, pick func(any) any) map[string]requestEntry {
	out := map[string]requestEntry{}
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		for _, p := range hashPairs(pick(r.Val)) {
			e, ok := parseRequest(p[1])
			if !ok {
				continue
			}
			if o, seen := out[p[0]]; !seen || e.Seq > o.Seq || e.Seq == o.Seq && e.stamp.After(o.stamp) {
				out[p[0]] = e
			}
		}
	}
	return out
}

// nodeTime returns the median of the nodes' times at index i of their
// replies (Unix ms, as a string or an integer), or the zero time.
func nodeTime(replies []redlock.NodeReply, i int) time.Time {
	var ts []int64
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		switch v := listAt(r.Val, i).(type) {
		case string:
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				ts = append(ts, n)
			}
		case int64:
			ts = append(ts, v)
		}
	}
	if len(ts) == 0 {
		return time.Time{}
	}
	slices.Sort(ts)
	return time.UnixMilli(ts[len(ts)/2])
}

// requestRun writes a run-now request for job. seq must be above every
// earlier request's of the job. Errors: ErrRequestPending when a pending
// request of the job is younger than requestLife (nothing written); an
// error matching redlock.ErrUnavailable when fewer than a quorum of
// nodes took it.
func (l *Locker) requestRun(ctx context.Context, job string, seq int64) error {
	b, _ := json.Marshal(requestEntry{By: l.cfg.instance, Asked: l.cfg.clock.Now().UnixMilli()})
	replies, err := l.client.Eval(ctx, requestScript, []string{l.requestsKey()}, job, requestLife.Milliseconds(),
		strconv.FormatInt(seq, 10), string(b))
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		if ok, _ := listAt(r.Val, 0).(int64); ok == 0 {
			old, _ := listAt(r.Val, 1).(string)
			e, _ := parseRequest(old)
			return fmt.Errorf("%w: job %q has a run-now request of %s waiting for an instance (written by %q)",
				ErrRequestPending, job, time.UnixMilli(e.Asked).Format(time.RFC3339), e.By)
		}
	}
	if err != nil {
		return &textError{msg: fmt.Sprintf("scheduler: requesting a run of job %q: %s", job, redlock.ErrorText(err)), errs: []error{err}}
	}
	return nil
}

// serve claims and runs the pending run-now requests, of jobs this
// Scheduler has, that it finds in a poll.
func (f *fleetLoop) serve(ctx context.Context, reqs map[string]requestEntry, now time.Time, jobs []string) {
	for job, r := range reqs {
		if r.State != requestPending || now.Sub(r.stamp) >= requestLife {
			continue
		}
		if _, found := slices.BinarySearch(jobs, job); !found {
			continue
		}
		if !f.s.locker.claimRequest(ctx, job, r) {
			continue
		}
		f.runs.Add(1)
		go func() {
			defer f.runs.Done()
			f.s.runRequested(ctx, job, r)
		}()
	}
}

// claimRequest raises job's run-now mark to r's sequence number; true
// when this instance did, and so runs it.
func (l *Locker) claimRequest(ctx context.Context, job string, r requestEntry) bool {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.lockTimeout)
	defer cancel()
	lk, err := l.client.TryAcquire(cctx, []string{l.requestLockKey(job)}, l.cfg.ttl,
		redlock.WithMetadata(l.cfg.instance), redlock.WithHighWater(l.requestMarkKey(job), r.Seq, l.cfg.retention))
	if err != nil {
		if !errors.Is(err, redlock.ErrNotAcquired) || errors.Is(err, redlock.ErrUnavailable) {
			l.log.Debug("scheduler: claiming a run-now request failed", "job", job, "err", err)
		}
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.client.NodeTimeout())
	defer cancel()
	_ = lk.Release(rctx) // the mark stays
	return true
}

// runRequested runs job for the run-now request r that this instance
// claimed, as Job.RunNow does, and writes the outcome to the request.
func (s *Scheduler) runRequested(ctx context.Context, job string, r requestEntry) {
	l := s.locker
	var err error
	if j := s.job(job); j == nil {
		err = fmt.Errorf("scheduler: job %q is no longer on instance %q", job, l.cfg.instance)
	} else {
		err = j.runNow(ctx)
	}
	r.State, r.Instance, r.At = requestStarted, l.cfg.instance, l.cfg.clock.Now().UnixMilli()
	if err != nil {
		r.State, r.Error = requestRefused, err.Error()
		l.log.Warn("scheduler: a run-now request was refused", "job", job, "err", err)
	}
	b, _ := json.Marshal(r)
	// Eval returns at a quorum: the context must outlive it, or the
	// straggler's write is dropped and that node keeps the request
	// pending (a later RequestRun is refused there).
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.client.NodeTimeout())
	time.AfterFunc(l.client.NodeTimeout(), cancel)
	if _, err := l.client.Eval(actx, answerScript, []string{l.requestsKey()}, job, strconv.FormatInt(r.Seq, 10), r.State, string(b)); err != nil {
		l.log.Debug("scheduler: writing a run-now request's outcome failed", "job", job, "err", err)
	}
}

// RequestRun asks the fleet to run job now, once, on one instance: the
// first instance whose fleet loop finds the request (within about the
// fleet poll, WithFleetPoll) and has the job runs it as Job.RunNow does,
// as a manual run (exclusive with the job's runs on every instance, no
// scheduled time taken, recorded as manual), also while the job is
// paused. It returns once the request is on a quorum of nodes, not when
// the run starts: Status shows the request's fate (JobStatus.RunNow), and
// the run record the run. Its two rounds (a lookup, the write) wait up to
// 1 s for each node; ctx bounds both. A request that no instance takes within 30 s
// expires. Errors: ErrRequestPending when an earlier request of the job
// still waits (nothing written); ErrUnknownJob as for Pause; an error
// matching redlock.ErrUnavailable when fewer than a quorum of nodes
// answered. Safe for concurrent use.
func (s *Scheduler) RequestRun(ctx context.Context, job string) error {
	req, err := s.known(ctx, job)
	if err != nil {
		return err
	}
	seq := max(s.locker.cfg.clock.Now().UnixMilli(), req.Seq+1)
	return s.locker.requestRun(ctx, job, seq)
}
