package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
)

// The fleet's state as one read (Scheduler.Status), for the status page
// (Handler) and for scripts (its JSON). Package scheduler imports package
// elector for the elections a status shows (WithElections); elector
// imports nothing of scheduler, so the packages stay in one layer each
// (go list -deps ./elector has no scheduler).

// DefaultStatusRuns is how many entries of each job's run record Status
// returns unless WithRuns says otherwise.
const DefaultStatusRuns = 10

// StatusOption configures Status (and the Handler's reads: WithStatusOptions).
type StatusOption func(*statusConfig)

type statusConfig struct {
	runs        int
	job         string
	elections   []string
	electorOpts []elector.Option
}

// WithRuns sets how many entries of each job's run record Status returns,
// newest first. Default DefaultStatusRuns (10); Status rejects n below 1
// or above the history length (WithHistoryLength, 100 by default) with
// an error matching redlock.ErrInvalidArgument.
func WithRuns(n int) StatusOption { return func(c *statusConfig) { c.runs = n } }

// WithJob makes Status read one job only, by its exact name. Default: all
// the jobs of the fleet's registry and of this Scheduler. Status returns
// an error matching ErrUnknownJob when neither has it.
func WithJob(name string) StatusOption { return func(c *statusConfig) { c.job = name } }

// WithElections makes Status read the elections named (package elector;
// opts as given to elector.New: its WithKeyPrefix matters). Default: none.
func WithElections(names []string, opts ...elector.Option) StatusOption {
	return func(c *statusConfig) {
		c.elections = append(c.elections, names...)
		c.electorOpts = append(c.electorOpts, opts...)
	}
}

// Status is the fleet's state as a quorum of Redis nodes holds it, read
// by Scheduler.Status. Times are on the clock of the instance that read
// it, except where said.
type Status struct {
	// At is when it was read (the median of the nodes' clocks).
	At time.Time `json:"at"`
	// Instance is the instance that read it.
	Instance string `json:"instance"`
	// Jobs are the jobs of the fleet's registry and of the reading
	// Scheduler, by name.
	Jobs []JobStatus `json:"jobs"`
	// Instances are the instances whose fleet loop wrote a heartbeat in
	// the last 24 h, by ID.
	Instances []InstanceStatus `json:"instances"`
	// Elections are the elections asked for (WithElections), in order.
	Elections []ElectionStatus `json:"elections,omitempty"`
}

// JobStatus is one job of a Status.
type JobStatus struct {
	// Name is the job's name.
	Name string `json:"name"`
	// Schedule is its schedule in words, e.g. "cron */10 * * * * *",
	// "every 10s", "daily at 03:00:00".
	Schedule string `json:"schedule"`
	// Next is its next scheduled time after Status.At; zero when there is
	// none or its schedule is not known to the reader.
	Next time.Time `json:"next,omitzero"`
	// Paused reports a pause across the fleet (Scheduler.Pause), with who
	// paused or resumed it last and when (on that instance's clock).
	Paused   bool      `json:"paused"`
	PausedBy string    `json:"paused_by,omitempty"`
	PausedAt time.Time `json:"paused_at,omitzero"`
	// Running is the run in progress, if any.
	Running *Running `json:"running,omitempty"`
	// Runs are the newest entries of its run record (WithRuns), newest
	// first: runs, missed scheduled times, late and paused skips.
	Runs []Run `json:"runs"`
	// Missed and Late count the scheduled times missed and the late skips
	// among Runs (a missed entry counts its scheduled times).
	Missed int `json:"missed"`
	Late   int `json:"late"`
	// Registered is when an instance last wrote the job to the fleet's
	// registry (every minute while one runs it; nodes' clock); Stale is
	// true when that is more than 3 minutes before At: no running
	// instance has the job.
	Registered time.Time `json:"registered,omitzero"`
	Stale      bool      `json:"stale,omitempty"`
	// RunNow is its latest run-now request (Scheduler.RequestRun), if any.
	RunNow *RunNowStatus `json:"run_now,omitempty"`
}

// Running is a run in progress: the instance holding the job's run lock,
// since when (its clock), and until when the lock stays valid unless
// extended (the reader's clock).
type Running struct {
	Instance   string    `json:"instance"`
	Since      time.Time `json:"since"`
	ValidUntil time.Time `json:"valid_until"`
}

