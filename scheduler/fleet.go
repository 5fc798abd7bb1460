package scheduler

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/tracing"
)

// The fleet's state on the nodes, beside the run records: what a status
// page shows of instances it does not run on (Status), and the controls
// every instance obeys (pause.go, runnow.go). Each is a hash under the
// Locker's prefix, on every node, written through Client.Eval (a write
// reaches each node that answers) and read as a merge of what a quorum
// of nodes holds. Values start with the writing node's clock in Unix ms
// (TIME in the script), so that a reader takes the newest per field and
// ages it on the nodes' clock:
//
//   - "<prefix>fleet:instances": instance ID -> "<ms>|<instanceEntry>",
//     the heartbeat of each instance whose fleet loop runs;
//   - "<prefix>fleet:jobs": job -> "<ms>|<jobEntry>", the registry of
//     jobs and their schedules, written by every instance for its jobs;
//   - "<prefix>fleet:paused" (pause.go) and "<prefix>fleet:runnow"
//     (runnow.go).
//
// The fleet loop of a Scheduler (Start to Shutdown) writes its instance's
// heartbeat and reads pauses and run-now requests in one script per node
// every poll (WithFleetPoll), and writes the registry of its jobs when it
// starts, when NewJob or Update changed them, and every registryEvery.
func (l *Locker) instancesKey() string { return l.cfg.prefix + "fleet:instances" }
func (l *Locker) registryKey() string  { return l.cfg.prefix + "fleet:jobs" }

const (
	// registryEvery is how often an instance writes its jobs to the
	// registry again: an entry older than staleRegistry is shown as
	// stale (a job that no running instance has any more).
	registryEvery = time.Minute
	staleRegistry = 3 * registryEvery
	// pruneAfter is how long an instance's heartbeat and a job's registry
	// entry stay on the nodes after their last write.
	pruneAfter = 24 * time.Hour
	// silentPolls: an instance whose heartbeat is older than this many of
	// its polls is shown as silent.
	silentPolls = 3
)

// DefaultFleetPoll is how often a Scheduler's fleet loop writes its
// heartbeat and reads pauses and run-now requests (WithFleetPoll).
//
// A pause is seen by an instance at its next successful poll: within one
// poll (plus the node timeout) after Pause returned; while its polls fail
// it keeps its last view.
const DefaultFleetPoll = time.Second

// WithFleetPoll sets how often the fleet loop of a Scheduler (from Start
// to Shutdown) writes this instance's heartbeat and reads the fleet's
// pauses and run-now requests: one script per node each time. A pause
// takes effect on every instance within about this long (plus the node
// timeout), and a run-now request is taken within it. A Locker with no
// fleet loop running (NewLocker, or a Scheduler not started) reads the
// pauses itself in a Lock, at most once every three polls. Default
// DefaultFleetPoll (1 s); NewLocker rejects values below 10 ms or above
// 1 min.
func WithFleetPoll(d time.Duration) LockerOption {
	return func(c *lockerConfig) { c.poll = d }
}

// instanceEntry is an instance's heartbeat.
type instanceEntry struct {
	Started  int64             `json:"started"`           // the fleet loop's start, instance clock, Unix ms
	Clock    int64             `json:"clock"`             // the instance's clock when it sent this, Unix ms
	Poll     int64             `json:"poll"`              // its poll interval, ms
	Jobs     int               `json:"jobs"`              // its number of jobs
	Offset   *int64            `json:"offset,omitempty"`  // its clock minus the nodes', µs, measured (offsetSample)
	OffErr   int64             `json:"offset_err"`        // how far off Offset may be, µs
	Stopped  bool              `json:"stopped,omitempty"` // written as its loop ended
	Settings map[string]string `json:"settings"`          // settings compared across instances
}

// jobEntry is a job's entry in the registry.
type jobEntry struct {
	Schedule string          `json:"schedule"`           // in words (timetable.String)
	Kind     string          `json:"kind,omitempty"`     // the gocron schedule's kind, for Spec
	Spec     json.RawMessage `json:"spec,omitempty"`     // the gocron schedule, to compute its next time
	Location string          `json:"location,omitempty"` // the scheduler's location
	Instance string          `json:"instance"`           // the instance that wrote it
}

