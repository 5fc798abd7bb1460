package redlock_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/tracing"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestSpansOfAContendedAcquisition(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	holder := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp), redlock.WithMeterProvider(mp))
	waiter := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp), redlock.WithMeterProvider(mp))
	ctx := context.Background()

	// The holder acquires inside its job's span.
	jobCtx, job := tp.Tracer("test").Start(ctx, "holder-job")
	held, err := holder.Acquire(jobCtx, []string{"report"}, 2*time.Second, redlock.WithMetadata("instance-a"))
	must(t, err)
	time.AfterFunc(150*time.Millisecond, func() { _ = held.Release(jobCtx); job.End() })
	l, err := waiter.Acquire(ctx, []string{"report"}, 2*time.Second, redlock.WithRetry(fastRetry))
	must(t, err)
	ownerToken := rawValue(t, cl, "report")[:32]
	must(t, l.Release(ctx))

	spans := rec.Ended()
	holderAcquire, waiterAcquire := acquireSpans(t, spans, job, ownerToken)
	if holderAcquire == nil || waiterAcquire == nil {
		t.Fatalf("Acquire spans: holder %v, waiter %v", holderAcquire, waiterAcquire)
	}
	if got := attrs(waiterAcquire)[tracing.Resources].AsStringSlice(); len(got) != 1 || got[0] != "report" {
		t.Errorf("waiter Acquire resources = %v", got)
	}
	// Contention is not an error anywhere in the waiter's trace, also not
	// in the rounds that undo its refused attempts (found with Jaeger).
	checkNoErrorInTrace(t, spans, waiterAcquire)
	contended, granted, waits := waiterRounds(t, spans, waiterAcquire, holderAcquire, job)
	if contended == 0 || granted != 1 {
		t.Errorf("waiter rounds: %d contended, %d granted; want several and 1", contended, granted)
	}
	if waits != contended {
		t.Errorf("%d wait spans under the waiter's Acquire, want one after each of its %d refused rounds", waits, contended)
	}
	if got := attrs(waiterAcquire)[tracing.Attempts].AsInt64(); got != int64(contended+1) {
		t.Errorf("attempts attribute = %d, want %d", got, contended+1)
	}

	got := metricTotals(t, reader)
	if got[tracing.MetricContention] != int64(contended) || got[tracing.MetricHeld] != 0 ||
		got[tracing.MetricAcquireDuration] != 2 || got[tracing.MetricHoldDuration] != 2 {
		t.Errorf("metrics = %v; want contention %d, held 0, 2 acquisitions, 2 holds", got, contended)
	}
}

// acquireSpans returns the Acquire spans of the holder (a child of job)
// and of the waiter, and fails the test for a span attribute that holds
// the owner token.
func acquireSpans(t *testing.T, spans []sdktrace.ReadOnlySpan, job trace.Span, ownerToken string) (holder, waiter sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		if s.Name() == tracing.SpanAcquire {
			if s.Parent().SpanID() == job.SpanContext().SpanID() {
				holder = s
			} else {
				waiter = s
			}
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), ownerToken) {
				t.Errorf("span %s attribute %s holds the lock's owner token", s.Name(), kv.Key)
			}
		}
	}
	return holder, waiter
}

// checkNoErrorInTrace fails the test for a span of root's trace with
// status Error.
func checkNoErrorInTrace(t *testing.T, spans []sdktrace.ReadOnlySpan, root sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		if s.SpanContext().TraceID() == root.SpanContext().TraceID() && s.Status().Code == codes.Error {
			t.Errorf("span %s (op %s) in the waiter's trace has status Error: %v", s.Name(), attrs(s)[tracing.RoundOp].AsString(), s.Status())
		}
	}
}

// waiterRounds counts the contended and granted acquire rounds and the
// wait spans under the waiter's Acquire span, checking each.
func waiterRounds(t *testing.T, spans []sdktrace.ReadOnlySpan, waiter, holder sdktrace.ReadOnlySpan, job trace.Span) (contended, granted, waits int) {
	t.Helper()
	for _, s := range spans {
		if s.Parent().SpanID() != waiter.SpanContext().SpanID() {
			continue
		}
		a := attrs(s)
		switch {
		case strings.HasPrefix(s.Name(), tracing.SpanWait):
			waits++
			checkWaitSpan(t, s, holder, "instance-a")
			continue
		case a[tracing.RoundOp].AsString() != "acquire":
			continue
		}
		checkAcquireRound(t, s, holder, job)
		switch a[tracing.Outcome].AsString() {
		case tracing.OutcomeContended:
			contended++
		case tracing.OutcomeGranted:
			granted++
		}
	}
	return contended, granted, waits
}

