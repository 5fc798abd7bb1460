package tracing

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

// maxIdentityPart bounds the service and host parts of DefaultIdentity, so
// that an identity fits in a lock's metadata (redlock.MaxMetadata) with room
// to spare.
const maxIdentityPart = 64

// identities counts the DefaultIdentity calls of this process.
var identities atomic.Int64

// DefaultIdentity returns a readable identity for a scheduler instance or
// an election candidate of this process: "<service>/<host>-<pid>", e.g.
// "billing/web-3-19350", the default of scheduler.WithInstanceID and
// elector.WithIdentity. The service is OTEL_SERVICE_NAME, or else the
// executable's file name; the host is the host name up to its first dot;
// each part is cut to 64 bytes. The second and later calls in one process
// append "-2", "-3", ..., so that several Lockers or Electors of one process
// have distinct identities. Safe for concurrent use.
func DefaultIdentity() string {
	service := os.Getenv("OTEL_SERVICE_NAME")
	if service == "" {
		if exe, err := os.Executable(); err == nil {
			service = strings.TrimSuffix(filepath.Base(exe), ".exe")
		}
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	host, _, _ = strings.Cut(host, ".")
	id := fmt.Sprintf("%s/%s-%d", cut(service, maxIdentityPart), cut(host, maxIdentityPart), os.Getpid())
	if n := identities.Add(1); n > 1 {
		id += fmt.Sprintf("-%d", n)
	}
	return id
}

// cut returns s without a trailing part beyond n bytes (and without
// "/" and "@", the separators of identities and the scheduler's metadata).
func cut(s string, n int) string {
	s = strings.NewReplacer("/", "-", "@", "-").Replace(s)
	if s == "" {
		s = "unknown"
	}
	if len(s) > n {
		s = s[:n]
	}
	return s
}
