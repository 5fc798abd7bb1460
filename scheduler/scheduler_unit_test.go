package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
	"github.com/schedlock/schedlock/tracing"
)

// TestMain checks that no goroutine outlives the tests, except go-redis's
// pool probe of a node it could not dial PoolSize times in a row, which
// sees its client's Close only after its one-second sleep.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// newMiniScheduler returns a Scheduler over one fresh miniredis node, shut
// down when the test ends.
func newMiniScheduler(t *testing.T) *scheduler.Scheduler {
	t.Helper()
	c, _ := miniClient(t, 1)
	s, err := scheduler.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// twoLockers returns the Lockers of instances "a" and "b" over c, both on
// clock, without a start delay.
func twoLockers(tb testing.TB, c *redlock.Client, clock clockwork.Clock) (a, b *scheduler.Locker) {
	tb.Helper()
	a, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID("a"), scheduler.WithLockJitter(0))
	if err != nil {
		tb.Fatal(err)
	}
	b, err = scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID("b"), scheduler.WithLockJitter(0))
	if err != nil {
		tb.Fatal(err)
	}
	return a, b
}

// miniClient returns a redlock Client over n fresh miniredis nodes.
func miniClient(t testing.TB, n int) (*redlock.Client, []*miniredis.Miniredis) {
	t.Helper()
	var nodes []redis.UniversalClient
	var ms []*miniredis.Miniredis
	for range n {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { c.Close() })
		nodes = append(nodes, c)
		ms = append(ms, m)
	}
	c, err := redlock.New(nodes, redlock.WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, ms
}

func TestNewLockerRejectsBadConfig(t *testing.T) {
	c, _ := miniClient(t, 1)
	tests := []struct {
		name   string
		client *redlock.Client
		opts   []scheduler.LockerOption
		want   string
	}{
		{"nil client", nil, nil, "the *redlock.Client is nil"},
		{"tiny TTL", c, []scheduler.LockerOption{scheduler.WithTTL(time.Millisecond)}, "TTL 1ms"},
		{"negative tolerance", c, []scheduler.LockerOption{scheduler.WithClockTolerance(-time.Second)}, "clock tolerance -1s"},
		{"zero resolution", c, []scheduler.LockerOption{scheduler.WithTickResolution(0)}, "tick resolution 0s"},
		{"zero lock timeout", c, []scheduler.LockerOption{scheduler.WithLockTimeout(0)}, "lock timeout 0s"},
		{"nil option", c, []scheduler.LockerOption{nil}, "LockerOption 1 of 1 is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := scheduler.NewLocker(tt.client, tt.opts...)
			if l != nil || !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewLocker() = %v, %v; want ErrInvalidArgument naming %q", l, err, tt.want)
			}
		})
	}
}

func TestLockTellsBusyFromUnavailable(t *testing.T) {
	c, ms := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a, b := twoLockers(t, c, clock)
	ctx := context.Background()
	la, err := a.Lock(ctx, "report")
	if err != nil || la == nil {
		t.Fatalf("first Lock = %v, %v; want a lock", la, err)
	}
	lb, err := b.Lock(ctx, "report")
	var held *redlock.QuorumError
	if lb != nil || !errors.Is(err, scheduler.ErrHeldElsewhere) || errors.Is(err, redlock.ErrUnavailable) || !errors.As(err, &held) {
		t.Errorf("Lock of the same scheduled time on another instance = %v, %v; want nil, ErrHeldElsewhere with a *QuorumError", lb, err)
	} else if want := `scheduler: job "report" scheduled time 2026-01-01T12:00:00Z held by another instance: "a" took it`; err.Error() != want {
		t.Errorf("Lock error reads\n%s\nwant\n%s", err, want)
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	// Same scheduled time again after the run: taken on the nodes, and
	// already served by b: a late run.
	if lb, err := b.Lock(ctx, "report"); lb != nil || !errors.Is(err, scheduler.ErrLate) {
		t.Errorf("Lock of a finished scheduled time = %v, %v; want nil, ErrLate", lb, err)
	}
	// The next tick is free.
	clock.Advance(time.Second)
	lb, err = b.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("Lock of the next tick: %v", err)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Redis down: not "held elsewhere", and the node detail is there.
	for _, m := range ms[:2] {
		m.Close()
	}
	clock.Advance(time.Second)
	l, err := a.Lock(ctx, "report")
	var qerr *redlock.QuorumError
	if l != nil || !errors.Is(err, redlock.ErrUnavailable) || errors.Is(err, scheduler.ErrHeldElsewhere) || !errors.As(err, &qerr) {
		t.Errorf("Lock with 2 of 3 nodes down = %v, %v; want nil, ErrUnavailable with a *QuorumError", l, err)
	} else if want := `scheduler: job "report" scheduled time 2026-01-01T12:00:02Z skipped: Redis unavailable: lock "schedlock:job:report" not acquired: `; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Lock error reads\n%s\nwant it to start with\n%s", err, want)
	}
}

