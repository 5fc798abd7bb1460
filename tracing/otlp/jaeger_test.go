package otlp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/schedlock/schedlock/tracing/otlp"
)

// jaegerHint tells how to get the Jaeger binary the end-to-end tests need.
const jaegerHint = `JAEGER_BIN is not set: the end-to-end tests need a Jaeger v2 binary.
Build it once (about 5 minutes cold; .ci/test does this and caches it):
    (cd tracing/internal/jaegertool && go build -o $HOME/.cache/schedlock/jaeger-v1.76.0/jaeger github.com/jaegertracing/jaeger/cmd/jaeger)
then run the tests with JAEGER_BIN=$HOME/.cache/schedlock/jaeger-v1.76.0/jaeger.
SCHEDLOCK_SKIP_JAEGER=1 skips these tests instead (only for machines that cannot build Jaeger).`

// jaegerConfig is a minimal Jaeger v2 configuration: OTLP receivers, the
// in-memory store and the query API, each on its own port of 127.0.0.1,
// and nothing else. The keys are those of the all-in-one configuration
// (cmd/jaeger/internal/all-in-one.yaml in the Jaeger module), which binds
// a dozen fixed ports (sampling, health check, zipkin, collector metrics
// on 8888, ...) that could be taken, e.g. by a Jaeger the developer runs.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
      grpc:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// jaeger is a Jaeger v2 process started by startJaeger.
type jaeger struct {
	query    string // base URL of the query API (HTTP)
	otlpHTTP string // OTLP/HTTP endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT
	otlpGRPC string // OTLP/gRPC endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT
	client   *http.Client
}

// startJaeger starts the Jaeger of JAEGER_BIN (default: the one .ci/test
// caches under the user cache directory) with in-memory storage, listening
// on free ports of 127.0.0.1 only, and stops it when the test ends. It fails
// the test when there is no binary, unless SCHEDLOCK_SKIP_JAEGER=1, in which
// case it skips it.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := os.Getenv("JAEGER_BIN")
	if bin == "" {
		// The binary .ci/test builds and caches, if it is there.
		if cache, err := os.UserCacheDir(); err == nil {
			if p := filepath.Join(cache, "schedlock", "jaeger-v1.76.0", "jaeger"); fileExists(p) {
				bin = p
			}
		}
	}
	if bin == "" {
		if os.Getenv("SCHEDLOCK_SKIP_JAEGER") == "1" {
			t.Skip("SCHEDLOCK_SKIP_JAEGER=1 and no JAEGER_BIN: skipping the end-to-end test with Jaeger")
		}
		t.Fatal(jaegerHint)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("JAEGER_BIN=%s: %v\n%s", bin, err, jaegerHint)
	}
	// Free ports are found by listening and closing; another process may
	// take one in between, so try a few times.
	var lastErr error
	for range 3 {
		j, err := tryStartJaeger(t, bin)
		if err == nil {
			return j
		}
		lastErr = err
	}
	t.Fatalf("start Jaeger (%s): %v", bin, lastErr)
	return nil
}

func tryStartJaeger(t *testing.T, bin string) (*jaeger, error) {
	t.Helper()
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, jaegerConfig, ports[0], ports[1], ports[2], ports[3]), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "jaeger.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, "--config="+cfg)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}

	j := &jaeger{
		query:    fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		otlpHTTP: fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		otlpGRPC: fmt.Sprintf("http://127.0.0.1:%d", ports[3]),
		client:   &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second},
	}
	deadline := time.Now().Add(60 * time.Second) // a loaded CI machine
	for {
		if ready(j.client, j.query+"/api/services") && dialable(ports[2]) && dialable(ports[3]) {
			break
		}
		select {
		case err := <-exited:
			exited <- err // for stop
			return nil, fmt.Errorf("jaeger exited before it was ready (%v); its log:\n%s", err, tail(logPath))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("jaeger not ready after 60s; its log:\n%s", tail(logPath))
		}
	}
	t.Cleanup(func() {
		j.client.CloseIdleConnections()
		stop()
		if t.Failed() {
			t.Logf("jaeger log:\n%s", tail(logPath))
		}
	})
	return j, nil
}

