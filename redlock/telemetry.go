package redlock

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock/internal/node"
	"github.com/schedlock/schedlock/tracing"
)

// WithTracerProvider sets the OpenTelemetry tracer provider. Default: the
// global provider (otel.GetTracerProvider), which records nothing until the
// application installs an SDK. nil means the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return clientOption(func(c *config) { c.tracerProvider = tp })
}

// WithMeterProvider sets the OpenTelemetry meter provider. Default: the
// global provider. nil means the default.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return clientOption(func(c *config) { c.meterProvider = mp })
}

// WithHiddenResources keeps resource names out of spans (for names that
// carry personal data). Default false: resource names are recorded. The lock
// value is never recorded.
func WithHiddenResources(hide bool) Option {
	return clientOption(func(c *config) { c.hideResources = hide })
}

// WithNodeSpans adds one CLIENT span per node call under each round span,
// following the OpenTelemetry database conventions (db.system.name=redis,
// db.operation.name, server.address, server.port). Default false: per-node
// detail is recorded as attributes of the round span, and go-redis's own
// instrumentation (redisotel), if installed, already emits a span per
// command.
func WithNodeSpans(on bool) Option {
	return clientOption(func(c *config) { c.nodeSpans = on })
}

// telemetry observes rounds and calls: spans and metrics (docs/observability.md).
type telemetry struct {
	tracer        trace.Tracer
	hideResources bool
	nodeSpans     bool

	acquireDur, roundDur, holdDur  metric.Float64Histogram
	contention, lost, extendFailed metric.Int64Counter
	nodeErrors                     metric.Int64Counter
	held                           metric.Int64UpDownCounter
}

func newTelemetry(cfg config) (*telemetry, error) {
	tp, mp := cfg.tracerProvider, cfg.meterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(tracing.ScopeRedlock, trace.WithInstrumentationVersion(tracing.Version)),
		hideResources: cfg.hideResources, nodeSpans: cfg.nodeSpans}
	m := mp.Meter(tracing.ScopeRedlock, metric.WithInstrumentationVersion(tracing.Version))
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(tracing.DurationBuckets...))
		errs = append(errs, err)
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	t.acquireDur = hist(tracing.MetricAcquireDuration, "Time from an Acquire or TryAcquire call to its result.")
	t.roundDur = hist(tracing.MetricRoundDuration, "Duration of one quorum round.")
	t.holdDur = hist(tracing.MetricHoldDuration, "Time from a grant to its release or loss.")
	t.contention = counter(tracing.MetricContention, "{round}", "Acquire rounds refused by another holder.")
	t.lost = counter(tracing.MetricLost, "{lock}", "Locks lost while held.")
	t.extendFailed = counter(tracing.MetricExtendFailures, "{call}", "Extend calls that failed.")
	t.nodeErrors = counter(tracing.MetricNodeErrors, "{call}", "Node calls that failed or timed out.")
	var err error
	t.held, err = m.Int64UpDownCounter(tracing.MetricHeld, metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held by this process."))
	return t, errors.Join(append(errs, err)...)
}

// internal is the kind of operation and round spans.
var internal = trace.WithSpanKind(trace.SpanKindInternal)

// newTraceKey marks a ctx whose operation span starts a trace of its own.
type newTraceKey struct{}

// newTrace returns ctx marked so that the operation started under it is
// the root of a new trace, linked to ctx's span: Keep's extensions, so
// that a hold of hours (a leadership, a long job) does not grow one trace
// without bound, and each extension is visible once it ends. The root
// sampler decides each such trace on its own; under a hold that is not
// sampled, the operation stays a child of the hold, so that a parent-based
// sampler drops it with the hold.
func newTrace(ctx context.Context) context.Context {
	return context.WithValue(ctx, newTraceKey{}, true)
}

