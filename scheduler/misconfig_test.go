package scheduler_test

// Regression tests for the misconfigurations that passed silently and for
// the two quorum rounds per tick (issue 18), against real redis-server
// nodes.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
	"github.com/schedlock/schedlock/tracing"
)

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	return nil
}

// warnings returns the Warn records whose "warning" attribute is kind,
// each as its attributes.
func (h *logRecorder) warnings(kind string) []map[string]slog.Value {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range h.records {
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		if r.Level == slog.LevelWarn && attrs["warning"].String() == kind {
			out = append(out, attrs)
		}
	}
	return out
}

// warningCount returns the sum of schedlock.scheduler.warnings of kind.
func warningCount(t *testing.T, reader *sdkmetric.ManualReader, kind string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != tracing.MetricWarnings || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				if v, _ := dp.Attributes.Value(tracing.Warning); v.AsString() == kind {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// lockErrors collects the errors gocron passes to AfterLockError.
type lockErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *lockErrors) listener() gocron.JobOption {
	return gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
		e.mu.Lock()
		e.errs = append(e.errs, err)
		e.mu.Unlock()
	}))
}

func (e *lockErrors) matching(target error) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, err := range e.errs {
		if errors.Is(err, target) {
			n++
		}
	}
	return n
}

// TestUnnamedJobUnderNewLockerIsAnError: a job without gocron.WithName on a
// plain gocron scheduler with NewLocker ran under its function name
// ("main.main.func2") with only a log line on a discarded logger. Now
// every tick is skipped with ErrUnstableName through AfterLockError,
// warned once on the logger and counted.
func TestUnnamedJobUnderNewLockerIsAnError(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	c := newRedlock(t, cl.Clients(t))
	logs := &logRecorder{}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	locker, err := scheduler.NewLocker(c, scheduler.WithLogger(slog.New(logs)), scheduler.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	var ran atomic.Int32
	errs := &lockErrors{}
	if _, err := s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() { ran.Add(1) }), errs.listener()); err != nil {
		t.Fatal(err)
	}
	s.Start()
	waitFor(t, 5*time.Second, func() bool { return errs.matching(scheduler.ErrUnstableName) >= 3 })
	if n := ran.Load(); n != 0 {
		t.Errorf("the unnamed job ran %d times", n)
	}
	if w := logs.warnings("unstable_name"); len(w) != 1 {
		t.Errorf("%d unstable_name warnings logged, want 1 (once a minute)", len(w))
	}
	if n := warningCount(t, reader, "unstable_name"); n < 3 {
		t.Errorf("unstable_name counted %d times, want every tick (>= 3)", n)
	}
}

// TestDuplicateInstanceIDIsDetected: two live instances configured with the
// same instance ID took each other's ticks for split votes of their own
// and retried (26x the CPU, false "unavailable" errors), undetected. Now
// each tick still runs once, and the instance that finds the other's tick
// record reports ErrDuplicateInstance, warns and counts it.
func TestDuplicateInstanceIDIsDetected(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	rec := &recorder{}
	logs := &logRecorder{}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	errs := &lockErrors{}
	start := time.Now()
	for i := range 2 {
		startInstance(t, cl, rec, instanceSpec{id: i, def: gocron.CronJob("* * * * * *", true), jobTime: time.Millisecond,
			opts: []scheduler.LockerOption{scheduler.WithInstanceID("same"), scheduler.WithLogger(slog.New(logs)),
				scheduler.WithMeterProvider(mp)},
			jobOpts: []gocron.JobOption{errs.listener()}})
	}
	waitFor(t, 10*time.Second, func() bool { return errs.matching(scheduler.ErrDuplicateInstance) >= 2 })
	end := time.Now()
	judge(t, rec.snapshot(), time.Second, start.Add(time.Second), end.Add(-time.Second))
	if n := errs.matching(redlock.ErrUnavailable); n != 0 {
		t.Errorf("%d ticks reported Redis unavailable with every node up", n)
	}
	if len(logs.warnings("duplicate_instance")) == 0 || warningCount(t, reader, "duplicate_instance") < 2 {
		t.Errorf("duplicate_instance: %d warnings logged, %d counted", len(logs.warnings("duplicate_instance")),
			warningCount(t, reader, "duplicate_instance"))
	}
}