// freePorts returns n distinct free TCP ports of 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func ready(c *http.Client, u string) bool {
	resp, err := c.Get(u)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func dialable(port int) bool {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// tail returns the end of the file at path.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Jaeger's query API (v1 JSON, as its UI uses it).
type (
	jResponse struct {
		Data   []jTrace `json:"data"`
		Errors []struct {
			Code int    `json:"code"`
			Msg  string `json:"msg"`
		} `json:"errors"`
	}
	jTrace struct {
		TraceID   string              `json:"traceID"`
		Spans     []jSpan             `json:"spans"`
		Processes map[string]jProcess `json:"processes"`
	}
	jSpan struct {
		TraceID       string `json:"traceID"`
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []jRef `json:"references"`
		StartTime     int64  `json:"startTime"` // µs since the epoch
		Duration      int64  `json:"duration"`  // µs
		Tags          []jTag `json:"tags"`
		ProcessID     string `json:"processID"`
	}
	jRef struct {
		RefType string `json:"refType"` // CHILD_OF (parent) or FOLLOWS_FROM (link)
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	}
	jTag struct {
		Key   string `json:"key"`
		Type  string `json:"type"`
		Value any    `json:"value"`
	}
	jProcess struct {
		ServiceName string `json:"serviceName"`
		Tags        []jTag `json:"tags"`
	}
)

// tag returns the value of the span's tag key, and whether it is there.
func (s jSpan) tag(key string) (any, bool) {
	for _, tg := range s.Tags {
		if tg.Key == key {
			return tg.Value, true
		}
	}
	return nil, false
}

// str returns the tag as a string ("" if absent); numbers as JSON has them.
func (s jSpan) str(key string) string {
	v, ok := s.tag(key)
	if !ok {
		return ""
	}
	if str, ok := v.(string); ok {
		return str
	}
	return fmt.Sprint(v)
}

// num returns a numeric tag (-1 if absent or not a number).
func (s jSpan) num(key string) float64 {
	v, ok := s.tag(key)
	if !ok {
		return -1
	}
	f, ok := v.(float64)
	if !ok {
		return -1
	}
	return f
}

// get fetches path from the query API; it returns the body.
func (j *jaeger) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.query+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

// search runs GET /api/traces?service=service[&tags=...] and returns the
// traces found ("not found" gives none).
func (j *jaeger) search(ctx context.Context, service string, tags map[string]string) ([]jTrace, error) {
	q := url.Values{"service": {service}, "limit": {"100"}, "lookback": {"1h"}}
	if len(tags) > 0 {
		b, err := json.Marshal(tags)
		if err != nil {
			return nil, err
		}
		q.Set("tags", string(b))
	}
	body, err := j.get(ctx, "/api/traces?"+q.Encode())
	if err != nil {
		return nil, err
	}
	var r jResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decode /api/traces: %w", err)
	}
	if len(r.Errors) > 0 {
		return nil, fmt.Errorf("/api/traces: %v", r.Errors)
	}
	return r.Data, nil
}

// poll calls f every 100 ms until it returns nil or timeout has passed,
// and returns f's last error.
func poll(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var errNotYet = errors.New("not there yet")

// exportTo points Setup at a collector for this test only: OTLP over
// protocol to endpoint, traces only (Jaeger takes no metrics), service
// name service, every other OTEL_* variable cleared.
func exportTo(t *testing.T, protocol, endpoint, service string) {
	t.Helper()
	isolate(t)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_SERVICE_NAME", service)
	t.Setenv("OTEL_METRICS_EXPORTER", "none")
}

// setupExport calls otlp.Setup(serviceName) for the environment exportTo
// set, and returns flush: Setup's shutdown, which exports what is left,
// bounded by 10 s, failing t when that export fails. When a test ends
// without calling flush, the cleanup shuts down all the same.
func setupExport(t *testing.T, serviceName string) (flush func()) {
	t.Helper()
	ctx := context.Background()
	shutdown, err := otlp.Setup(ctx, serviceName)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { _ = shutdown(ctx) }) })
	return func() {
		t.Helper()
		once.Do(func() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := shutdown(sctx); err != nil {
				t.Fatalf("shutdown (export to Jaeger): %v", err)
			}
		})
	}
}

// short shortens a value for failure messages.
func short(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 2000 {
		s = s[:2000] + "..."
	}
	return strings.TrimSpace(s)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