// startOp starts an operation span.
func (t *telemetry) startOp(ctx context.Context, name string, resources []string, ttl time.Duration) (context.Context, trace.Span) {
	var span trace.Span
	hold := trace.SpanContextFromContext(ctx)
	switch {
	case ctx.Value(newTraceKey{}) == nil:
		ctx, span = t.tracer.Start(ctx, name, internal)
	case hold.IsValid() && !hold.IsSampled():
		// The hold is not sampled: stay its child, so that a parent-based
		// sampler drops this span too rather than keep a trace whose link
		// points at a span never exported.
		ctx, span = t.tracer.Start(context.WithValue(ctx, newTraceKey{}, nil), name, internal)
	default:
		ctx, span = t.tracer.Start(context.WithValue(ctx, newTraceKey{}, nil), name, internal,
			trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: hold}))
	}
	if span.IsRecording() {
		if !t.hideResources {
			span.SetAttributes(tracing.Resources.StringSlice(resources))
		}
		if ttl > 0 {
			span.SetAttributes(tracing.TTL.Int64(ttl.Milliseconds()))
		}
	}
	return ctx, span
}

// endOp ends an operation span with the outcome of err: contention leaves
// the status unset, real failures set status Error and error.type.
func endOp(span trace.Span, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	outcome, errType := classifyErr(err)
	span.SetAttributes(tracing.Outcome.String(outcome))
	if errType != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// classifyErr maps an operation's error to an outcome and, for real
// failures, an error.type.
func classifyErr(err error) (outcome, errType string) {
	switch {
	case err == nil:
		return tracing.OutcomeGranted, ""
	case errors.Is(err, ErrInvalidArgument):
		return tracing.OutcomeInvalid, tracing.ErrorTypeInvalid
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return tracing.OutcomeCanceled, ""
	case errors.Is(err, ErrUnavailable):
		return tracing.OutcomeUnavailable, tracing.ErrorTypeUnavailable
	case errors.Is(err, ErrMisconfigured):
		return tracing.OutcomeMisconfigured, tracing.ErrorTypeMisconfigured
	case errors.Is(err, ErrLockLost):
		return tracing.OutcomeLost, tracing.ErrorTypeLockLost
	case weakGrant(err):
		return tracing.OutcomeWeak, ""
	case errors.Is(err, ErrNotAcquired):
		return tracing.OutcomeContended, ""
	}
	return "error", tracing.ErrorTypeOther
}

// weakGrant reports whether err is an acquisition refused for too little
// validity.
func weakGrant(err error) bool {
	var qerr *QuorumError
	return errors.As(err, &qerr) && qerr.weak
}

// endAcquire records an Acquire or TryAcquire call's outcome.
func (t *telemetry) endAcquire(ctx context.Context, span trace.Span, start time.Time, attempts int, l *Lock, err error) {
	if t.acquireDur.Enabled(ctx) {
		outcome, _ := classifyErr(err)
		t.acquireDur.Record(ctx, time.Since(start).Seconds(), metric.WithAttributes(tracing.Outcome.String(outcome)))
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.Attempts.Int(attempts))
		if err == nil && l.cfg.fencing {
			span.SetAttributes(tracing.FencingToken.Int64(int64(l.FencingToken())))
		}
	}
	endOp(span, err)
}

// endExtend records an Extend call's outcome.
func (t *telemetry) endExtend(ctx context.Context, span trace.Span, err error) {
	if err != nil {
		t.extendFailed.Add(ctx, 1)
	}
	endOp(span, err)
}

// holdEnded records the end of a hold that lasted d; lost says that the
// lock was lost rather than released.
func (t *telemetry) holdEnded(ctx context.Context, d time.Duration, lost bool) {
	t.held.Add(ctx, -1)
	t.holdDur.Record(ctx, d.Seconds())
	if lost {
		t.lost.Add(ctx, 1)
	}
}

// startRound starts a round span under ctx's span, or none under a span
// that records nothing: a round is only ever seen inside its operation.
func (t *telemetry) startRound(ctx context.Context, op string, attempt, nodes, quorum int) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.IsRecording() {
		return ctx, parent
	}
	ctx, span := t.tracer.Start(ctx, tracing.RoundSpanName(op, ""), internal,
		trace.WithAttributes(tracing.RoundOp.String(op), tracing.Nodes.Int(nodes), tracing.Quorum.Int(quorum)))
	if attempt > 0 {
		span.SetAttributes(tracing.RoundAttempt.Int(attempt))
	}
	return ctx, span
}

