package otlp_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
	"github.com/schedlock/schedlock/tracing"
)

// TestJaegerShowsWhoRanEachTick: three scheduler instances try one tick of
// a job; in Jaeger's search list each trace is named for the job and what
// happened on that instance, and a skipped one names the instance that ran
// the tick.
func TestJaegerShowsWhoRanEachTick(t *testing.T) {
	j := startJaeger(t)
	const service = "schedlock-e2e-fleet"
	exportTo(t, "http/protobuf", j.otlpHTTP, service)
	ctx := context.Background()
	flush := setupExport(t, service)
	nodes := miniNodes(t)
	var lockers []*scheduler.Locker
	for i := range 3 {
		c, err := redlock.New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		l, err := scheduler.NewLocker(c, scheduler.WithInstanceID("billing/web-"+strconv.Itoa(i+1)), scheduler.WithLockJitter(0))
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
	}
	// Not at a tick's edge, so that all three serve the same tick.
	if ms := time.Now().UnixMilli() % 1000; ms > 700 {
		time.Sleep(time.Duration(1050-ms) * time.Millisecond)
	}
	run, err := lockers[0].Lock(ctx, "report")
	if err != nil {
		t.Fatalf("first Lock: %v", err)
	}
	for _, l := range lockers[1:] {
		if _, err := l.Lock(ctx, "report"); !errors.Is(err, scheduler.ErrHeldElsewhere) {
			t.Fatalf("Lock of another instance = %v, want ErrHeldElsewhere", err)
		}
	}
	if err := run.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	flush()

	ran, skipped := tracing.JobSpanName("report", tracing.OutcomeRan), tracing.JobSpanName("report", tracing.OutcomeSkippedHeld)
	err = poll(ctx, 10*time.Second, func(ctx context.Context) error {
		traces, err := j.search(ctx, service, nil)
		if err != nil {
			return err
		}
		var roots []string
		for i := range traces {
			if r := rootOf(&traces[i]); r != nil {
				roots = append(roots, r.OperationName)
				if r.OperationName == skipped && r.str(string(tracing.Holder)) != "billing/web-1" {
					return fmt.Errorf("%q names holder %q, want billing/web-1", skipped, r.str(string(tracing.Holder)))
				}
				if r.OperationName == skipped && !slices.ContainsFunc(traces[i].Spans, func(s jSpan) bool {
					return s.OperationName == tracing.RoundSpanName("acquire", tracing.OutcomeContended)
				}) {
					return fmt.Errorf("%q has no contended round", skipped)
				}
			}
		}
		slices.Sort(roots)
		if want := []string{ran, skipped, skipped}; !slices.Equal(roots, want) {
			return fmt.Errorf("%w: root spans %q, want %q", errNotYet, roots, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("traces in Jaeger: %v", err)
	}
}

// TestJaegerShowsARunningLeadersTerm: a leader's term can be found in
// Jaeger within 5 s of its start, while it lasts, with its renewals as
// traces of their own linked to the term's start; its end comes as a span
// of its own.
func TestJaegerShowsARunningLeadersTerm(t *testing.T) {
	j := startJaeger(t)
	const service = "schedlock-e2e-leader"
	exportTo(t, "http/protobuf", j.otlpHTTP, service)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "1000") // ms; the default is 5000
	ctx := context.Background()
	flush := setupExport(t, service)
	c, err := redlock.New(miniNodes(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	started := make(chan time.Time, 1)
	e, err := elector.New(c, "e2e", elector.WithIdentity("billing/web-1"),
		elector.WithLeaseTTL(900*time.Millisecond), elector.WithRetryPeriod(50*time.Millisecond),
		elector.OnStartedLeading(func(ctx context.Context) {
			started <- time.Now()
			<-ctx.Done()
		}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	var leadAt time.Time
	select {
	case leadAt = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the candidate never led")
	}

	// Within 5 s of the start, while the term runs.
	var start *jSpan
	err = poll(ctx, time.Until(leadAt.Add(5*time.Second)), func(ctx context.Context) error {
		traces, err := j.search(ctx, service, nil)
		if err != nil {
			return err
		}
		start = nil
		for i := range traces {
			if r := rootOf(&traces[i]); r != nil && r.OperationName == tracing.SpanTermStarted {
				start = r
			}
		}
		if start == nil {
			return fmt.Errorf("%w: no %q span", errNotYet, tracing.SpanTermStarted)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("5 s after the term started: %v", err)
	}
	if start.num(string(tracing.Term)) < 1 || start.str(string(tracing.Identity)) != "billing/web-1" {
		t.Errorf("%q tags %v; want a term and the identity billing/web-1", tracing.SpanTermStarted, short(start.Tags))
	}
	if e.IsLeader(ctx) != nil {
		t.Fatal("the term ended before the checks: they must see a running term")
	}
	followsStart := func(s *jSpan) bool {
		return slices.ContainsFunc(s.References, func(r jRef) bool {
			return r.RefType == "FOLLOWS_FROM" && r.TraceID == start.TraceID && r.SpanID == start.SpanID
		})
	}
	// Renewals (every 300 ms), each a trace of its own linked to the start.
	err = poll(ctx, 10*time.Second, func(ctx context.Context) error {
		traces, err := j.search(ctx, service, nil)
		if err != nil {
			return err
		}
		renewals := 0
		for i := range traces {
			if r := rootOf(&traces[i]); r != nil && r.OperationName == tracing.SpanExtend && followsStart(r) {
				renewals++
			}
		}
		if renewals < 2 {
			return fmt.Errorf("%w: %d renewals linked to the term's start", errNotYet, renewals)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("renewals in Jaeger: %v", err)
	}

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil // for the cleanup
	flush()
	err = poll(ctx, 10*time.Second, func(ctx context.Context) error {
		traces, err := j.search(ctx, service, nil)
		if err != nil {
			return err
		}
		for i := range traces {
			if r := rootOf(&traces[i]); r != nil && r.OperationName == tracing.SpanTermEnded && followsStart(r) {
				if got := r.str(string(tracing.Outcome)); got != tracing.OutcomeResigned {
					return fmt.Errorf("%q outcome %q, want %q", tracing.SpanTermEnded, got, tracing.OutcomeResigned)
				}
				return nil
			}
		}
		return fmt.Errorf("%w: no %q linked to the term's start", errNotYet, tracing.SpanTermEnded)
	})
	if err != nil {
		t.Fatalf("the term's end in Jaeger: %v", err)
	}
}