// The fleet's scripts.
var (
	pollScript = redlock.NewScript(`-- Poll: write an instance's heartbeat, drop old
-- ones, and read the pauses and run-now requests.
-- KEYS[1] instances, KEYS[2] paused, KEYS[3] runnow (hashes).
-- ARGV[1] instance ID, ARGV[2] its entry ('' writes none), ARGV[3] ms
-- after which an instance's entry is dropped.
-- Reply: {node time in Unix ms, HGETALL paused, HGETALL runnow}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stamp = string.format('%.0f', now)
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], stamp .. '|' .. ARGV[2])
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local at = tonumber(string.match(all[i + 1], '^(%d+)|') or '')
    if not at or now - at > tonumber(ARGV[3]) then redis.call('HDEL', KEYS[1], all[i]) end
  end
end
return {stamp, redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])}`)
	registerScript = redlock.NewScript(`-- Register: write jobs' registry entries and drop
-- old ones.
-- KEYS[1] the registry (a hash). ARGV[1] ms after which an entry is
-- dropped; ARGV[2], ARGV[3], ... job, entry, job, entry...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stamp = string.format('%.0f', now)
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], stamp .. '|' .. ARGV[i + 1]) end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], '^(%d+)|') or '')
  if not at or now - at > tonumber(ARGV[1]) then redis.call('HDEL', KEYS[1], all[i]) end
end
return 1`)
)

// stamped splits a value "<ms>|<rest>" of a fleet hash; ok is false for
// any other value.
func stamped(v string) (at time.Time, rest string, ok bool) {
	ms, rest, found := strings.Cut(v, "|")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !found || err != nil {
		return time.Time{}, "", false
	}
	return time.UnixMilli(n), rest, true
}

// hashPairs returns a HGETALL reply as field, value pairs.
func hashPairs(v any) [][2]string {
	list, _ := v.([]any)
	var out [][2]string
	for i := 0; i+1 < len(list); i += 2 {
		f, _ := list[i].(string)
		x, _ := list[i+1].(string)
		out = append(out, [2]string{f, x})
	}
	return out
}

// newest merges the fields of a fleet hash from every node that
// answered: for each field, the value with the largest key (its stamp,
// or a version) wins.
func newest(replies []redlock.NodeReply, pick func(val any) any, key func(v string) (int64, bool)) map[string]string {
	out := map[string]string{}
	best := map[string]int64{}
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		for _, p := range hashPairs(pick(r.Val)) {
			k, ok := key(p[1])
			if !ok {
				continue
			}
			if b, seen := best[p[0]]; !seen || k > b {
				best[p[0]], out[p[0]] = k, p[1]
			}
		}
	}
	return out
}

// stampKey orders "<ms>|..." values by their stamp.
func stampKey(v string) (int64, bool) {
	at, _, ok := stamped(v)
	return at.UnixMilli(), ok
}

// settings returns the settings an instance shows the others, to be
// compared (Status: InstanceStatus.Differs); jobs is the fingerprint of
// its jobs and their schedules.
func (l *Locker) settings(jobs string) map[string]string {
	c := l.cfg
	return map[string]string{
		"ttl":              c.ttl.String(),
		"misfire":          c.misfire.String(),
		"clock_tolerance":  c.tolerance.String(),
		"lock_timeout":     c.lockTimeout.String(),
		"lock_jitter":      c.jitter.String(),
		"catch_up":         c.catchUp.String(),
		"history":          strconv.Itoa(c.history),
		"record_retention": c.retention.String(),
		"location":         c.location.String(),
		"tick_resolution":  c.resolution.String(),
		"fleet_poll":       c.poll.String(),
		"version":          tracing.Version,
		"jobs":             jobs,
	}
}

// fleetLoop is a Scheduler's fleet loop, from Start to Shutdown (or
// StopJobs): heartbeat, registry, pauses and run-now requests.
type fleetLoop struct {
	s      *Scheduler
	cancel context.CancelFunc
	done   chan struct{}
	runs   sync.WaitGroup // run-now requests being run

	samples []offsetSample // the clock offsets of the last offsetSamples polls (the loop's goroutine only)
}

// offsetSample is one poll's measure of this instance's clock against
// the nodes': the clock read before the poll, plus half the poll's round
// trip, minus the nodes' time in the reply; err is that half round trip,
// the most the measure can be off by.
type offsetSample struct{ offset, err time.Duration }

// offsetSamples is how many polls the offset is taken from: the one with
// the shortest round trip, whose measure waited least in queues (as NTP
// picks its best sample).
const offsetSamples = 16

// startFleet starts the Scheduler's fleet loop unless it runs.
func (s *Scheduler) startFleet() {
	s.fleetMu.Lock()
	defer s.fleetMu.Unlock()
	if s.fleet != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleetLoop{s: s, cancel: cancel, done: make(chan struct{})}
	s.fleet = f
	s.locker.watch(1) // from now on, Locks leave reading the pauses to the loop
	go f.run(ctx)
}

// stopFleet tells the fleet loop, if it runs, to stop, and returns a
// function that waits for it and the run-now requests it started (its
// last heartbeat, bounded by the node timeout, says it stopped), so that
// gocron's shutdown need not wait for that.
func (s *Scheduler) stopFleet() (wait func()) {
	s.fleetMu.Lock()
	f := s.fleet
	s.fleet = nil
	s.fleetMu.Unlock()
	if f == nil {
		return func() {}
	}
	f.cancel()
	return func() { <-f.done }
}