// TestClockSkewBeyondToleranceIsWarned: clocks further apart than the
// clock tolerance gave no warning, log or metric. Now an instance that
// finds a tick record written by an instance whose clock is off by more
// than the tolerance warns with the offset it measured (the record holds
// the writer's clock reading; its TTL left gives its age).
func TestClockSkewBeyondToleranceIsWarned(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	rec := &recorder{}
	logs := &logRecorder{}
	const skew = 450 * time.Millisecond // within 2x the tolerance: still once per tick
	start := time.Now()
	for i, off := range []time.Duration{0, -skew} {
		startInstance(t, cl, rec, instanceSpec{id: i, offset: off, def: gocron.CronJob("* * * * * *", true), jobTime: time.Millisecond,
			opts: []scheduler.LockerOption{scheduler.WithClockTolerance(300 * time.Millisecond), scheduler.WithLogger(slog.New(logs))}})
	}
	waitFor(t, 10*time.Second, func() bool { return len(logs.warnings("clock_skew")) > 0 })
	time.Sleep(2 * time.Second)
	judge(t, rec.snapshot(), time.Second, start.Add(time.Second), time.Now().Add(-time.Second))
	w := logs.warnings("clock_skew")
	if len(w) != 1 {
		t.Fatalf("%d clock_skew warnings, want 1 (once a minute)", len(w))
	}
	offset := w[0]["offset"].Duration()
	if offset < skew-100*time.Millisecond || offset > skew+100*time.Millisecond {
		t.Errorf("warned offset %v, want about %v", offset, skew)
	}
	if w := logs.warnings("settings_mismatch"); len(w) != 0 {
		t.Errorf("settings_mismatch warned for instances with the same settings: %v", w)
	}
}

// TestDifferentSchedulesAreWarned: instances that run a job on different
// schedules (a deploy that changes it) are warned about: the instance
// that finds a scheduled time not on its own schedule in the job's record
// warns settings_mismatch with both times; its own run is late, never a
// second run.
func TestDifferentSchedulesAreWarned(t *testing.T) {
	t.Parallel()
	c, _ := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 40, 0, time.UTC))
	logs := &logRecorder{}
	var lockers []*scheduler.Locker
	for i, every := range []time.Duration{10 * time.Second, 15 * time.Second} {
		s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithClock(clock), scheduler.WithLockJitter(0),
			scheduler.WithInstanceID(fmt.Sprint("i", i)), scheduler.WithLogger(slog.New(logs))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		if _, err := s.NewJob(gocron.DurationJob(every), gocron.NewTask(func() {}), gocron.WithName("job")); err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, s.Locker())
	}
	ctx := context.Background()
	lk, err := lockers[0].Lock(ctx, "job") // 12:00:40, on the 10 s grid
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	// 12:00:30 on the 15 s grid: a later time, not on this schedule, was taken.
	if lk, err := lockers[1].Lock(ctx, "job"); lk != nil || !errors.Is(err, scheduler.ErrLate) {
		t.Fatalf("Lock on the other schedule = %v, %v; want ErrLate", lk, err)
	}
	w := logs.warnings("settings_mismatch")
	if len(w) != 1 {
		t.Fatalf("%d settings_mismatch warnings, want 1", len(w))
	}
	if theirs, ours := w[0]["theirs"].Time(), w[0]["ours"].Time(); theirs.Second() != 40 || ours.Second() != 30 {
		t.Errorf("settings_mismatch warned theirs=%v ours=%v; want :40 and :30", theirs, ours)
	}
	if w := logs.warnings("clock_skew"); len(w) != 0 {
		t.Errorf("clock_skew warned for instances on one clock: %v", w)
	}
}

