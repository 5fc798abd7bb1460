package tracing

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// maxIdentityPart bounds the service and host parts of DefaultIdentity, so
// that an identity fits in a lock's metadata (redlock.MaxMetadata) with room
// to spare.
const maxIdentityPart = 64

var (
	// identities counts the DefaultIdentity calls of this process.
	identities atomic.Int64
	// processToken tells apart processes that share a host name and a
	// process ID: containers restarted as process 1, hosts of one name in
	// different domains.
	processToken = func() string {
		var b [2]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}()
)

// DefaultIdentity returns a readable identity for a scheduler instance or
// an election candidate of this process: "<service>/<host>-<pid>-<token>",
// e.g. "billing/web-3-19350-1a2b", the default of scheduler.WithInstanceID
// and elector.WithIdentity. The service is OTEL_SERVICE_NAME, or else the
// executable's file name; the host is the host name up to its first dot;
// each part is cut to at most 64 bytes of valid UTF-8; the token is 4 hex
// digits drawn once per process, so that a restarted process (a container's
// process 1 again) or a host of the same name elsewhere gets another
// identity. The second and later calls in one process append "-2", "-3",
// ..., so that several Lockers or Electors of one process have distinct
// identities. Safe for concurrent use.
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
	id := fmt.Sprintf("%s/%s-%d-%s", cut(service, maxIdentityPart), cut(host, maxIdentityPart), os.Getpid(), processToken)
	if n := identities.Add(1); n > 1 {
		id += fmt.Sprintf("-%d", n)
	}
	return id
}

// cut returns s as valid UTF-8 of at most n bytes (cut at a character
// boundary), without "/" and "@", the separators of identities and of the
// scheduler's metadata.
func cut(s string, n int) string {
	s = strings.ToValidUTF8(strings.NewReplacer("/", "-", "@", "-").Replace(s), "?")
	if s == "" {
		s = "unknown"
	}
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return s
}
