package redlock

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

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

// telemetry holds the Client's tracer and instruments.
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
	t := &telemetry{
		tracer:        tp.Tracer(tracing.ScopeRedlock, trace.WithInstrumentationVersion(tracing.Version)),
		hideResources: cfg.hideResources,
		nodeSpans:     cfg.nodeSpans,
	}
	m := mp.Meter(tracing.ScopeRedlock, metric.WithInstrumentationVersion(tracing.Version))
	buckets := metric.WithExplicitBucketBoundaries(tracing.DurationBuckets...)
	var err, e error
	t.acquireDur, e = m.Float64Histogram(tracing.MetricAcquireDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from an Acquire or TryAcquire call to its result."))
	err = errors.Join(err, e)
	t.roundDur, e = m.Float64Histogram(tracing.MetricRoundDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Duration of one quorum round."))
	err = errors.Join(err, e)
	t.holdDur, e = m.Float64Histogram(tracing.MetricHoldDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a grant to its release or loss."))
	err = errors.Join(err, e)
	t.contention, e = m.Int64Counter(tracing.MetricContention, metric.WithUnit("{round}"),
		metric.WithDescription("Acquire rounds refused by another holder."))
	err = errors.Join(err, e)
	t.lost, e = m.Int64Counter(tracing.MetricLost, metric.WithUnit("{lock}"),
		metric.WithDescription("Locks lost while held."))
	err = errors.Join(err, e)
	t.extendFailed, e = m.Int64Counter(tracing.MetricExtendFailures, metric.WithUnit("{call}"),
		metric.WithDescription("Extend calls that failed."))
	err = errors.Join(err, e)
	t.nodeErrors, e = m.Int64Counter(tracing.MetricNodeErrors, metric.WithUnit("{call}"),
		metric.WithDescription("Node calls that failed or timed out."))
	err = errors.Join(err, e)
	t.held, e = m.Int64UpDownCounter(tracing.MetricHeld, metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held by this process."))
	err = errors.Join(err, e)
	return t, err
}

// startOp starts an operation span.
func (t *telemetry) startOp(ctx context.Context, name string, resources []string, ttl time.Duration) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, name, spanKindInternal...)
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

// spanKindInternal is built once, as the slice that Start's variadic
// options need: a new option, or a new slice of it, costs an allocation
// per call.
var spanKindInternal = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}

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
	case errors.Is(err, ErrLockLost):
		return tracing.OutcomeLost, tracing.ErrorTypeLockLost
	case errors.Is(err, ErrNotAcquired):
		var qerr *QuorumError
		if errors.As(err, &qerr) && qerr.validity != 0 {
			return tracing.OutcomeWeak, ""
		}
		return tracing.OutcomeContended, ""
	}
	return "error", tracing.ErrorTypeOther
}

// endAcquire records an Acquire or TryAcquire call's outcome on its span
// and metrics.
func (t *telemetry) endAcquire(ctx context.Context, span trace.Span, start time.Time, attempts int, l *Lock, err error) {
	outcome, _ := classifyErr(err)
	if t.acquireDur.Enabled(ctx) {
		t.acquireDur.Record(ctx, time.Since(start).Seconds(), outcomeAttrs(outcome))
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

// startRound starts a round span as a child of ctx's span. Under a span
// that records nothing (no SDK installed, or sampled out) it starts none:
// a round is only ever seen inside its operation.
func (t *telemetry) startRound(ctx context.Context, op string, attempt, nodes, quorum int) (context.Context, trace.Span) {
	if parent := trace.SpanFromContext(ctx); !parent.IsRecording() {
		return ctx, parent
	}
	ctx, span := t.tracer.Start(ctx, tracing.SpanRound, spanKindInternal...)
	if span.IsRecording() {
		span.SetAttributes(
			tracing.RoundOp.String(op),
			tracing.Nodes.Int(nodes),
			tracing.Quorum.Int(quorum),
		)
		if attempt > 0 {
			span.SetAttributes(tracing.RoundAttempt.Int(attempt))
		}
	}
	return ctx, span
}

// endRound records a round's votes, per-node detail, links to the holders
// that refused it, and its duration, then ends its span.
func (t *telemetry) endRound(ctx context.Context, span trace.Span, spec roundSpec, rs []NodeResult, quorum int, took time.Duration, c *Client) {
	op := spec.op
	outcome := roundOutcome(op, rs, quorum)
	if op == "acquire" && outcome == tracing.OutcomeGranted {
		validity := c.validity(time.Now().Add(-took), spec.ttl)
		if span.IsRecording() {
			span.SetAttributes(tracing.ValidityMillis.Float64(float64(validity.Microseconds()) / 1000))
		}
		if validity <= 0 || validity < time.Duration(float64(spec.ttl)*c.cfg.minValidity) {
			outcome = tracing.OutcomeWeak
		}
	}
	for _, r := range rs {
		if r.failed() && r.Outcome != OutcomeGated && t.nodeErrors.Enabled(ctx) {
			host, port := splitAddr(r.Addr)
			t.nodeErrors.Add(ctx, 1, metric.WithAttributes(semconv.ServerAddressKey.String(host),
				semconv.ServerPortKey.Int(port), tracing.Outcome.String(r.Outcome.String())))
		}
	}
	if op == "acquire" && outcome == tracing.OutcomeContended {
		t.contention.Add(ctx, 1)
	}
	if t.roundDur.Enabled(ctx) { // else passing options allocates for nothing
		t.roundDur.Record(ctx, took.Seconds(), roundAttrs(op, outcome))
	}
	if !span.IsRecording() {
		return // no span was started (startRound)
	}
	addrs := make([]string, len(rs))
	outcomes := make([]string, len(rs))
	lat := make([]float64, len(rs))
	linked := map[string]bool{}
	for i, r := range rs {
		addrs[i], outcomes[i], lat[i] = r.Addr, r.Outcome.String(), float64(r.Latency.Microseconds())/1000
		if r.Outcome == OutcomeHeld && r.traceparent != "" && !linked[r.traceparent] {
			linked[r.traceparent] = true
			if sc, ok := parseTraceparent(r.traceparent); ok {
				span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{tracing.Holder.String(r.Holder)}})
			}
		}
	}
	span.SetAttributes(
		tracing.VotesOK.Int(count(rs, OutcomeOK)),
		tracing.VotesHeld.Int(count(rs, OutcomeHeld)),
		tracing.VotesError.Int(count(rs, OutcomeError)),
		tracing.VotesTimeout.Int(count(rs, OutcomeTimeout)),
		tracing.VotesGated.Int(count(rs, OutcomeGated)),
		tracing.VotesPending.Int(count(rs, OutcomePending)),
		tracing.NodeAddresses.StringSlice(addrs),
		tracing.NodeOutcomes.StringSlice(outcomes),
		tracing.NodeLatencies.Float64Slice(lat),
		tracing.Outcome.String(outcome),
	)
	for _, r := range rs {
		if r.Outcome == OutcomeHeld && r.Holder != "" {
			span.SetAttributes(tracing.Holder.String(r.Holder))
			break
		}
	}
	if outcome == tracing.OutcomeUnavailable || outcome == tracing.OutcomeLost {
		errType := tracing.ErrorTypeUnavailable
		if outcome == tracing.OutcomeLost {
			errType = tracing.ErrorTypeLockLost
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, op+" round: "+outcome)
	}
	span.End()
}