func TestLockOfEmptyNameIsAnError(t *testing.T) {
	c, _ := miniClient(t, 1)
	l, err := scheduler.NewLocker(c)
	if err != nil {
		t.Fatal(err)
	}
	lk, err := l.Lock(context.Background(), "")
	if lk != nil || !errors.Is(err, scheduler.ErrUnstableName) {
		t.Errorf("Lock(\"\") = %v, %v; want nil, ErrUnstableName", lk, err)
	}
}

func TestTickGrid(t *testing.T) {
	c, _ := miniClient(t, 1)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 7, 0, time.UTC))
	s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithClock(clock)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	task := gocron.NewTask(func() {})
	if _, err := s.NewJob(gocron.DurationJob(5*time.Second), task, gocron.WithName("every5")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("* * * * * *", true), task, gocron.WithName("cron")); err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		job  string
		now  time.Duration // after base
		want time.Duration
	}{
		{"cron", 7 * time.Second, 7 * time.Second},
		{"cron", 7*time.Second + 600*time.Millisecond, 7 * time.Second}, // fired late
		{"cron", 7*time.Second + 950*time.Millisecond, 7 * time.Second}, // queued
		{"cron", 7*time.Second - 100*time.Millisecond, 6 * time.Second},
		{"every5", 10*time.Second + 30*time.Millisecond, 10 * time.Second},
		{"every5", 10*time.Second - 50*time.Millisecond, 5 * time.Second},
		{"every5", 10*time.Second - time.Second, 5 * time.Second},
		{"every5", 14*time.Second + 800*time.Millisecond, 10 * time.Second}, // queued
		{"unknown", 3*time.Second + 5*time.Millisecond, 3 * time.Second},
	}
	for _, tt := range tests {
		clock.Advance(base.Add(tt.now).Sub(clock.Now()))
		if got := s.Locker().Tick(tt.job); !got.Equal(base.Add(tt.want)) {
			t.Errorf("Tick(%q) at +%v = %v, want +%v", tt.job, tt.now, got.Sub(base), tt.want)
		}
	}
}

func TestNewJobRejectsUnstableAndDuplicateNames(t *testing.T) {
	s := newMiniScheduler(t)
	def := gocron.DurationJob(time.Second)
	if _, err := s.NewJob(def, gocron.NewTask(func() {})); !errors.Is(err, scheduler.ErrUnstableName) {
		t.Errorf("NewJob of an unnamed closure = %v, want ErrUnstableName", err)
	}
	if _, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName("sync")); err != nil {
		t.Fatalf("NewJob named sync: %v", err)
	}
	if _, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName("sync")); !errors.Is(err, scheduler.ErrDuplicateName) {
		t.Errorf("second NewJob named sync = %v, want ErrDuplicateName", err)
	}
	if n := len(s.Jobs()); n != 1 {
		t.Errorf("jobs after the rejected ones = %d, want 1", n)
	}
}