// RunNowStatus is a run-now request: State is "pending" (waiting for an
// instance), "started" (Instance runs it), "refused" (Instance could not:
// Error says why) or "expired" (no instance took it within 30 s).
type RunNowStatus struct {
	State    string    `json:"state"`
	By       string    `json:"by"`
	Asked    time.Time `json:"asked"`
	Instance string    `json:"instance,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// InstanceStatus is one instance of a Status.
type InstanceStatus struct {
	// ID is its instance ID (WithInstanceID).
	ID string `json:"id"`
	// State is "up" (a heartbeat within 3 of its polls), "silent" (none
	// since: stopped without a word, or cut off) or "stopped" (its last
	// heartbeat said so).
	State string `json:"state"`
	// LastSeen is its last heartbeat (nodes' clock); Started its fleet
	// loop's start (its clock).
	LastSeen time.Time `json:"last_seen"`
	Started  time.Time `json:"started"`
	// ClockOffset is its clock minus the nodes' (their median), as it
	// measured it over its last 16 polls, from the one with the shortest
	// round trip (as NTP picks its best sample); OffsetError bounds the
	// measure's error (half that round trip, plus 1 ms: the nodes' time is
	// in ms). Before its second poll, the offset is read from its first
	// heartbeat, off by its wait to reach the nodes, and OffsetError is 0.
	// In nanoseconds in JSON.
	ClockOffset time.Duration `json:"clock_offset"`
	OffsetError time.Duration `json:"clock_offset_error,omitempty"`
	// Jobs is its number of jobs.
	Jobs int `json:"jobs"`
	// Settings are the settings it shows the others (TTL, misfire
	// threshold, location, a fingerprint of its jobs and schedules...);
	// Differs names those whose value differs from most instances'
	// that are up, e.g. "ttl=5s (others: 10s)".
	Settings map[string]string `json:"settings"`
	Differs  []string          `json:"differs,omitempty"`
}

// ElectionStatus is one election of a Status (elector.Leadership).
type ElectionStatus struct {
	// Name is the election's name (elector.New).
	Name string `json:"name"`
	// Leader is the identity that holds the lease on a quorum of nodes,
	// "" when none does; Unknown when failed nodes leave it unknown.
	Leader  string `json:"leader,omitempty"`
	Unknown bool   `json:"unknown,omitempty"`
	// Term is the leader's term (its fencing token) and Since the start
	// of that term (nodes' clock); zero when not known.
	Term  uint64    `json:"term,omitempty"`
	Since time.Time `json:"since,omitzero"`
}

// statusTimeout bounds each node's answer to a status read: the run
// records of a thousand jobs are megabytes, more than a lock round's node
// timeout allows for.
const statusTimeout = 5 * time.Second

var (
	statusScript = redlock.NewScript(`-- Status: the fleet's hashes.
-- KEYS[1] instances, KEYS[2] the registry, KEYS[3] paused, KEYS[4] runnow.
-- Reply: {node time in Unix ms, HGETALL of each}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {string.format('%.0f', now), redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
  redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4])}`, redlock.WithScriptTimeout(statusTimeout))
	runsScript = redlock.NewScript(`-- Runs: the newest ARGV[1] entries of each list in KEYS.