// attrCache holds metric attribute options by key, built once each.
// attrCache holds the attribute sets of measurements, built once per
// combination (a handful of ops and outcomes): no allocation per round.
var attrCache struct {
	sync.RWMutex
	m map[[2]string]metric.MeasurementOption
}

// cachedAttrs returns the cached option for key, {round op, outcome} or
// {"", outcome}, building it on first use (without a closure: one that
// captured the key was allocated on every call).
func cachedAttrs(key [2]string) metric.MeasurementOption {
	attrCache.RLock()
	o, ok := attrCache.m[key]
	attrCache.RUnlock()
	if ok {
		return o
	}
	set := attribute.NewSet(tracing.Outcome.String(key[1]))
	if key[0] != "" {
		set = attribute.NewSet(tracing.RoundOp.String(key[0]), tracing.Outcome.String(key[1]))
	}
	o = metric.WithAttributeSet(set)
	attrCache.Lock()
	if attrCache.m == nil {
		attrCache.m = make(map[[2]string]metric.MeasurementOption)
	}
	attrCache.m[key] = o
	attrCache.Unlock()
	return o
}

// roundAttrs returns the attributes of a round duration measurement.
func roundAttrs(op, outcome string) metric.MeasurementOption {
	return cachedAttrs([2]string{op, outcome})
}

// outcomeAttrs returns the attributes of a measurement with only an outcome.
func outcomeAttrs(outcome string) metric.MeasurementOption {
	return cachedAttrs([2]string{"", outcome})
}

// roundOutcome is the default outcome of a round's results.
func roundOutcome(op string, rs []NodeResult, quorum int) string {
	n := len(rs)
	switch {
	case count(rs, OutcomeOK) >= quorum:
		return tracing.OutcomeGranted
	case failures(rs) > n-quorum:
		return tracing.OutcomeUnavailable
	case op == "undo":
		// Undoing a failed attempt: nodes that answer "held" keep the
		// other holder's key and none of ours. Nothing was lost.
		return tracing.OutcomeGranted
	case op == "extend" || op == "release":
		if count(rs, OutcomeHeld) > n-quorum {
			return tracing.OutcomeLost
		}
		return tracing.OutcomeUnavailable
	}
	return tracing.OutcomeContended
}

// nodeSpan starts a CLIENT span for one node call, when enabled.
func (t *telemetry) nodeSpan(ctx context.Context, n *peer, op string) (context.Context, trace.Span) {
	if !t.nodeSpans {
		return ctx, nil
	}
	ctx, span := t.tracer.Start(ctx, "EVALSHA", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		host, port := splitAddr(n.addr)
		span.SetAttributes(semconv.DBSystemNameRedis, semconv.DBOperationNameKey.String("EVALSHA"),
			semconv.ServerAddressKey.String(host), tracing.RoundOp.String(op))
		if port != 0 {
			span.SetAttributes(semconv.ServerPortKey.Int(port))
		}
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
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	flags := "00"
	if sc.IsSampled() {
		flags = "01"
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + flags
}

// parseTraceparent parses a W3C traceparent written by traceparent.
func parseTraceparent(s string) (trace.SpanContext, bool) {
	if len(s) != traceparentLen || s[:3] != "00-" || s[35] != '-' || s[52] != '-' {
		return trace.SpanContext{}, false
	}
	tid, err1 := trace.TraceIDFromHex(s[3:35])
	sid, err2 := trace.SpanIDFromHex(s[36:52])
	if err1 != nil || err2 != nil {
		return trace.SpanContext{}, false
	}
	var flags trace.TraceFlags
	if s[53:] == "01" {
		flags = trace.FlagsSampled
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, Remote: true}), true
}

// failures returns the number of results that count as failures of their
// nodes.
func failures(rs []NodeResult) int {
	n := 0
	for _, r := range rs {
		if r.failed() {
			n++
		}
	}
	return n
}
