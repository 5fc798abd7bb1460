package model

import (
	"strconv"
	"strings"
)

// Call is one script call on one node: the script's file name, its keys
// and its arguments, as the redlock client sends them.
type Call struct {
	Script string
	Keys   []string
	Argv   []string
}

// Run runs c on st and returns the script's reply.
func (c Call) Run(st *Store) any { return Script(st, c.Script, c.Keys, c.Argv) }

// LockSpec is what decides the keys and arguments of one lock's calls:
// the features of the Lock (redlock.newLock and the option values).
// Times are in ms.
type LockSpec struct {
	Prefix    string
	Resources []string
	Reentrant bool  // WithOwner: holds hashes, an acquisition ID per attempt
	Fencing   bool  // WithFencing: counters, a token proposed by acquire
	Gate      int64 // WithRestartGating(maxTTL), 0 for off
	Wait      bool  // an Acquire's attempt marks a refusing holder's key (release notices)
	Record    string
	RecordTTL int64 // WithRecord
	Mark      string
	MarkAt    int64
	MarkTTL   int64 // WithHighWater
}

// Key namespace (redlock/keys.go).
const (
	holdsSuffix    = "\x00holds"
	fencingSuffix  = "\x00fencing"
	gateName       = "\x00restart-gate"
	legacyGateName = "redlock:restart-gate"
)

// Value is a lock value as redlock.buildValue lays it out without a
// trace context: the 32-character owner token, '-', the metadata.
func Value(token, metadata string) string { return OwnerToken(token) + "-" + metadata }

// OwnerToken pads name with '0' to the 32 characters of an owner token.
func OwnerToken(name string) string {
	if len(name) >= 32 {
		return name[:32]
	}
	return name + strings.Repeat("0", 32-len(name))
}

func (l LockSpec) lockKeys() []string {
	keys := make([]string, len(l.Resources))
	for i, r := range l.Resources {
		keys[i] = l.Prefix + r
	}
	return keys
}

func suffixed(keys []string, suffix string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + suffix
	}
	return out
}

func (l LockSpec) gateKeys() []string {
	return []string{l.Prefix + gateName, l.Prefix + legacyGateName}
}

// ownedKeys are the keys of extend and release: lock keys, then holds.
func (l LockSpec) ownedKeys() []string {
	keys := l.lockKeys()
	if l.Reentrant {
		keys = append(keys, suffixed(l.lockKeys(), holdsSuffix)...)
	}
	return keys
}

// CounterKeys are the fencing counters.
func (l LockSpec) CounterKeys() []string { return suffixed(l.lockKeys(), fencingSuffix) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func bit(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// AcquireCall is acquire.go's acquireSpec: keys lock, holds, counters,
// gate markers, record, mark.
func (l LockSpec) AcquireCall(value, aid string, ttl int64) Call {
	keys := l.ownedKeys()
	if l.Fencing {
		keys = append(keys, l.CounterKeys()...)
	}
	if l.Gate > 0 {
		keys = append(keys, l.gateKeys()...)
	}
	if l.Record != "" {
		keys = append(keys, l.Prefix+l.Record)
	}
	mark := ""
	if l.Mark != "" {
		keys = append(keys, l.Prefix+l.Mark)
		mark = itoa(l.MarkAt)
	}
	return Call{"acquire", keys, []string{value, itoa(ttl), itoa(int64(len(l.Resources))), aid, bit(l.Fencing),
		itoa(l.Gate), bit(l.Wait), itoa(l.RecordTTL), mark, itoa(l.MarkTTL)}}
}

// ExtendCall is lock.go's extend round: owned keys, then the gate
// markers.
func (l LockSpec) ExtendCall(value, aid string, ttl int64) Call {
	keys := l.ownedKeys()
	if l.Gate > 0 {
		keys = append(keys, l.gateKeys()...)
	}
	return Call{"extend", keys, []string{value, itoa(ttl), bit(l.Reentrant), aid, itoa(l.Gate)}}
}

// ReleaseCall is lock.go's releaseSpec: a release, or the undo of a
// failed attempt (which also deletes its record and puts back its
// mark). log, when not nil, is WithReleaseLog's list: its length, TTL and
// entries.
func (l LockSpec) ReleaseCall(value, aid string, undo bool, log *ReleaseLog) Call {
	keys, mark := l.ownedKeys(), ""
	if undo && l.Record != "" {
		keys = append(keys, l.Prefix+l.Record)
	}
	if undo && l.Mark != "" {
		keys, mark = append(keys, l.Prefix+l.Mark), "1"
	}
	argv := []string{value, aid, "", mark}
	if log != nil {
		keys = append(keys, l.Prefix+log.Name)
		argv = append(argv, itoa(log.Len), itoa(log.TTL))
		argv = append(argv, log.Entries...)
	}
	return Call{"release", keys, argv}
}

// ReleaseLog is WithReleaseLog's list.
type ReleaseLog struct {
	Name     string
	Len, TTL int64
	Entries  []string
}

// FenceCall records token on the counters (fencing.go).
func (l LockSpec) FenceCall(token, retention int64) Call {
	return Call{"fence", l.CounterKeys(), []string{itoa(token), itoa(retention)}}
}

// CheckCall confirms a kept token (fencing.go).
func (l LockSpec) CheckCall(kept int64) Call {
	return Call{"check", l.CounterKeys(), []string{itoa(kept)}}
}

// NoteCall notes token in the holds of acquisition aid (fencing.go).
func (l LockSpec) NoteCall(token int64, aid string) Call {
	return Call{"note", suffixed(l.lockKeys(), holdsSuffix), []string{itoa(token), aid}}
}

// AbandonCall is Client.ReleaseAbandoned's call for a lock of one
// resource with metadata md (and the lock's mark, if any).
func (l LockSpec) AbandonCall(md string) Call {
	keys := l.lockKeys()[:1]
	if l.Mark != "" {
		keys = append(keys, l.Prefix+l.Mark)
	}
	return Call{"abandon", keys, []string{md}}
}