local out = {}
for i = 1, #KEYS do out[i] = redis.call('LRANGE', KEYS[i], 0, tonumber(ARGV[1]) - 1) end
return out`, redlock.WithScriptTimeout(statusTimeout))
)

// Status reads the fleet's state from the Redis nodes, as a merge of what
// each answering node holds (an entry is on each node its write reached):
// its jobs (the registry every instance writes, and this Scheduler's),
// each with its schedule, next scheduled time, pause, run in progress,
// newest runs (WithRuns) with missed and late scheduled times, and its
// latest run-now request; the instances seen in the last 24 h with their
// clock offsets and the settings in which they differ; and the elections
// asked for (WithElections). It costs two rounds of at most two scripts
// each per node, whatever the number of jobs: the fleet's hashes first,
// then every job's run record and run lock (redlock.Client.Holders). Each
// round returns once a quorum of nodes answered (Holders: every node); a
// node's answer to the two scripts is awaited up to 5 s (their replies can
// be megabytes), to the run locks' read up to the node timeout; ctx bounds
// it all.
//
// Errors: ErrInvalidArgument (redlock's) for a bad option; ErrUnknownJob
// for WithJob of a job nobody has; an error matching
// redlock.ErrUnavailable when fewer than a quorum of nodes answered a
// round: nil Status for the first, what the nodes that answered hold for
// the second. Safe for concurrent use.
func (s *Scheduler) Status(ctx context.Context, opts ...StatusOption) (*Status, error) {
	cfg := statusConfig{runs: DefaultStatusRuns}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("StatusOption %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	l := s.locker
	if cfg.runs < 1 || cfg.runs > l.cfg.history {
		return nil, invalidf("run count %d (WithRuns) must be between 1 and the history length %d", cfg.runs, l.cfg.history)
	}
	var elections []elector.Leadership
	var electionErr error
	var wg sync.WaitGroup
	if len(cfg.elections) > 0 {
		wg.Go(func() {
			elections, electionErr = elector.Leaderships(ctx, l.client, cfg.elections, cfg.electorOpts...)
		})
	}
	replies, err := l.client.Eval(ctx, statusScript, []string{l.instancesKey(), l.registryKey(), l.pausedKey(), l.requestsKey()})
	if err != nil {
		wg.Wait()
		return nil, &textError{msg: "scheduler: reading the fleet's status: " + redlock.ErrorText(err), errs: []error{err}}
	}
	st := &Status{At: nodeTime(replies, 0), Instance: l.cfg.instance}
	if st.At.IsZero() {
		st.At = time.Now()
	}
	st.Instances = readInstances(replies, st.At)
	jobs, err := s.statusJobs(replies, st.At, cfg.job)
	if err != nil {
		wg.Wait()
		return nil, err
	}
	err = l.readJobs(ctx, jobs, cfg.runs)
	wg.Wait()
	st.Jobs = jobs
	for i, name := range cfg.elections {
		e := ElectionStatus{Name: name}
		if i < len(elections) {
			e.Leader, e.Unknown, e.Term, e.Since = elections[i].Leader, elections[i].Unknown, elections[i].Term, elections[i].Since
		}
		st.Elections = append(st.Elections, e)
	}
	if err == nil && electionErr != nil {
		err = electionErr
	}
	return st, err
}

// readInstances returns the instances of a status read's replies (index
// 1), by ID.
func readInstances(replies []redlock.NodeReply, now time.Time) []InstanceStatus {
	var out []InstanceStatus
	for id, v := range newest(replies, func(v any) any { return listAt(v, 1) }, stampKey) {
		seen, rest, _ := stamped(v)
		var e instanceEntry
		if json.Unmarshal([]byte(rest), &e) != nil {
			continue
		}
		in := InstanceStatus{ID: id, State: "up", LastSeen: seen, Started: time.UnixMilli(e.Started),
			ClockOffset: time.Duration(e.Clock-seen.UnixMilli()) * time.Millisecond, Jobs: e.Jobs, Settings: e.Settings}
		if e.Offset != nil { // measured over its polls
			in.ClockOffset, in.OffsetError = time.Duration(*e.Offset)*time.Microsecond, time.Duration(e.OffErr)*time.Microsecond
		}
		switch poll := time.Duration(max(e.Poll, 1)) * time.Millisecond; {
		case e.Stopped:
			in.State = "stopped"
		case now.Sub(seen) > silentPolls*poll+time.Second:
			in.State = "silent"
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b InstanceStatus) int { return cmp.Compare(a.ID, b.ID) })
	markDiffers(out)
	return out
}

// markDiffers sets Differs of each instance: the settings whose value
// differs from the one most instances that are up have.
func markDiffers(ins []InstanceStatus) {
	values := map[string]map[string]int{} // setting -> value -> instances up
	for _, in := range ins {
		if in.State != "up" {
			continue
		}
		for k, v := range in.Settings {
			if values[k] == nil {
				values[k] = map[string]int{}
			}
			values[k][v]++
		}
	}
	common := map[string]string{}
	for k, vs := range values {
		best := -1
		for v, n := range vs {
			if n > best || n == best && v < common[k] {
				best, common[k] = n, v
			}
		}
	}
	for i, in := range ins {
		var d []string
		for k, v := range in.Settings {
			if c, ok := common[k]; ok && c != v {
				d = append(d, fmt.Sprintf("%s=%s (others: %s)", k, v, c))
			}
		}
		sort.Strings(d)
		ins[i].Differs = d
	}
}

// statusJobs returns the jobs of a status read's replies (the registry at
// index 2, pauses at 3, requests at 4) and of this Scheduler, with what
// those say; only job when not "".
func (s *Scheduler) statusJobs(replies []redlock.NodeReply, now time.Time, job string) ([]JobStatus, error) {
	l := s.locker
	registry := newest(replies, func(v any) any { return listAt(v, 2) }, stampKey)
	pauses := decodePauses(replies, func(v any) any { return listAt(v, 3) })
	reqs := decodeRequests(replies, func(v any) any { return listAt(v, 4) })
	local, _ := s.jobSet()
	names := map[string]bool{}
	for name := range registry {
		names[name] = true
	}
	for _, name := range local {
		names[name] = true
	}
	if job != "" {
		if !names[job] {
			return nil, fmt.Errorf("%w: no instance of the fleet has registered a job named %q", ErrUnknownJob, job)
		}
		names = map[string]bool{job: true}
	}
	var jobs []JobStatus
	for name := range names {
		j := JobStatus{Name: name}
		var tt timetable
		if _, found := slices.BinarySearch(local, name); found {
			tt = l.timetable(name)
		}
		if v, ok := registry[name]; ok {
			at, rest, _ := stamped(v)
			j.Registered, j.Stale = at, now.Sub(at) > staleRegistry
			var e jobEntry
			if json.Unmarshal([]byte(rest), &e) == nil {
				j.Schedule = e.Schedule
				if tt == nil {
					tt = decodeSchedule(e)
				}
			}
		}
		if tt != nil {
			j.Schedule = tt.String()
			j.Next = tt.next(l.cfg.clock.Now())
		}
		if p, ok := pauses[name]; ok {
			j.Paused, j.PausedBy, j.PausedAt = p.Paused, p.By, time.UnixMilli(p.At)
		}
		if r, ok := reqs[name]; ok {
			rn := &RunNowStatus{State: r.State, By: r.By, Asked: time.UnixMilli(r.Asked), Instance: r.Instance, Error: r.Error}
			if r.State == requestPending && now.Sub(r.stamp) >= requestLife {
				rn.State = "expired"
			}
			j.RunNow = rn
		}
		jobs = append(jobs, j)
	}
	slices.SortFunc(jobs, func(a, b JobStatus) int { return cmp.Compare(a.Name, b.Name) })
	return jobs, nil
}

// readJobs reads the newest n entries of each job's run record and the
// holder of its run lock, in one round of two scripts per node.
func (l *Locker) readJobs(ctx context.Context, jobs []JobStatus, n int) error {
	if len(jobs) == 0 {
		return nil
	}
	runKeys, lockKeys := make([]string, len(jobs)), make([]string, len(jobs))
	for i, j := range jobs {
		runKeys[i], lockKeys[i] = l.historyKey(j.Name), l.runKey(j.Name)
	}
	var holders []redlock.Holding
	var holdersErr error
	var wg sync.WaitGroup
	wg.Go(func() { holders, holdersErr = l.client.Holders(ctx, lockKeys) })
	replies, err := l.client.Eval(ctx, runsScript, runKeys, n)
	wg.Wait()
	now := l.cfg.clock.Now()
	for i := range jobs {
		j := &jobs[i]
		j.Runs = mergeRuns(replies, i, n)
		for _, r := range j.Runs {
			switch r.Kind {
			case kindMissed:
				j.Missed += max(r.Missed, 1)
			case kindLate:
				j.Late++
			}
		}
		if i < len(holders) && holders[i].Held {
			instance, since, _, _ := splitHolder(holders[i].Metadata)
			j.Running = &Running{Instance: instance, Since: since, ValidUntil: now.Add(holders[i].TTL)}
		}
	}
	if err != nil {
		return &textError{msg: "scheduler: reading the jobs' run records: " + redlock.ErrorText(err), errs: []error{err}}
	}
	if holdersErr != nil {
		return &textError{msg: "scheduler: reading the jobs' run locks: " + redlock.ErrorText(holdersErr), errs: []error{holdersErr}}
	}
	return nil
}

// mergeRuns returns the newest n entries of the run record at index i of
// a runs script's replies, merged from every node that answered.
func mergeRuns(replies []redlock.NodeReply, i, n int) []Run {
	seen := map[string]bool{}
	runs := []Run{}
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		list, _ := listAt(r.Val, i).([]any)
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
	return runs[:min(n, len(runs))]
}