// TestOneRoundPerTick: the run lock and the job's record of scheduled
// times are taken in one script per node, and an instance that loses the
// scheduled time pays one script, to the node asked first, and nothing
// more (each tick cost two rounds, the record then the run lock, and
// later one script per node); the winner writes the run record once per
// node. A Locker with no fleet loop (no Scheduler) also
// reads the fleet's pauses once, in its first Lock (then at most once
// every three fleet polls): one more script per node.
func TestOneRoundPerTick(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	type instance struct {
		locker *scheduler.Locker
		client *redlock.Client
		calls  *commandCounter
	}
	var fleet []instance
	for _, id := range []string{"a", "b", "c"} {
		h := &commandCounter{}
		var nodes []redis.UniversalClient
		for _, s := range cl {
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
			rdb.AddHook(h)
			t.Cleanup(func() { _ = rdb.Close() })
			nodes = append(nodes, rdb)
		}
		c := newRedlock(t, nodes)
		l, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID(id))
		if err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, instance{l, c, h})
	}
	ctx := context.Background()
	lk, err := fleet[0].locker.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range fleet[1:] {
		if _, err := in.locker.Lock(ctx, "job"); !errors.Is(err, scheduler.ErrHeldElsewhere) {
			t.Fatalf("Lock = %v, want ErrHeldElsewhere", err)
		}
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i, in := range fleet {
		if err := in.client.Close(ctx); err != nil { // sends what is queued first
			t.Fatal(err)
		}
		// The read of the pauses (a quorum of nodes or more: it returns at
		// a quorum, and the call to a node not sent by then is dropped);
		// for the winner, one script per node and the release, which
		// writes the run record in the same script; for a loser, one
		// script to the node asked first, refused there by the record.
		n := in.calls.n.Load()
		if i == 0 && (n < 2+6 || n > 3+6) || i > 0 && (n < 2+1 || n > 3+1) {
			t.Errorf("instance %d sent %d lock commands, want %s", i, n, map[bool]string{true: "2..3 + 6", false: "2..3 + 1"}[i == 0])
		}
	}
	// What is left: the record of scheduled times on every node, and the
	// run record.
	records := 0
	for i, s := range cl {
		switch keys := s.Keys(t); {
		case len(keys) == 2 && keys[0] == "schedlock:runs:job" && keys[1] == "schedlock:taken:job":
			records++
		case len(keys) != 1 || keys[0] != "schedlock:runs:job":
			t.Errorf("node %d keys %q, want the records only", i, keys)
		}
	}
	if records != 3 {
		t.Errorf("the record of scheduled times is on %d nodes, want every node", records)
	}
}

// TestRandomIntervalJobIsRejected: a random-interval job ran several times
// as often across a fleet as on one instance, with no warning; NewJob now
// refuses it with ErrRandomSchedule.
func TestRandomIntervalJobIsRejected(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 1)
	s, err := scheduler.New(newRedlock(t, cl.Clients(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	_, err = s.NewJob(gocron.DurationRandomJob(time.Second, 2*time.Second), gocron.NewTask(func() {}), gocron.WithName("jitter"))
	if !errors.Is(err, scheduler.ErrRandomSchedule) {
		t.Fatalf("NewJob(DurationRandomJob) = %v, want ErrRandomSchedule", err)
	}
	if n := len(s.Jobs()); n != 0 {
		t.Errorf("%d jobs left after the refusal", n)
	}
}

// commandCounter is a go-redis hook that counts the lock commands sent
// (scripts and SET; not the connection set-up of go-redis).
type commandCounter struct{ n atomic.Int32 }

func (h *commandCounter) count(cmd redis.Cmder) {
	switch cmd.Name() {
	case "eval", "evalsha", "set":
		h.n.Add(1)
	}
}

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// newRedlock returns a Client over nodes, closed when the test ends.
func newRedlock(t testing.TB, nodes []redis.UniversalClient) *redlock.Client {
	t.Helper()
	c, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// waitFor polls cond until it holds, failing t after d.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", d)
		}
	}
}