// TestJobNameFreedByRemoveOrRename: a name is free again once its job was
// removed or renamed, also through the embedded gocron methods (which the
// name index does not see), and still taken while its job exists.
func TestJobNameFreedByRemoveOrRename(t *testing.T) {
	s := newMiniScheduler(t)
	def := gocron.DurationJob(time.Second)
	task := func() gocron.Task { return gocron.NewTask(func() {}) }
	a, err := s.NewJob(def, task(), gocron.WithName("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveJob(a.ID()); err != nil { // gocron's, not seen by the index
		t.Fatal(err)
	}
	if a, err = s.NewJob(def, task(), gocron.WithName("a")); err != nil {
		t.Fatalf("NewJob named a after the first a was removed = %v, want nil", err)
	}
	if _, err := s.Update(a.ID(), def, task(), gocron.WithName("b")); err != nil {
		t.Fatalf("Update renaming a to b: %v", err)
	}
	if _, err := s.NewJob(def, task(), gocron.WithName("a")); err != nil {
		t.Fatalf("NewJob named a after a was renamed to b = %v, want nil", err)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := s.NewJob(def, task(), gocron.WithName(name)); !errors.Is(err, scheduler.ErrDuplicateName) {
			t.Errorf("NewJob named %s while a job has it = %v, want ErrDuplicateName", name, err)
		}
	}
	if n := len(s.Jobs()); n != 2 {
		t.Errorf("jobs = %d, want 2 (a and b)", n)
	}
}

// BenchmarkRegisterJobs: adding 2,000 cron jobs to a new Scheduler. The
// duplicate-name check listed every job on each NewJob (gocron sorts them
// all), O(n² log n): 703 ms per 2,000 jobs (3.2 s for 4,000, where gocron
// alone takes 22 ms); with the name index, 14 ms.
func BenchmarkRegisterJobs(b *testing.B) {
	c, _ := miniClient(b, 1)
	def := gocron.CronJob("* * * * * *", true)
	for b.Loop() {
		s, err := scheduler.New(c)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 2000 {
			if _, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName(fmt.Sprintf("job-%d", i))); err != nil {
				b.Fatal(err)
			}
		}
		_ = s.Shutdown()
	}
}

