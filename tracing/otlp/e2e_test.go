package otlp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/tracing"
	"github.com/schedlock/schedlock/tracing/otlp"
)

// TestJaegerShowsContendedAcquisition runs a contended acquisition and a
// failed one against three real redis-server nodes, exports them to a real
// Jaeger over OTLP/HTTP through Setup, and reads them back from Jaeger's
// query API, as its UI would.
//
// With SCHEDLOCK_E2E_TRACE_OUT=file it also writes the waiter's trace, as
// Jaeger returned it (GET /api/traces/{id}), to file: docs/observability.md
// shows one.
func TestJaegerShowsContendedAcquisition(t *testing.T) {
	j := startJaeger(t)
	cl := redlocktest.Start(t, 3)
	const service = "schedlock-e2e"
	exportTo(t, "http/protobuf", j.otlpHTTP, service)
	ctx := context.Background()
	flush := setupExport(t, "unused: OTEL_SERVICE_NAME wins")

	// No telemetry options: the Clients record through the globals.
	newClient := func(opts ...redlock.Option) *redlock.Client {
		c, err := redlock.New(cl.Clients(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	holder, waiter := newClient(), newClient()
	broken := newClient(redlock.WithNodeTimeout(100 * time.Millisecond))

	// The holder's job holds the lock for 300 ms while the waiter retries.
	jobCtx, job := otel.Tracer("schedlock-e2e").Start(ctx, "holder-job")
	held, err := holder.Acquire(jobCtx, []string{"report"}, 5*time.Second, redlock.WithMetadata("instance-a"))
	if err != nil {
		t.Fatalf("holder Acquire: %v", err)
	}
	released := make(chan error, 1)
	time.AfterFunc(300*time.Millisecond, func() {
		released <- held.Release(jobCtx)
		job.End()
	})
	start := time.Now()
	l, err := waiter.Acquire(ctx, []string{"report"}, 5*time.Second, redlock.WithMetadata("instance-b"))
	if err != nil {
		t.Fatalf("waiter Acquire: %v", err)
	}
	waited := time.Since(start)
	if err := <-released; err != nil {
		t.Fatalf("holder Release: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("waiter Release: %v", err)
	}
	if waited < 200*time.Millisecond {
		t.Fatalf("waiter got the lock after %v, before the holder released it", waited)
	}

	// A majority of nodes down: TryAcquire fails with ErrUnavailable.
	cl[1].Kill(t)
	cl[2].Kill(t)
	if _, err := broken.TryAcquire(ctx, []string{"nightly"}, time.Second); !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("TryAcquire with 2 of 3 nodes down = %v, want ErrUnavailable", err)
	}

	flush()

	// Read the traces back: the holder's, the waiter's and the failure's.
	var holderTrace, waiterTrace, failedTrace *jTrace
	err = poll(ctx, 10*time.Second, func(ctx context.Context) error {
		traces, err := j.search(ctx, service, nil)
		if err != nil {
			return err
		}
		holderTrace, waiterTrace, failedTrace = nil, nil, nil
		for i := range traces {
			tr := &traces[i]
			switch root := rootOf(tr); {
			case root == nil:
			case root.OperationName == "holder-job":
				holderTrace = tr
			case root.OperationName == tracing.SpanAcquire:
				waiterTrace = tr
			case root.OperationName == tracing.SpanTryAcquire:
				failedTrace = tr
			}
		}
		if holderTrace == nil || waiterTrace == nil || failedTrace == nil {
			return fmt.Errorf("%w: %d traces of %s: holder %v, waiter %v, failed %v",
				errNotYet, len(traces), service, holderTrace != nil, waiterTrace != nil, failedTrace != nil)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("traces in Jaeger: %v", err)
	}

	// The holder: holder-job > redlock.Acquire > redlock.round (granted).
	holderAcquire := only(t, holderTrace, tracing.SpanAcquire)
	if p := parentOf(holderAcquire); p == nil || p.SpanID != rootOf(holderTrace).SpanID {
		t.Errorf("holder's redlock.Acquire references %v, want CHILD_OF holder-job", holderAcquire.References)
	}

	// The waiter: redlock.Acquire with several acquire rounds, contended
	// then granted.
	acquire := only(t, waiterTrace, tracing.SpanAcquire)
	if got := acquire.str(string(tracing.Outcome)); got != tracing.OutcomeGranted {
		t.Errorf("waiter redlock.Acquire %s = %q, want %s", tracing.Outcome, got, tracing.OutcomeGranted)
	}
	if got := acquire.str(string(tracing.Resources)); got != `["report"]` {
		t.Errorf("waiter redlock.Acquire %s = %q, want [\"report\"]", tracing.Resources, got)
	}
	var contended, granted, waits int
	for _, s := range waiterTrace.Spans {
		// Nothing failed: no span of the waiter's trace is an error, not
		// even the rounds that undo a refused attempt.
		if isError(&s) {
			t.Errorf("%s (%s=%s, %s=%s) in the waiter's trace has status Error, error.type %q: contention is not an error",
				s.OperationName, tracing.RoundOp, s.str(string(tracing.RoundOp)), tracing.Outcome, s.str(string(tracing.Outcome)), s.str("error.type"))
		}
		if strings.HasPrefix(s.OperationName, tracing.SpanWait+" ") {
			waits++
			checkWait(t, &s, acquire, holderTrace, holderAcquire)
			continue
		}
		if s.str(string(tracing.RoundOp)) != "acquire" {
			continue
		}
		if want := tracing.RoundSpanName("acquire", s.str(string(tracing.Outcome))); s.OperationName != want {
			t.Errorf("round %s is named %q, want %q", s.SpanID, s.OperationName, want)
		}
		if p := parentOf(&s); p == nil || p.SpanID != acquire.SpanID {
			t.Errorf("round %s references %v, want CHILD_OF the waiter's redlock.Acquire %s", s.SpanID, s.References, acquire.SpanID)
		}
		for _, key := range []string{
			string(tracing.RoundAttempt), string(tracing.Nodes), string(tracing.Quorum),
			string(tracing.VotesOK), string(tracing.VotesHeld), string(tracing.VotesError), string(tracing.VotesTimeout),
			string(tracing.NodeAddresses), string(tracing.NodeOutcomes), string(tracing.NodeLatencies),
		} {
			if _, ok := s.tag(key); !ok {
				t.Errorf("round %s (attempt %s) has no tag %s; tags %v", s.SpanID, s.str(string(tracing.RoundAttempt)), key, short(s.Tags))
			}
		}
		if s.num(string(tracing.Nodes)) != 3 || s.num(string(tracing.Quorum)) != 2 {
			t.Errorf("round nodes %v, quorum %v; want 3, 2", s.num(string(tracing.Nodes)), s.num(string(tracing.Quorum)))
		}
		var outcomes []string
		if err := json.Unmarshal([]byte(s.str(string(tracing.NodeOutcomes))), &outcomes); err != nil || len(outcomes) != 3 {
			t.Errorf("round %s = %q, want a JSON list of 3 outcomes (%v)", tracing.NodeOutcomes, s.str(string(tracing.NodeOutcomes)), err)
		}
		switch s.str(string(tracing.Outcome)) {
		case tracing.OutcomeContended:
			contended++
			if s.num(string(tracing.VotesHeld)) < 2 || s.str(string(tracing.Holder)) != "instance-a" {
				t.Errorf("contended round: votes.held %v, holder %q; want >= 2, instance-a", s.num(string(tracing.VotesHeld)), s.str(string(tracing.Holder)))
			}
			if isError(&s) {
				t.Errorf("contended round %s is marked as an error (tags %v): contention is not an error", s.SpanID, short(s.Tags))
			}
			// The link to the holder: Jaeger's v1 API shows span links as
			// FOLLOWS_FROM references (parents are CHILD_OF).
			linked := slices.ContainsFunc(s.References, func(r jRef) bool {
				return r.RefType == "FOLLOWS_FROM" && r.TraceID == holderTrace.TraceID && r.SpanID == holderAcquire.SpanID
			})
			if !linked {
				t.Errorf("contended round %s references %v; want FOLLOWS_FROM the holder's redlock.Acquire %s in trace %s",
					s.SpanID, s.References, holderAcquire.SpanID, holderTrace.TraceID)
			}
		case tracing.OutcomeGranted:
			granted++
			if v := s.num(string(tracing.ValidityMillis)); v < 4000 || v > 5000 {
				t.Errorf("granted round %s = %v, want about 5000 - drift", tracing.ValidityMillis, v)
			}
		}
	}
	if contended == 0 || granted != 1 {
		t.Errorf("waiter's acquire rounds: %d contended, %d granted; want some and 1", contended, granted)
	}
	if waits != contended {
		t.Errorf("waiter's trace has %d wait spans, want one after each of its %d contended rounds", waits, contended)
	}
	if got := acquire.num(string(tracing.Attempts)); got != float64(contended+1) {
		t.Errorf("waiter %s = %v, want %d", tracing.Attempts, got, contended+1)
	}

	// The failure: status Error and error.type on the operation and its round.
	tryAcquire := only(t, failedTrace, tracing.SpanTryAcquire)
	failedRound := tracing.RoundSpanName("acquire", tracing.OutcomeUnavailable)
	only(t, failedTrace, failedRound)
	for _, s := range failedTrace.Spans {
		if s.OperationName != tracing.SpanTryAcquire && s.OperationName != failedRound {
			continue
		}
		if !isError(&s) || s.str("error.type") != tracing.ErrorTypeUnavailable {
			t.Errorf("%s: error %v, error.type %q; want error, %s (tags %v)",
				s.OperationName, isError(&s), s.str("error.type"), tracing.ErrorTypeUnavailable, short(s.Tags))
		}
	}

	// Searches as in docs/observability.md: by error.type and by outcome.
	found, err := j.search(ctx, service, map[string]string{"error.type": tracing.ErrorTypeUnavailable})
	if err != nil {
		t.Fatal(err)
	}
	if ids := traceIDs(found); !slices.Equal(ids, []string{failedTrace.TraceID}) {
		t.Errorf("search error.type=%s found traces %v, want only the failed TryAcquire's %s (span %s)",
			tracing.ErrorTypeUnavailable, ids, failedTrace.TraceID, tryAcquire.SpanID)
	}
	found, err = j.search(ctx, service, map[string]string{string(tracing.Outcome): tracing.OutcomeContended})
	if err != nil {
		t.Fatal(err)
	}
	if ids := traceIDs(found); !slices.Equal(ids, []string{waiterTrace.TraceID}) {
		t.Errorf("search %s=%s found traces %v, want only the waiter's %s", tracing.Outcome, tracing.OutcomeContended, ids, waiterTrace.TraceID)
	}

	if out := os.Getenv("SCHEDLOCK_E2E_TRACE_OUT"); out != "" {
		body, err := j.get(ctx, "/api/traces/"+waiterTrace.TraceID)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, body, 0o644); err != nil {
			t.Fatal(err)
		}
		hbody, err := j.get(ctx, "/api/traces/"+holderTrace.TraceID)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out+".holder.json", hbody, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the waiter's trace to %s, the holder's to %s.holder.json", out, out)
	}
}

// TestJaegerReceivesOverGRPC: OTEL_EXPORTER_OTLP_PROTOCOL=grpc works too.
func TestJaegerReceivesOverGRPC(t *testing.T) {
	j := startJaeger(t)
	const service = "schedlock-e2e-grpc"
	exportTo(t, "grpc", j.otlpGRPC, service)
	ctx := context.Background()
	shutdown, err := otlp.Setup(ctx, service)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	c, err := redlock.New(miniNodes(t))
	if err != nil {
		_ = shutdown(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	l, err := c.TryAcquire(ctx, []string{"grpc"}, time.Second)
	if err == nil {
		err = l.Release(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if serr := shutdown(sctx); err != nil || serr != nil {
		t.Fatalf("TryAcquire/Release: %v; shutdown: %v", err, serr)
	}
	err = poll(ctx, 10*time.Second, func(ctx context.Context) error {
		traces, err := j.search(ctx, service, nil)
		if err != nil {
			return err
		}
		var ops []string
		for _, tr := range traces {
			for _, s := range tr.Spans {
				ops = append(ops, s.OperationName)
			}
		}
		if !slices.Contains(ops, tracing.SpanTryAcquire) || !slices.Contains(ops, tracing.SpanRelease) {
			return fmt.Errorf("%w: operations %v", errNotYet, ops)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("traces in Jaeger: %v", err)
	}
}

// checkWait checks a wait span of the waiter's trace: a child of its
// Acquire, named for what ended it, naming the holder, and FOLLOWS_FROM the
// holder's Acquire span.
func checkWait(t *testing.T, s, acquire *jSpan, holderTrace *jTrace, holderAcquire *jSpan) {
	t.Helper()
	if p := parentOf(s); p == nil || p.SpanID != acquire.SpanID {
		t.Errorf("wait %s references %v, want CHILD_OF the waiter's redlock.Acquire %s", s.SpanID, s.References, acquire.SpanID)
	}
	endedBy := s.str(string(tracing.WaitEndedBy))
	if !slices.Contains([]string{tracing.WaitEndedByNotice, tracing.WaitEndedByBackoff}, endedBy) || s.OperationName != tracing.WaitSpanName(endedBy) {
		t.Errorf("wait %s is named %q with %s=%q; want %q or %q", s.SpanID, s.OperationName, tracing.WaitEndedBy, endedBy,
			tracing.WaitSpanName(tracing.WaitEndedByNotice), tracing.WaitSpanName(tracing.WaitEndedByBackoff))
	}
	if got := s.str(string(tracing.Holder)); got != "instance-a" {
		t.Errorf("wait %s: %s = %q, want instance-a", s.SpanID, tracing.Holder, got)
	}
	if !slices.ContainsFunc(s.References, func(r jRef) bool {
		return r.RefType == "FOLLOWS_FROM" && r.TraceID == holderTrace.TraceID && r.SpanID == holderAcquire.SpanID
	}) {
		t.Errorf("wait %s references %v; want FOLLOWS_FROM the holder's redlock.Acquire %s", s.SpanID, s.References, holderAcquire.SpanID)
	}
}

// rootOf returns the span of tr without a parent, or nil.
func rootOf(tr *jTrace) *jSpan {
	for i := range tr.Spans {
		if parentOf(&tr.Spans[i]) == nil {
			return &tr.Spans[i]
		}
	}
	return nil
}

// parentOf returns the CHILD_OF reference of s, or nil.
func parentOf(s *jSpan) *jRef {
	for i, r := range s.References {
		if r.RefType == "CHILD_OF" && r.TraceID == s.TraceID {
			return &s.References[i]
		}
	}
	return nil
}

// only returns the one span of tr named name.
func only(t *testing.T, tr *jTrace, name string) *jSpan {
	t.Helper()
	var found *jSpan
	for i := range tr.Spans {
		if tr.Spans[i].OperationName == name {
			if found != nil {
				t.Fatalf("trace %s has several %s spans", tr.TraceID, name)
			}
			found = &tr.Spans[i]
		}
	}
	if found == nil {
		t.Fatalf("trace %s has no %s span", tr.TraceID, name)
	}
	return found
}

// isError reports whether Jaeger shows s as an error: status Error becomes
// the tags otel.status_code=ERROR and error=true.
func isError(s *jSpan) bool {
	return s.str("otel.status_code") == "ERROR"
}

func traceIDs(trs []jTrace) []string {
	ids := make([]string, len(trs))
	for i, tr := range trs {
		ids[i] = tr.TraceID
	}
	return ids
}
