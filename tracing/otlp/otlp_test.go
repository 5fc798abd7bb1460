package otlp_test

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	collmetric "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/tracing"
	"github.com/schedlock/schedlock/tracing/otlp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// otelVars are the variables that Setup or the SDK read; isolate clears
// them for one test so that the developer's environment does not leak in.
var otelVars = []string{
	"OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
	"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
	"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_INSECURE",
	"OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_METRICS_INSECURE",
}

// isolate unsets every OTEL_* variable Setup depends on, for this test.
func isolate(t *testing.T) {
	t.Helper()
	for _, k := range otelVars {
		t.Setenv(k, "") // restores the old value at cleanup
	}
}

// collector is a fake OTLP/HTTP receiver that keeps what it is sent.
type collector struct {
	*httptest.Server
	mu      sync.Mutex
	traces  []*colltrace.ExportTraceServiceRequest
	metrics []*collmetric.ExportMetricsServiceRequest
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	c.Server = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.URL.Path {
	case "/v1/traces":
		req := &colltrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(data, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.traces = append(c.traces, req)
		out, _ := proto.Marshal(&colltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	case "/v1/metrics":
		req := &collmetric.ExportMetricsServiceRequest{}
		if err := proto.Unmarshal(data, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.metrics = append(c.metrics, req)
		out, _ := proto.Marshal(&collmetric.ExportMetricsServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	default:
		http.NotFound(w, r)
	}
}

// spans returns the names of the spans received, and the service.name of
// their resources.
func (c *collector) spans() (names, services []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, req := range c.traces {
		for _, rs := range req.ResourceSpans {
			services = append(services, attr(rs.GetResource().GetAttributes(), "service.name"))
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
	}
	return names, services
}

// histogramBounds returns the explicit bounds of the histogram metric
// name, and whether it was received.
func (c *collector) histogramBounds(name string) ([]float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, req := range c.metrics {
		for _, rm := range req.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if m.Name != name {
						continue
					}
					for _, p := range m.GetHistogram().GetDataPoints() {
						return p.ExplicitBounds, true
					}
					return nil, true
				}
			}
		}
	}
	return nil, false
}

func (c *collector) metricRequests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.metrics)
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// miniNodes returns go-redis clients of three miniredis nodes.
func miniNodes(t *testing.T) []redis.UniversalClient {
	t.Helper()
	var nodes []redis.UniversalClient
	for range 3 {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		nodes = append(nodes, rdb)
	}
	return nodes
}

// TestSetupExportsTheLibrarysSpansAndMetrics: a redlock Client created with
// no telemetry option records through the globals that Setup installs, and
// shutdown flushes spans and metrics to the OTLP/HTTP endpoint of the
// environment.
func TestSetupExportsTheLibrarysSpansAndMetrics(t *testing.T) {
	isolate(t)
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test")
	ctx := context.Background()

	shutdown, err := otlp.Setup(ctx, "otlp-test")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	// No telemetry option: the Client records through the globals. (It
	// must be created after Setup here: only the first Setup of a process
	// reaches Clients created before it, through the API's forwarding
	// globals, and other tests of this package call Setup too.)
	c, err := redlock.New(miniNodes(t))
	if err != nil {
		_ = shutdown(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	l, err := c.Acquire(ctx, []string{"report"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	names, services := col.spans()
	for _, want := range []string{tracing.SpanAcquire, tracing.RoundSpanName("acquire", tracing.OutcomeGranted),
		tracing.SpanRelease, tracing.RoundSpanName("release", tracing.OutcomeGranted)} {
		if !slices.Contains(names, want) {
			t.Errorf("exported spans %v: no %s", names, want)
		}
	}
	for _, s := range services {
		if s != "otlp-test" {
			t.Errorf("service.name = %q, want otlp-test", s)
		}
	}
	bounds, ok := col.histogramBounds(tracing.MetricAcquireDuration)
	if !ok {
		t.Fatalf("metric %s not exported", tracing.MetricAcquireDuration)
	}
	if !slices.Equal(bounds, tracing.DurationBuckets) {
		t.Errorf("%s bounds = %v, want tracing.DurationBuckets %v", tracing.MetricAcquireDuration, bounds, tracing.DurationBuckets)
	}
}

func TestServiceNameFromTheEnvironmentWins(t *testing.T) {
	isolate(t)
	col := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
	ctx := context.Background()
	shutdown, err := otlp.Setup(ctx, "from-code")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	_, span := otel.Tracer("test").Start(ctx, "work")
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	names, services := col.spans()
	if !slices.Equal(names, []string{"work"}) || !slices.Equal(services, []string{"from-env"}) {
		t.Errorf("got spans %v of services %v, want [work] of [from-env]", names, services)
	}
	if n := col.metricRequests(); n != 0 {
		t.Errorf("%d metric exports with OTEL_METRICS_EXPORTER=none, want 0", n)
	}
}

func TestSetupRejectsUnsupportedSettings(t *testing.T) {
	for _, tc := range []struct{ key, value string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "thrift"},
		{"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "udp"},
		{"OTEL_TRACES_EXPORTER", "zipkin"},
		{"OTEL_METRICS_EXPORTER", "prometheus"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			isolate(t)
			t.Setenv(tc.key, tc.value)
			before := otel.GetTracerProvider()
			shutdown, err := otlp.Setup(context.Background(), "x")
			if err == nil {
				_ = shutdown(context.Background())
				t.Fatalf("Setup with %s=%s: no error", tc.key, tc.value)
			}
			if !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.value) {
				t.Errorf("error %q does not name %s=%s", err, tc.key, tc.value)
			}
			if otel.GetTracerProvider() != before {
				t.Error("a failed Setup replaced the global tracer provider")
			}
		})
	}
}

func TestSDKDisabled(t *testing.T) {
	isolate(t)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	before := otel.GetTracerProvider()
	shutdown, err := otlp.Setup(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("Setup with OTEL_SDK_DISABLED=true replaced the global tracer provider")
	}
}

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		want       bool
	}{
		{"", "", false},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", true},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces", true},
		{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:4318/v1/metrics", true},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "  ", false},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", false},
	} {
		isolate(t)
		if tc.key != "" {
			t.Setenv(tc.key, tc.value)
		}
		if got := otlp.Enabled(); got != tc.want {
			t.Errorf("Enabled() with %s=%q = %v, want %v", tc.key, tc.value, got, tc.want)
		}
	}
}