// TestSimultaneousInstancesAlwaysElectOneRun: instances whose timers fire at
// the same instant can split the nodes between them (each wins a minority).
// A split is not "held elsewhere": every tick must still run exactly once.
// (Found by running the example with -skew 0.) miniredis serves each
// connection on its own goroutine, which interleaves the instances' scripts
// far more than a real server on loopback does, so splits happen often.
func TestSimultaneousInstancesAlwaysElectOneRun(t *testing.T) {
	var nodes []*miniredis.Miniredis
	for range 3 {
		nodes = append(nodes, miniredis.RunT(t))
	}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var lockers []*scheduler.Locker
	for i := range 3 {
		var clients []redis.UniversalClient
		for _, m := range nodes {
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { rdb.Close() })
			clients = append(clients, rdb)
		}
		c, err := redlock.New(clients)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		l, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID(fmt.Sprintf("i%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
	}
	ctx := context.Background()
	for tick := range 100 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var winners []gocron.Lock
		var errs []error
		start := make(chan struct{})
		for _, l := range lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				lk, err := l.Lock(ctx, "report")
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					winners = append(winners, lk)
				} else if !errors.Is(err, scheduler.ErrHeldElsewhere) {
					errs = append(errs, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 || len(errs) != 0 {
			t.Errorf("tick %d: %d winners, errors %v; want exactly 1 winner", tick, len(winners), errs)
		}
		for _, lk := range winners {
			_ = lk.Unlock(ctx)
		}
		clock.Advance(time.Second)
	}
}

func TestRunSpansShowWhoRanAndWhoSkipped(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var nodes []redis.UniversalClient
	for range 3 {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { rdb.Close() })
		nodes = append(nodes, rdb)
	}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	newLocker := func(id string) *scheduler.Locker {
		c, err := redlock.New(nodes, redlock.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		l, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID(id), scheduler.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := newLocker("a"), newLocker("b")
	jobCtx := context.Background()
	la, err := a.Lock(jobCtx, "report")
	if err != nil {
		t.Fatal(err)
	}
	runSpan := trace.SpanFromContext(a.RunContext(jobCtx))
	if _, err := b.Lock(jobCtx, "report"); !errors.Is(err, scheduler.ErrHeldElsewhere) {
		t.Fatalf("b.Lock = %v", err)
	}
	if err := la.Unlock(jobCtx); err != nil {
		t.Fatal(err)
	}
	var ran, skipped sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if !strings.HasPrefix(s.Name(), tracing.SpanJobRun+" ") {
			continue
		}
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		if m[tracing.Job].AsString() != "report" || m[tracing.Tick].AsString() != "2026-01-01T12:00:00.000Z" {
			t.Errorf("run span attributes = %v", s.Attributes())
		}
		if want := tracing.JobSpanName("report", m[tracing.Outcome].AsString()); s.Name() != want {
			t.Errorf("run span name %q, want %q", s.Name(), want)
		}
		switch m[tracing.Outcome].AsString() {
		case tracing.OutcomeRan:
			ran = s
		case tracing.OutcomeSkippedHeld:
			skipped = s
			if got := m[tracing.Holder].AsString(); got != "a" {
				t.Errorf("skipped run span: holder %q, want the winner's instance ID %q", got, "a")
			}
		}
	}
	if ran == nil || skipped == nil {
		t.Fatalf("run spans: ran %v, skipped %v", ran, skipped)
	}
	if ran.SpanContext().SpanID() != runSpan.SpanContext().SpanID() {
		t.Error("RunContext does not carry the run's span")
	}
	if skipped.Status().Code != codes.Unset {
		t.Errorf("skipped (held elsewhere) status = %v, want unset: contention is not an error", skipped.Status())
	}
	// The skipped instance's refused round links to the winner's trace.
	linked := false
	for _, s := range rec.Ended() {
		if s.Name() == tracing.RoundSpanName("acquire", tracing.OutcomeContended) && s.SpanContext().TraceID() == skipped.SpanContext().TraceID() {
			for _, link := range s.Links() {
				if link.SpanContext.TraceID() == ran.SpanContext().TraceID() {
					linked = true
				}
			}
		}
	}
	if !linked {
		t.Error("the skipped run's round has no link to the trace of the run that holds the tick")
	}
}

// TestJobNameIndexForgetsRemovedJobs: the name index is rebuilt from the
// scheduler's jobs as it grows, so names of removed jobs do not pile up,
// and duplicates are still found after a rebuild.
func TestJobNameIndexForgetsRemovedJobs(t *testing.T) {
	s := newMiniScheduler(t)
	def := gocron.CronJob("* * * * * *", true)
	keep, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName("keep"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 { // a rebuild whenever the index passes 2 x its last size + 64
		j, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName(fmt.Sprintf("gone-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.RemoveJob(j.ID()); err != nil {
			t.Fatal(err)
		}
	}
	if n := scheduler.IndexedNames(s); n > 200 {
		t.Errorf("name index holds %d names with 1 job left, want it rebuilt (at most 200)", n)
	}
	if _, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName("keep")); !errors.Is(err, scheduler.ErrDuplicateName) {
		t.Errorf("NewJob named keep while job %s has it = %v, want ErrDuplicateName", keep.ID(), err)
	}
}

// TestLateForALaterTakenTimeIsRecorded: a Lock refused because a later
// scheduled time of the job was already taken (its instance's clock is
// behind) is late: skipped with ErrLate and written to the run record, as
// a late run found on this instance is (it was only skipped).
func TestLateForALaterTakenTimeIsRecorded(t *testing.T) {
	c, _ := miniClient(t, 3)
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	a, err := scheduler.NewLocker(c, scheduler.WithClock(clockwork.NewFakeClockAt(at.Add(time.Second))),
		scheduler.WithInstanceID("a"), scheduler.WithLockJitter(0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := scheduler.NewLocker(c, scheduler.WithClock(clockwork.NewFakeClockAt(at)),
		scheduler.WithInstanceID("b"), scheduler.WithLockJitter(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	la, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if lb, err := b.Lock(ctx, "report"); lb != nil || !errors.Is(err, scheduler.ErrLate) {
		t.Fatalf("Lock of an earlier scheduled time on the instance behind = %v, %v; want nil, ErrLate", lb, err)
	}
	runs, err := a.History(ctx, "report", 10)
	if err != nil {
		t.Fatal(err)
	}
	var late []scheduler.Run
	for _, r := range runs {
		if r.Outcome == "late" {
			late = append(late, r)
		}
	}
	if len(late) != 1 || late[0].Instance != "b" || !late[0].Scheduled.Equal(at) || !strings.Contains(late[0].Error, "later scheduled time") {
		t.Errorf("late entries in the run record = %+v, want one of instance b for %v naming the later scheduled time", late, at)
	}
}