// run polls until ctx ends.
func (f *fleetLoop) run(ctx context.Context) {
	defer close(f.done)
	l := f.s.locker
	defer l.watch(-1)
	started := l.cfg.clock.Now().UnixMilli()
	var registered uint64
	var registeredAt time.Time
	t := time.NewTicker(l.cfg.poll)
	defer t.Stop()
	for {
		if v := f.s.jobsVersion.Load(); v != registered || time.Since(registeredAt) >= registryEvery {
			if f.register(ctx) {
				registered, registeredAt = v, time.Now()
			}
		}
		f.poll(ctx, started, false)
		select {
		case <-ctx.Done():
			f.runs.Wait()
			// The last heartbeat says that this instance stopped.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.client.NodeTimeout())
			f.poll(sctx, started, true)
			cancel()
			return
		case <-t.C:
		}
	}
}

// poll writes the heartbeat, and reads the pauses (for the Locker's
// claims) and the run-now requests (served here).
func (f *fleetLoop) poll(ctx context.Context, started int64, stopped bool) {
	l := f.s.locker
	jobs, fingerprint := f.s.jobSet()
	sent, clock := time.Now(), l.cfg.clock.Now()
	e := instanceEntry{Started: started, Clock: clock.UnixMilli(), Poll: l.cfg.poll.Milliseconds(),
		Jobs: len(jobs), Stopped: stopped, Settings: l.settings(fingerprint)}
	if best, ok := f.bestOffset(); ok {
		us := best.offset.Microseconds()
		e.Offset, e.OffErr = &us, best.err.Microseconds()
	}
	entry, _ := json.Marshal(e)
	pctx, cancel := context.WithTimeout(ctx, l.client.NodeTimeout())
	defer cancel()
	replies, err := l.client.Eval(pctx, pollScript, []string{l.instancesKey(), l.pausedKey(), l.requestsKey()},
		l.cfg.instance, string(entry), pruneAfter.Milliseconds())
	if err != nil {
		if ctx.Err() == nil {
			l.log.Debug("scheduler: fleet poll failed; pauses are read again at the next poll", "err", err)
		}
		return
	}
	if node := nodeTime(replies, 0); !node.IsZero() {
		half := time.Since(sent) / 2
		f.samples = append(f.samples, offsetSample{offset: clock.Add(half).Sub(node), err: half + time.Millisecond}) // the nodes' time is in ms
		if len(f.samples) > offsetSamples {
			f.samples = f.samples[1:]
		}
	}
	l.setPauses(readPauses(replies))
	if stopped {
		return
	}
	reqs, now := readRequests(replies)
	f.serve(ctx, reqs, now, jobs)
}

// bestOffset returns the sample of the shortest round trip, if any.
func (f *fleetLoop) bestOffset() (offsetSample, bool) {
	if len(f.samples) == 0 {
		return offsetSample{}, false
	}
	return slices.MinFunc(f.samples, func(a, b offsetSample) int { return cmp.Compare(a.err, b.err) }), true
}

// register writes the registry entries of the Scheduler's jobs; false
// when it failed (tried again at the next poll).
func (f *fleetLoop) register(ctx context.Context) bool {
	l := f.s.locker
	args := []any{pruneAfter.Milliseconds()}
	for _, j := range f.s.Scheduler.Jobs() {
		e := l.registryEntry(j)
		b, err := json.Marshal(e)
		if err != nil {
			continue
		}
		args = append(args, j.Name(), string(b))
	}
	rctx, cancel := context.WithTimeout(ctx, l.client.NodeTimeout())
	defer cancel()
	if _, err := l.client.Eval(rctx, registerScript, []string{l.registryKey()}, args...); err != nil {
		if ctx.Err() == nil {
			l.log.Debug("scheduler: writing the job registry failed; tried again at the next poll", "err", err)
		}
		return false
	}
	return true
}

// registryEntry returns the registry entry of job j.
func (l *Locker) registryEntry(j gocron.Job) jobEntry {
	e := jobEntry{Schedule: l.timetable(j.Name()).String(), Location: l.cfg.location.String(), Instance: l.cfg.instance}
	if kind, spec, ok := encodeSchedule(j.Schedule()); ok {
		e.Kind, e.Spec = kind, spec
	}
	return e
}

