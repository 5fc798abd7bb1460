package tracing_test

import (
	"fmt"
	"os"
	"regexp"
	"testing"

	"github.com/schedlock/schedlock/tracing"
)

func TestDefaultIdentityIsReadableAndDistinctPerCall(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "billing.api/v2@eu")
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	a, b := tracing.DefaultIdentity(), tracing.DefaultIdentity()
	want := regexp.MustCompile(fmt.Sprintf(`^billing\.api-v2-eu/[^/@.]+-%d(-\d+)?$`, os.Getpid()))
	for _, id := range []string{a, b} {
		if !want.MatchString(id) {
			t.Errorf("DefaultIdentity() = %q, want <service>/<host>-<pid> like %s (host %q)", id, want, host)
		}
	}
	if a == b {
		t.Errorf("two DefaultIdentity calls both returned %q, want distinct identities", a)
	}
}