// endRound records a round's outcome and metrics and ends its span.
func (t *telemetry) endRound(ctx context.Context, span trace.Span, spec broadcast, rs []NodeResult, took time.Duration, c *Client) {
	outcome := roundOutcome(spec.op, rs, c.quorum)
	recording := span.IsRecording()
	// A weak grant is told apart only where someone looks: the span and
	// the round-duration metric (an unread attribute still allocates).
	if spec.op == "acquire" && outcome == tracing.OutcomeGranted && (recording || t.roundDur.Enabled(ctx)) {
		v := c.validity(time.Now().Add(-took), spec.ttl)
		span.SetAttributes(tracing.ValidityMillis.Float64(float64(v.Microseconds()) / 1000))
		if v <= 0 || v < time.Duration(float64(spec.ttl)*c.cfg.minValidity) {
			outcome = tracing.OutcomeWeak
		}
	}
	// Enabled first: building attribute sets for a meter that records
	// nothing cost 8% of the client's CPU at 64 goroutines.
	for _, r := range rs {
		if r.failed() && r.Outcome != OutcomeGated && t.nodeErrors.Enabled(ctx) {
			host, port := splitAddr(r.Addr)
			t.nodeErrors.Add(ctx, 1, metric.WithAttributes(semconv.ServerAddressKey.String(host),
				semconv.ServerPortKey.Int(port), tracing.Outcome.String(r.Outcome.String())))
		}
	}
	if spec.op == "acquire" && outcome == tracing.OutcomeContended {
		t.contention.Add(ctx, 1)
	}
	if t.roundDur.Enabled(ctx) {
		t.roundDur.Record(ctx, took.Seconds(), metric.WithAttributes(tracing.RoundOp.String(spec.op), tracing.Outcome.String(outcome)))
	}
	if recording {
		span.SetName(tracing.RoundSpanName(spec.op, outcome))
		roundAttributes(span, spec.op, rs, outcome)
	}
	span.End()
}

// startWait starts the span of a contended Acquire's wait after the
// refused round q, which may last up to d: a child of the Acquire span,
// named for what ended it by endWait. When a quorum of q's nodes named one
// holder, the span names it and links to the holder's span.
func (t *telemetry) startWait(ctx context.Context, q *QuorumError, d time.Duration) trace.Span {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return parent
	}
	_, span := t.tracer.Start(ctx, tracing.SpanWait, internal,
		trace.WithAttributes(tracing.WaitPlannedMillis.Float64(float64(d.Microseconds())/1000)))
	if r, ok := quorumHolder(q); ok {
		span.SetAttributes(tracing.Holder.String(r.Holder))
		if sc, ok := parseTraceparent(r.traceparent); ok {
			span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{tracing.Holder.String(r.Holder)}})
		}
	}
	return span
}

// wait sleeps d after the refused round q, or until wake (a layer's:
// wake.go's release notices) or ctx ends, in a wait span (startWait) that
// says what ended it; woken says that a wake came before the wait began.
func (t *telemetry) wait(ctx context.Context, q *QuorumError, d time.Duration, wake <-chan struct{}, woken bool) {
	span := t.startWait(ctx, q, d)
	endedBy := sleep(ctx, d, wake)
	if woken {
		endedBy = tracing.WaitEndedByNotice
	}
	endWait(span, endedBy)
}

// sleep waits d, or until wake or ctx, and says which ended it (a
// tracing.WaitEndedBy* value).
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (endedBy string) {
	if d <= 0 {
		return tracing.WaitEndedByBackoff
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return tracing.WaitEndedByBackoff
	case <-wake:
		return tracing.WaitEndedByNotice
	case <-ctx.Done():
		return tracing.WaitEndedByCtx
	}
}

// endWait ends a wait span with what ended the wait (a tracing.WaitEndedBy*
// value).
func endWait(span trace.Span, endedBy string) {
	if span.IsRecording() {
		span.SetName(tracing.WaitSpanName(endedBy))
		span.SetAttributes(tracing.WaitEndedBy.String(endedBy))
	}
	span.End()
}

