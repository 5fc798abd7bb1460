package redlock

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/tracing"
)

// TestGlobalTracerBeforeAndAfterAnSDK: with otel's global provider and no
// SDK installed, an operation starts no span (it would record nothing);
// an SDK installed after New gets the spans of the Client's operations,
// and keeps getting them after the original global provider is restored,
// as otel's delegating tracers do. Not parallel: it installs a global
// provider, which no other test in this package does.
func TestGlobalTracerBeforeAndAfterAnSDK(t *testing.T) {
	if sdkSeen.Load() || otel.GetTracerProvider() != globalTracerProvider || globalTracerProvider == nil {
		t.Fatal("otel's global tracer provider was replaced before this test")
	}
	c, _ := newMiniClient(t)
	if !c.tel.global {
		t.Fatal("a Client with the default provider does not know it is otel's global one")
	}
	ctx := context.Background()
	if got, span := c.tel.startOp(ctx, tracing.SpanTryAcquire, []string{"r"}, time.Second); got != ctx || span != quietSpan {
		t.Fatalf("startOp without an SDK = (%v, %T), want the caller's ctx and quietSpan", got, span)
	}
	// A recording parent from a provider the application did not install
	// globally: the operation's span is started (not quietSpan) under it.
	local := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = local.Shutdown(context.Background()) })
	pctx, parent := local.Tracer("test").Start(ctx, "parent")
	defer parent.End()
	if got, span := c.tel.startOp(pctx, tracing.SpanTryAcquire, []string{"r"}, time.Second); span == quietSpan ||
		!trace.SpanContextFromContext(got).Equal(parent.SpanContext()) {
		t.Fatalf("startOp under a recording parent = (%v, %T), want a span carrying the parent's span context", got, span)
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(globalTracerProvider)
	lockOnce := func(key string) []string {
		t.Helper()
		l, err := c.TryAcquire(ctx, []string{key}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range rec.Ended() {
			for _, kv := range s.Attributes() {
				if kv.Key == tracing.Resources && slices.Equal(kv.Value.AsStringSlice(), []string{key}) {
					names = append(names, s.Name())
				}
			}
		}
		return names
	}
	want := []string{tracing.SpanTryAcquire, tracing.SpanRelease}
	if got := lockOnce("after-sdk"); !slices.Equal(got, want) {
		t.Errorf("spans of a Client made before the SDK was installed = %v, want %v", got, want)
	}
	otel.SetTracerProvider(globalTracerProvider)
	if got := lockOnce("after-restore"); !slices.Equal(got, want) {
		t.Errorf("spans after the original global provider was restored = %v, want %v", got, want)
	}
}
