package otlp_test

import (
	"context"
	"testing"

	"github.com/schedlock/schedlock/tracing/otlp"
)

// TestSetupErrorTexts pins the texts of Setup's errors about the
// environment: the variable, its value, and what to use instead.
func TestSetupErrorTexts(t *testing.T) {
	for _, tc := range []struct{ key, value, want string }{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/json",
			`otlp: OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported: use http/protobuf or grpc`},
		{"OTEL_TRACES_EXPORTER", "zipkin", `otlp: OTEL_TRACES_EXPORTER="zipkin" is not supported: use otlp or none`},
	} {
		t.Run(tc.key, func(t *testing.T) {
			isolate(t)
			t.Setenv(tc.key, tc.value)
			shutdown, err := otlp.Setup(context.Background(), "x")
			if err == nil {
				_ = shutdown(context.Background())
				t.Fatalf("Setup with %s=%s: no error", tc.key, tc.value)
			}
			if err.Error() != tc.want {
				t.Errorf("Setup error reads\n%s\nwant\n%s", err, tc.want)
			}
		})
	}
}