// jobSet returns the names of the Scheduler's jobs, sorted, and a short
// hash of them with their schedules: instances that differ in it run
// different jobs, or the same jobs on different schedules. It is cached
// until NewJob or Update change the jobs, or for registryEvery (jobs
// removed through gocron's own methods).
func (s *Scheduler) jobSet() (names []string, fingerprint string) {
	s.fingerMu.Lock()
	defer s.fingerMu.Unlock()
	v := s.jobsVersion.Load()
	if s.fingerTime.IsZero() || s.fingerAt != v || time.Since(s.fingerTime) >= registryEvery {
		var lines []string
		names = nil
		for _, j := range s.Scheduler.Jobs() {
			names = append(names, j.Name())
			lines = append(lines, j.Name()+"\x00"+s.locker.timetable(j.Name()).String())
		}
		slices.Sort(names)
		slices.SortFunc(lines, cmp.Compare)
		sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
		s.jobList, s.finger, s.fingerAt, s.fingerTime = names, hex.EncodeToString(sum[:6]), v, time.Now()
	}
	return s.jobList, s.finger
}

// encodeSchedule returns a gocron schedule as its kind and JSON, for a
// reader without the job to compute its next scheduled time
// (decodeSchedule); ok is false for a kind it does not know.
func encodeSchedule(s gocron.JobSchedule) (kind string, spec json.RawMessage, ok bool) {
	switch s.(type) {
	case gocron.CronJobSchedule:
		kind = "cron"
	case gocron.DurationJobSchedule:
		kind = "duration"
	case gocron.DailyJobSchedule:
		kind = "daily"
	case gocron.WeeklyJobSchedule:
		kind = "weekly"
	case gocron.MonthlyJobSchedule:
		kind = "monthly"
	case gocron.OneTimeJobSchedule:
		kind = "once"
	default:
		return "", nil, false
	}
	b, err := json.Marshal(s)
	return kind, b, err == nil
}

// decodeSchedule returns the timetable of a registry entry, or nil.
func decodeSchedule(e jobEntry) timetable {
	var s gocron.JobSchedule
	var err error
	switch e.Kind {
	case "cron":
		s, err = decodeAs[gocron.CronJobSchedule](e.Spec)
	case "duration":
		s, err = decodeAs[gocron.DurationJobSchedule](e.Spec)
	case "daily":
		s, err = decodeAs[gocron.DailyJobSchedule](e.Spec)
	case "weekly":
		s, err = decodeAs[gocron.WeeklyJobSchedule](e.Spec)
	case "monthly":
		s, err = decodeAs[gocron.MonthlyJobSchedule](e.Spec)
	case "once":
		s, err = decodeAs[gocron.OneTimeJobSchedule](e.Spec)
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	loc, err := time.LoadLocation(e.Location)
	if err != nil {
		return nil
	}
	tt, err := newTimetable(s, loc)
	if err != nil {
		return nil
	}
	return tt
}

func decodeAs[T gocron.JobSchedule](raw json.RawMessage) (gocron.JobSchedule, error) {
	var s T
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding a %T: %w", s, err)
	}
	return s, nil
}

// controlTimeout is how long the fleet controls (Pause, Resume,
// RequestRun) wait for each node: they are rare and asked by a person, so
// a node slower than a lock round's node timeout should not refuse them.
const controlTimeout = time.Second

var lookupScript = redlock.NewScript(`-- Lookup: job ARGV[1]'s registry entry and run-now
-- request. KEYS[1] the registry, KEYS[2] the requests (hashes).
-- Reply: {entry or false, request or false}.
return {redis.call('HGET', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1])}`, redlock.WithScriptTimeout(controlTimeout))

// lookup reads whether job is in the fleet's registry, and its latest
// run-now request (Seq 0: none), from a quorum of nodes. Errors: an error
// matching redlock.ErrUnavailable when fewer than a quorum answered.
func (l *Locker) lookup(ctx context.Context, job string) (registered bool, req requestEntry, err error) {
	replies, err := l.client.Eval(ctx, lookupScript, []string{l.registryKey(), l.requestsKey()}, job)
	if err != nil {
		return false, requestEntry{}, &textError{msg: fmt.Sprintf("scheduler: looking up job %q in the fleet's registry: %s", job, redlock.ErrorText(err)), errs: []error{err}}
	}
	for _, r := range replies {
		if r.Err != nil {
			continue
		}
		if _, ok := listAt(r.Val, 0).(string); ok {
			registered = true
		}
		if v, ok := listAt(r.Val, 1).(string); ok {
			if e, ok := parseRequest(v); ok && e.Seq > req.Seq {
				req = e
			}
		}
	}
	return registered, req, nil
}

// known returns an error matching ErrUnknownJob unless job is in the
// fleet's registry or is one of this Scheduler's jobs.
func (s *Scheduler) known(ctx context.Context, job string) (requestEntry, error) {
	registered, req, err := s.locker.lookup(ctx, job)
	if err != nil {
		return req, err
	}
	if !registered && s.job(job) == nil {
		return req, fmt.Errorf("%w: no instance of the fleet has registered a job named %q (its registry is written when an instance starts, and every minute)", ErrUnknownJob, job)
	}
	return req, nil
}