// checkAcquireRound checks an acquire round span of the waiter: its name
// and attributes, and, contended, its holder and link to the holder's
// Acquire span (a child of job), or, granted, its validity.
func checkAcquireRound(t *testing.T, s, holder sdktrace.ReadOnlySpan, job trace.Span) {
	t.Helper()
	a := attrs(s)
	if want := tracing.RoundSpanName("acquire", a[tracing.Outcome].AsString()); s.Name() != want {
		t.Errorf("round span name %q, want %q", s.Name(), want)
	}
	if a[tracing.Nodes].AsInt64() != 3 || a[tracing.Quorum].AsInt64() != 2 || len(a[tracing.NodeOutcomes].AsStringSlice()) != 3 {
		t.Errorf("round attributes = %v", s.Attributes())
	}
	switch a[tracing.Outcome].AsString() {
	case tracing.OutcomeContended:
		if s.Status().Code != codes.Unset {
			t.Errorf("contended round status = %v, want unset", s.Status())
		}
		if a[tracing.VotesHeld].AsInt64() < 1 || a[tracing.Holder].AsString() != "instance-a" {
			t.Errorf("contended round: held votes %d, holder %q", a[tracing.VotesHeld].AsInt64(), a[tracing.Holder].AsString())
		}
		linked := slices.ContainsFunc(s.Links(), func(link sdktrace.Link) bool {
			return link.SpanContext.SpanID() == holder.SpanContext().SpanID() && link.SpanContext.TraceID() == job.SpanContext().TraceID()
		})
		if !linked {
			t.Errorf("contended round has no link to the holder's Acquire span (links %v)", s.Links())
		}
	case tracing.OutcomeGranted:
		if v := a[tracing.ValidityMillis].AsFloat64(); v < 1000 || v > 2000 {
			t.Errorf("granted round validity_ms = %v, want about 2000 - drift", v)
		}
	}
}

// metricTotals returns what reader collected: each counter's sum and each
// histogram's count, by metric name.
func metricTotals(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	for _, m := range collect(t, reader) {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				got[m.Name] += p.Value
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				got[m.Name] += int64(p.Count)
			}
		}
	}
	return got
}

// collect returns every metric that reader collected, of every scope.
func collect(t *testing.T, reader *sdkmetric.ManualReader) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	must(t, reader.Collect(context.Background(), &rm))
	var all []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		all = append(all, sm.Metrics...)
	}
	return all
}

// checkWaitSpan checks a wait span of a contended Acquire: named for what
// ended it, naming the holder and linking to the holder's span.
func checkWaitSpan(t *testing.T, s, holderSpan sdktrace.ReadOnlySpan, holder string) {
	t.Helper()
	a := attrs(s)
	endedBy := a[tracing.WaitEndedBy].AsString()
	switch endedBy {
	case tracing.WaitEndedByNotice, tracing.WaitEndedByBackoff, tracing.WaitEndedByCtx:
	default:
		t.Errorf("wait span %q: ended_by %q", s.Name(), endedBy)
	}
	if s.Name() != tracing.WaitSpanName(endedBy) {
		t.Errorf("wait span name %q, want %q", s.Name(), tracing.WaitSpanName(endedBy))
	}
	if got := a[tracing.Holder].AsString(); got != holder {
		t.Errorf("wait span %q: holder %q, want %q", s.Name(), got, holder)
	}
	if _, ok := a[tracing.WaitPlannedMillis]; !ok {
		t.Errorf("wait span %q has no %s", s.Name(), tracing.WaitPlannedMillis)
	}
	if holderSpan != nil && (len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != holderSpan.SpanContext().SpanID()) {
		t.Errorf("wait span %q links %v, want one to the holder's span %v", s.Name(), s.Links(), holderSpan.SpanContext().SpanID())
	}
}

