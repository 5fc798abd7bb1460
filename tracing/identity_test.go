package tracing_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/schedlock/schedlock/tracing"
)

func TestDefaultIdentityIsReadableAndDistinctPerCall(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "billing.api/v2@eu")
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	a, b := tracing.DefaultIdentity(), tracing.DefaultIdentity()
	want := regexp.MustCompile(fmt.Sprintf(`^billing\.api-v2-eu/[^/@.]+-%d-[0-9a-f]{4}(-\d+)?$`, os.Getpid()))
	for _, id := range []string{a, b} {
		if !want.MatchString(id) {
			t.Errorf("DefaultIdentity() = %q, want <service>/<host>-<pid> like %s (host %q)", id, want, host)
		}
	}
	if a == b {
		t.Errorf("two DefaultIdentity calls both returned %q, want distinct identities", a)
	}
}

func TestDefaultIdentityCutsLongNamesAtACharacter(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", strings.Repeat("a", 63)+"é-service")
	id := tracing.DefaultIdentity()
	if !utf8.ValidString(id) {
		t.Fatalf("DefaultIdentity() = %q: not valid UTF-8 (an OTLP export of a span with it fails)", id)
	}
	if service, _, _ := strings.Cut(id, "/"); service != strings.Repeat("a", 63) {
		t.Errorf("service part %q, want the 63 a's: 64 bytes would split the é", service)
	}
}
