package redlock

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The key namespace. A resource's lock key is the key prefix followed by
// the resource name, as users see it in Redis. The keys the package uses
// for itself are the lock key or the prefix followed by a NUL byte and a
// name: "<key>\x00holds" (a reentrant lock's holds), "<key>\x00fencing" (a
// fencing counter), "<prefix>\x00restart-gate" (the gate marker). Neither
// a resource name nor a key prefix may contain a NUL byte (ErrInvalidArgument),
// so no resource can name one of them, and no two of them coincide. The
// one exception, the marker of releases before 0.2, "<prefix>redlock:restart-gate",
// is a reserved resource name (ErrInvalidArgument).
const (
	nul           = "\x00"
	holdsSuffix   = nul + "holds"
	fencingSuffix = nul + "fencing"
	gateName      = nul + "restart-gate"
	// legacyGateName is where releases before 0.2 kept the gate marker; a
	// gated acquisition reads it once, so that upgrading does not gate
	// every node again.
	legacyGateName = "redlock:restart-gate"
	// releasedSuffix turns a lock key into the pub/sub channel of its
	// release notices (a channel, not a key).
	releasedSuffix = ":released"
)

// Lock values. A value is the owner token (16 random bytes as 32 hex
// digits; for a reentrant lock, derived from the owner ID), then '-' or 'T'
// followed by the W3C traceparent (55 characters) of the acquiring span,
// then the metadata. Other clients read the trace context and metadata of a
// holder from a refused round; the owner token never leaves the package.
// A waiter that a key refused marks it for a release notice by turning
// the byte after the token into '_' (for '-') or 't' (for 'T'); ownership
// checks compare the token only.
const tokenLen = script.TokenLen

// traceparentLen is the length of a version-00 W3C traceparent.
const traceparentLen = 55

// reserved says why name may not name a resource (nor a key that an
// option adds), or "": the gate marker of releases before 0.2.
func reserved(name string) string {
	if name == legacyGateName {
		return "releases before 0.2 kept the restart gate marker under it"
	}
	return ""
}

// newToken returns a random owner token. (A layer may give an attempt a
// token of its own: a reentrant owner's, reentrant.go.)
func newToken() string {
	var b [tokenLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}

// newAcquisitionID returns a random ID for one hold of a reentrant lock.
func newAcquisitionID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// buildValue lays out a lock value (see above).
func buildValue(token, traceparent, metadata string) string {
	if traceparent == "" {
		return token + "-" + metadata
	}
	return token + "T" + traceparent + metadata
}

// splitValue returns the trace context and metadata of a lock value,
// marked or not; ok is false for a value not written by this package.
func splitValue(v string) (traceparent, metadata string, ok bool) {
	switch {
	case len(v) > tokenLen && (v[tokenLen] == '-' || v[tokenLen] == '_'):
		return "", v[tokenLen+1:], true
	case len(v) >= tokenLen+1+traceparentLen && (v[tokenLen] == 'T' || v[tokenLen] == 't'):
		return v[tokenLen+1 : tokenLen+1+traceparentLen], v[tokenLen+1+traceparentLen:], true
	}
	return "", "", false
}

// asWritten returns v as its owner wrote it, the same on every node:
// without the wait mark that a waiter may have set on some nodes only
// (wake.go).
func asWritten(v string) string {
	if len(v) <= tokenLen {
		return v
	}
	switch v[tokenLen] {
	case '_':
		return v[:tokenLen] + "-" + v[tokenLen+1:]
	case 't':
		return v[:tokenLen] + "T" + v[tokenLen+1:]
	}
	return v
}

// hasNUL reports whether s contains a NUL byte.
func hasNUL(s string) bool { return strings.Contains(s, nul) }

// checkAddedKey validates the name of a key that option adds to an
// acquisition or a release (a record, a mark, a release log): not empty, no NUL byte, not reserved,
// none of taken (the lock's resources and other added keys), and no
// reentrant owner.
func checkAddedKey(option, what, name string, taken []string, owner string) error {
	switch {
	case name == "":
		return invalidf("the %s name (%s) is empty", what, option)
	case hasNUL(name):
		return invalidf("%s name %s (%s) contains a NUL byte", what, quoteName(name), option)
	case reserved(name) != "":
		return invalidf("%s name %s (%s) is reserved: %s", what, quoteName(name), option, reserved(name))
	case slices.Contains(taken, name):
		return invalidf("%s name %s (%s) is also a resource of the lock, or its record", what, quoteName(name), option)
	case owner != "":
		return invalidf("%s cannot be combined with WithOwner", option)
	}
	return nil
}