// TestWaitSpanSaysWhatEndedIt: a contended Acquire's wait ends with the
// holder's release notice when it comes before the retry delay, and with
// the caller's ctx when that ends first; the wait span says which, and
// names the holder.
func TestWaitSpanSaysWhatEndedIt(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	holder := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp))
	waiter := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp))
	slow := func() backoff.BackOff { return backoff.NewConstantBackOff(time.Minute) }
	ctx := context.Background()

	lastWait := func(acquire sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
		var last sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if strings.HasPrefix(s.Name(), tracing.SpanWait) && s.Parent().SpanID() == acquire.SpanContext().SpanID() {
				last = s
			}
		}
		if last == nil {
			t.Fatal("no wait span under the waiter's Acquire")
		}
		return last
	}
	acquireSpan := func(parent trace.Span) sdktrace.ReadOnlySpan {
		for _, s := range rec.Ended() {
			if s.Name() == tracing.SpanAcquire && s.Parent().SpanID() == parent.SpanContext().SpanID() {
				return s
			}
		}
		t.Fatal("no Acquire span under the test's span")
		return nil
	}

	// Released while the waiter waits a minute: the notice ends the wait.
	held, err := holder.Acquire(ctx, []string{"notice"}, 30*time.Second, redlock.WithMetadata("billing/vm-1"))
	must(t, err)
	wctx, parent := tp.Tracer("test").Start(ctx, "waiter")
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(wctx, []string{"notice"}, 30*time.Second, redlock.WithRetry(slow))
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	nodes := cl.Clients(t)
	waitFor(t, "the waiter's subscriptions", func() bool { return allAtLeast(subscribers(t, nodes, "notice:released"), 1) })
	must(t, held.Release(ctx))
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	parent.End()
	w := lastWait(acquireSpan(parent))
	checkWaitSpan(t, w, nil, "billing/vm-1")
	if got := attrs(w)[tracing.WaitEndedBy].AsString(); got != tracing.WaitEndedByNotice {
		t.Errorf("wait ended by %q, want %q", got, tracing.WaitEndedByNotice)
	}

	// Still held when the waiter's ctx ends: ctx ends the wait.
	if _, err := holder.Acquire(ctx, []string{"ctx"}, 30*time.Second, redlock.WithMetadata("billing/vm-1")); err != nil {
		t.Fatal(err)
	}
	wctx, parent = tp.Tracer("test").Start(ctx, "waiter")
	cctx, cancel := context.WithCancel(wctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := waiter.Acquire(cctx, []string{"ctx"}, 30*time.Second, redlock.WithRetry(slow)); !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", err)
	}
	parent.End()
	w = lastWait(acquireSpan(parent))
	checkWaitSpan(t, w, nil, "billing/vm-1")
	if got := attrs(w)[tracing.WaitEndedBy].AsString(); got != tracing.WaitEndedByCtx {
		t.Errorf("wait ended by %q, want %q", got, tracing.WaitEndedByCtx)
	}
}

// TestKeepExtensionsAreTracesOfTheirOwn: each extension of a held lock
// (Do, Keep) is the root of a small trace linked to the holder's span, so
// that a long hold never grows one trace without bound.
func TestKeepExtensionsAreTracesOfTheirOwn(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp))
	extensions := func() (out []sdktrace.ReadOnlySpan) {
		for _, s := range rec.Ended() {
			if s.Name() == tracing.SpanExtend {
				out = append(out, s)
			}
		}
		return out
	}
	err := c.Do(context.Background(), []string{"long"}, 300*time.Millisecond, func(ctx context.Context) error {
		waitFor(t, "two extensions", func() bool { return len(extensions()) >= 2 })
		return nil
	})
	must(t, err)
	var do sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanDo {
			do = s
		}
	}
	if do == nil {
		t.Fatal("no Do span")
	}
	for _, ext := range extensions() {
		if ext.Parent().IsValid() || ext.SpanContext().TraceID() == do.SpanContext().TraceID() {
			t.Errorf("extension span %v has parent %v in trace %v: want the root of a trace of its own", ext.SpanContext().SpanID(), ext.Parent().SpanID(), ext.SpanContext().TraceID())
		}
		if len(ext.Links()) != 1 || ext.Links()[0].SpanContext.SpanID() != do.SpanContext().SpanID() {
			t.Errorf("extension span links %v, want one to the Do span %v", ext.Links(), do.SpanContext().SpanID())
		}
		rounds := 0
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == ext.SpanContext().SpanID() && s.Name() == tracing.RoundSpanName("extend", tracing.OutcomeGranted) {
				rounds++
			}
		}
		if rounds != 1 {
			t.Errorf("extension span has %d %q children, want 1", rounds, tracing.RoundSpanName("extend", tracing.OutcomeGranted))
		}
	}
}