// roundAttributes records a round's votes, per-node detail, its outcome
// and the links to the holders that refused it.
func roundAttributes(span trace.Span, op string, rs []NodeResult, outcome string) {
	addrs, outcomes, lat := make([]string, len(rs)), make([]string, len(rs)), make([]float64, len(rs))
	linked, holder := map[string]bool{}, ""
	for i, r := range rs {
		addrs[i], outcomes[i], lat[i] = r.Addr, r.Outcome.String(), float64(r.Latency.Microseconds())/1000
		if r.Outcome != OutcomeHeld {
			continue
		}
		if holder == "" {
			holder = r.Holder
		}
		if sc, ok := parseTraceparent(r.traceparent); ok && !linked[r.traceparent] {
			linked[r.traceparent] = true
			span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{tracing.Holder.String(r.Holder)}})
		}
	}
	if holder != "" {
		span.SetAttributes(tracing.Holder.String(holder))
	}
	span.SetAttributes(
		tracing.VotesOK.Int(count(rs, OutcomeOK)), tracing.VotesHeld.Int(count(rs, OutcomeHeld)),
		tracing.VotesError.Int(count(rs, OutcomeError)), tracing.VotesTimeout.Int(count(rs, OutcomeTimeout)),
		tracing.VotesGated.Int(count(rs, OutcomeGated)), tracing.VotesPending.Int(count(rs, OutcomePending)),
		tracing.NodeAddresses.StringSlice(addrs), tracing.NodeOutcomes.StringSlice(outcomes),
		tracing.NodeLatencies.Float64Slice(lat), tracing.Outcome.String(outcome))
	if errType := map[string]string{tracing.OutcomeUnavailable: tracing.ErrorTypeUnavailable,
		tracing.OutcomeLost: tracing.ErrorTypeLockLost}[outcome]; errType != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, op+" round: "+outcome)
	}
}

// roundOutcome is the outcome of a round's results.
func roundOutcome(op string, rs []NodeResult, quorum int) string {
	n := len(rs)
	switch {
	case count(rs, OutcomeOK) >= quorum:
		return tracing.OutcomeGranted
	case failures(rs) > n-quorum:
		return tracing.OutcomeUnavailable
	case op == "undo": // "held" answers are another holder's keys: nothing lost
		return tracing.OutcomeGranted
	case op == "extend" || op == "release":
		if count(rs, OutcomeHeld) > n-quorum {
			return tracing.OutcomeLost
		}
		return tracing.OutcomeUnavailable
	}
	return tracing.OutcomeContended
}

// nodeSpan starts a CLIENT span for c, one node call of round op, when
// enabled, named for its command: EVALSHA for a script (which a node's
// first call of it sends as EVAL), else the plain command's name (SET for
// SET NX GET).
func (t *telemetry) nodeSpan(ctx context.Context, p *peer, op string, c *node.Call) (context.Context, trace.Span) {
	if !t.nodeSpans {
		return ctx, nil
	}
	command := "EVALSHA"
	if c.Script == nil && len(c.Args) > 0 {
		name, _ := c.Args[0].(string)
		command = strings.ToUpper(name)
	}
	host, port := splitAddr(p.addr)
	ctx, span := t.tracer.Start(ctx, command, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		semconv.DBSystemNameRedis, semconv.DBOperationNameKey.String(command),
		semconv.ServerAddressKey.String(host), tracing.RoundOp.String(op)))
	if port != 0 {
		span.SetAttributes(semconv.ServerPortKey.Int(port))
	}
	return ctx, span
}

// splitAddr splits "host:port" for the server.address and server.port
// conventions; port is 0 when addr has none.
func splitAddr(addr string) (host string, port int) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	port, _ = strconv.Atoi(p)
	return h, port
}

// traceparentOf returns the W3C traceparent of ctx's span, or "".
func traceparentOf(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// parseTraceparent parses a W3C traceparent (traceparentOf).
func parseTraceparent(s string) (trace.SpanContext, bool) {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	sc := trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid()
}
