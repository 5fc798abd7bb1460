package redlock

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// Reentrancy (WithOwner). Every acquisition of one owner shares an owner
// token derived from the owner ID (ownerToken), so the acquire
// script counts the owner's keys as its own, and each acquisition adds its
// acquisition ID, new for every attempt, as a field of the hash
// "<key>\x00holds" beside each lock key, in the same script
// (scripts/reentrant.lua). Release removes its own field and deletes the
// lock key only when no hold is left; extend and re-entry only raise
// TTLs, never lower them, since holds share the keys. A retried command
// never counts twice: its acquisition ID is the same. With fencing, the
// hash also notes the token of the current hold (field "_t") for
// re-entries to keep (fencing.go).

//go:embed scripts/reentrant.lua
var reentrantSrc string

var reentrantPart = script.Part{Name: "reentrant", PerKey: 1, Args: 1, Hooks: script.Parse(reentrantSrc)}

// reentrant is the layer of a Lock with an owner.
type reentrant struct {
	baseLayer
	token string // the owner's token
	// aid is the acquisition ID of the Lock's last attempt, new for each:
	// the hold's once the Lock is held. begin sets it while the Lock is
	// being acquired, before anyone else has it; afterwards it is only
	// read (its extensions, its release).
	aid string
}

func newReentrant(_ *Client, cfg *lockConfig, _ []string, _ bool) (layer, error) {
	if cfg.owner == "" {
		return nil, nil
	}
	return &reentrant{token: ownerToken(cfg.owner)}, nil
}

// ownerToken returns the owner token that every acquisition of owner
// shares: derived from the owner ID, as long as a random one (keys.go).
func ownerToken(owner string) string {
	sum := sha256.Sum256([]byte("schedlock/redlock owner\x00" + owner))
	return hex.EncodeToString(sum[:tokenLen/2])
}

func (*reentrant) part() script.Part { return reentrantPart }

// keys returns the holds hashes.
func (*reentrant) keys(lockKeys []string) []string { return perKey(lockKeys, holdsSuffix) }

// args passes the acquisition ID.
func (r *reentrant) args(scriptKind, *attempt) []any { return []any{r.aid} }

// begin gives the attempt the owner's token and a new acquisition ID.
// The token repeats across the owner's attempts, so the acquisition ID is
// what tells them apart (acquire.go, nextAttempt): the undo or cleanup of
// one attempt removes its own hold only, never what a later attempt set.
func (r *reentrant) begin(a *attempt) { a.token, r.aid = r.token, newAcquisitionID() }

// WithOwner makes the lock reentrant for owner (reentrant.go): an
// acquisition by the same owner of resources that owner already holds
// succeeds at once (one quorum round) and adds a hold; each Lock's Release
// removes its own hold, and the keys are deleted when the last hold is
// released. TTLs are refreshed on reentry and never lowered. Holds share
// the keys' TTL and do not expire one by one: a hold whose process died
// without releasing keeps the keys until that TTL ends (each re-entry
// raises it), after the other holds released. A Lock whose hold expired
// gets ErrLockLost from Release even when its owner holds the resources
// again by another acquisition (that hold stays). With fencing,
// a re-entry of resources the owner holds keeps the hold's token; one that
// adds resources is a new hold with a larger token (one token covers all of
// a lock's resources), which supersedes the older one at the resources they
// share (docs/fencing.md). Another owner is refused as usual. Go
// has no goroutine identity: owner is yours to choose (a job ID, a request
// ID), non-empty and at most MaxOwner bytes; whoever knows it shares the
// lock. A SharedOption: given to a call (Acquire, TryAcquire, Do), that
// lock's owner; given to New, the owner of every lock of the Client, so
// that all its callers share its locks (and calls with WithRecord or
// WithHighWater, which a reentrant lock cannot take, fail). Default: not
// reentrant.
func WithOwner(owner string) SharedOption {
	return sharedOption(func(l *lockConfig) { l.owner, l.ownerSet = owner, true })
}

// checkOwner validates WithOwner.
func checkOwner(cfg *lockConfig) error {
	switch {
	case cfg.ownerSet && cfg.owner == "":
		return invalidf("owner ID (WithOwner) is empty")
	case len(cfg.owner) > MaxOwner:
		return invalidf("owner ID (WithOwner) is %d bytes, more than the maximum %d", len(cfg.owner), MaxOwner)
	}
	return nil
}