// TestWaitJoiningAWatchedKeyIsNotWokenByAnEarlierRelease: an Acquire that
// starts watching a key which another Acquire of its Client already
// watches is woken only by releases after it began to wait, not by one the
// other waiter saw before (it retried at once, and its wait span read
// "release_notice" with nothing released).
func TestWaitJoiningAWatchedKeyIsNotWokenByAnEarlierRelease(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	holder := newClient(t, cl.Clients(t))
	w := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp))
	slow := func() backoff.BackOff { return backoff.NewConstantBackOff(time.Minute) }
	ctx := context.Background()
	held, err := holder.Acquire(ctx, []string{"k"}, 30*time.Second, redlock.WithMetadata("H"))
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		l   *redlock.Lock
		err error
	}
	out := make(chan res, 2)
	cctx, cancelC := context.WithCancel(ctx)
	defer cancelC()
	for _, c := range []context.Context{ctx, cctx} {
		go func() {
			l, err := w.Acquire(c, []string{"k"}, 30*time.Second, redlock.WithRetry(slow), redlock.WithMetadata("W"))
			out <- res{l, err}
		}()
	}
	waitFor(t, "subscriptions", func() bool { return allAtLeast(subscribers(t, cl.Clients(t), "k:released"), 1) })
	time.Sleep(200 * time.Millisecond)
	if err := held.Release(ctx); err != nil { // gen of k:released becomes 1
		t.Fatal(err)
	}
	first := <-out // one waiter holds k, the other sleeps on: the keyWatch stays
	if first.err != nil {
		t.Fatal(first.err)
	}
	bctx, bspan := tp.Tracer("test").Start(ctx, "B")
	bctx, cancelB := context.WithTimeout(bctx, 300*time.Millisecond)
	defer cancelB()
	if _, err := w.Acquire(bctx, []string{"k"}, 30*time.Second, redlock.WithRetry(slow)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire of the held key = %v, want its ctx's deadline: nothing is released while it waits", err)
	}
	bspan.End()
	var acq sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanAcquire && s.Parent().SpanID() == bspan.SpanContext().SpanID() {
			acq = s
		}
	}
	for _, s := range rec.Ended() {
		if s.Parent().SpanID() == acq.SpanContext().SpanID() {
			t.Logf("  %-36q %v", s.Name(), s.EndTime().Sub(s.StartTime()).Round(time.Microsecond))
			if s.Name() == tracing.WaitSpanName(tracing.WaitEndedByNotice) {
				t.Errorf("wait span %q although no release happened while B ran", s.Name())
			}
		}
	}
	_ = first.l.Release(ctx)
	cancelC()
	<-out
}

// notDo samples every root span but Do's.
type notDo struct{}

func (notDo) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Name == tracing.SpanDo {
		return sdktrace.SamplingResult{Decision: sdktrace.Drop}
	}
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample}
}
func (notDo) Description() string { return "notDo" }

// TestExtensionsOfAnUnsampledHoldAreNotSampled: extensions are traces of
// their own only under a sampled hold; under an unsampled one they stay
// its children, which a parent-based sampler drops (as roots, they were
// kept, linking to a span that was never exported).
func TestExtensionsOfAnUnsampledHoldAreNotSampled(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(notDo{})))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp))
	extended := 0
	err := c.Do(context.Background(), []string{"unsampled"}, 300*time.Millisecond, func(ctx context.Context) error {
		l, _ := redlock.FromContext(ctx)
		first := l.Until()
		waitFor(t, "two extensions", func() bool {
			if l.Until() != first {
				extended++
				first = l.Until()
			}
			return extended >= 2
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanExtend {
			t.Errorf("an extension of an unsampled Do was sampled (links %v)", s.Links())
		}
	}
}

// rawValue returns the value of key on the first node that has it.
func rawValue(t *testing.T, cl redlocktest.Cluster, key string) string {
	t.Helper()
	for _, s := range cl {
		if v, err := s.Client(t).Get(context.Background(), key).Result(); err == nil {
			return v
		}
	}
	t.Fatalf("no node holds %s", key)
	return ""
}

func TestFailedRoundSetsErrorStatus(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := newClient(t, cl.Clients(t), redlock.WithTracerProvider(tp), redlock.WithMeterProvider(mp),
		redlock.WithNodeSpans(true), redlock.WithHiddenResources(true), redlock.WithNodeTimeout(100*time.Millisecond))
	cl[1].Kill(t)
	cl[2].Kill(t)
	if _, err := c.TryAcquire(context.Background(), []string{"secret-name"}, time.Second); !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("TryAcquire = %v", err)
	}
	waitSettled(t, c) // the undo's calls and spans too
	nodeErrors := nodeErrorsByPort(t, reader)
	if len(nodeErrors) != 2 {
		t.Errorf("%s by port = %v, want the two killed nodes", tracing.MetricNodeErrors, nodeErrors)
	}
	op, round, nodeSpans := failedRoundSpans(t, rec.Ended())
	for name, s := range map[string]sdktrace.ReadOnlySpan{"op": op, "round": round} {
		if s == nil {
			t.Fatalf("no %s span", name)
		}
		if s.Status().Code != codes.Error || attrs(s)["error.type"].AsString() != tracing.ErrorTypeUnavailable {
			t.Errorf("%s span status %v, error.type %q; want Error, %s", name, s.Status(), attrs(s)["error.type"].AsString(), tracing.ErrorTypeUnavailable)
		}
	}
	if nodeSpans < 3 {
		t.Errorf("%d node spans, want one per node per round", nodeSpans)
	}
}

// nodeErrorsByPort returns the node error counts that reader collected,
// by server.port.
func nodeErrorsByPort(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	nodeErrors := map[string]int64{}
	for _, m := range collect(t, reader) {
		if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == tracing.MetricNodeErrors {
			for _, p := range d.DataPoints {
				port, _ := p.Attributes.Value("server.port")
				nodeErrors[port.String()] += p.Value
			}
		}
	}
	return nodeErrors
}

// failedRoundSpans returns, of the spans of a TryAcquire that failed for
// unavailable nodes, the operation's span, its round's and how many node
// spans there are; it fails the test for a node span without its
// attributes and for any span that records the hidden resource names.
func failedRoundSpans(t *testing.T, spans []sdktrace.ReadOnlySpan) (op, round sdktrace.ReadOnlySpan, nodeSpans int) {
	t.Helper()
	for _, s := range spans {
		switch s.Name() {
		case tracing.SpanTryAcquire:
			op = s
		case tracing.RoundSpanName("acquire", tracing.OutcomeUnavailable):
			round = s
		case "EVALSHA", "SET":
			nodeSpans++
			a := attrs(s)
			if a["db.system.name"].AsString() != "redis" || a["server.address"].AsString() != "127.0.0.1" || a["server.port"].AsInt64() == 0 {
				t.Errorf("node span attributes = %v", s.Attributes())
			}
		}
		if _, ok := attrs(s)[tracing.Resources]; ok {
			t.Errorf("span %s records resource names although hidden", s.Name())
		}
	}
	return op, round, nodeSpans
}

// TestLibraryDoesNotImportTheSDK: importing redlock must not pull the
// OpenTelemetry SDK or an exporter into a user's build.
func TestLibraryDoesNotImportTheSDK(t *testing.T) {
	for _, pkg := range []string{"redlock", "scheduler", "elector", "tracing"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/schedlock/schedlock/"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "go.opentelemetry.io/otel/sdk") || strings.Contains(dep, "/exporters/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}

// TestWeakGrantOnTheMetricWithoutSpans: with a meter but no tracer, a
// grant that leaves less validity than WithMinValidity asks is recorded
// on the round-duration metric as "weak", not "granted" (endRound tells
// the two apart only when a span or the metric reads it).
func TestWeakGrantOnTheMetricWithoutSpans(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	clients, proxies := cl.ProxiedClients(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := newClient(t, clients, redlock.WithMeterProvider(mp), redlock.WithMinValidity(0.85), redlock.WithNodeTimeout(time.Second))
	warm, err := c.TryAcquire(context.Background(), []string{"warm-up"}, 2*time.Second) // connections dialled
	must(t, err)
	must(t, warm.Release(context.Background()))
	waitSettled(t, c)
	before := roundOutcomes(t, reader)
	// A 300 ms round trip and the drift (1% + 2 ms) leave under 85% of 2 s.
	for _, p := range proxies {
		p.SetLatency(150 * time.Millisecond)
	}
	if _, err := c.TryAcquire(context.Background(), []string{"weak"}, 2*time.Second); err == nil {
		t.Fatal("TryAcquire granted a lock with less validity than WithMinValidity asks")
	}
	waitSettled(t, c)
	got := roundOutcomes(t, reader)
	weak, granted := "acquire/"+tracing.OutcomeWeak, "acquire/"+tracing.OutcomeGranted
	if got[weak]-before[weak] != 1 || got[granted] != before[granted] {
		t.Errorf("%s by op/outcome = %v (before the slow round %v), want one more acquire/%s", tracing.MetricRoundDuration, got, before, tracing.OutcomeWeak)
	}
}

// roundOutcomes returns the rounds on the round-duration metric that
// reader collected, by "op/outcome".
func roundOutcomes(t *testing.T, reader *sdkmetric.ManualReader) map[string]uint64 {
	t.Helper()
	outcomes := map[string]uint64{}
	for _, m := range collect(t, reader) {
		if d, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == tracing.MetricRoundDuration {
			for _, p := range d.DataPoints {
				op, _ := p.Attributes.Value(tracing.RoundOp)
				outcome, _ := p.Attributes.Value(tracing.Outcome)
				outcomes[op.AsString()+"/"+outcome.AsString()] += p.Count
			}
		}
	}
	return outcomes
}
