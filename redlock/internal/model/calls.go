package model

import (
	"strconv"
	"strings"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// Call is one script call on one node: the script's name (acquire,
// extend, release and undo: a core template with Layers; else a whole
// script's file name), its keys and its arguments, as the redlock client
// sends them.
type Call struct {
	Script string
	Layers []string // the lock's layers (names of shapes), in order
	Keys   []string
	Argv   []string
}

// Run runs c on st and returns the script's reply.
func (c Call) Run(st *Store) any { return Script(st, c) }

// Layout returns the layout of c's script.
func (c Call) Layout() *script.Layout { return cachedLayout(c.Script, c.Layers) }

// run returns what c's fragments read on st.
func (c Call) run(st *Store) *run {
	x := &run{st: st, lay: c.Layout(), keys: c.Keys, argv: c.Argv, value: c.Argv[0], tok: tok(c.Argv[0])}
	if kinds[c.Script].args == 2 { // release, undo: value, n
		n, _ := num(c.Argv[1])
		x.n = int(n)
	} else { // acquire, extend: value, ttl, n
		n, _ := num(c.Argv[2])
		x.ttl, x.n = must(num(c.Argv[1])), int(n)
	}
	return x
}

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
	Notices   bool  // a Release publishes a notice where it deletes a marked key
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

// layers returns the lock's layers in redlock's registry order
// (layer.go): wake for an Acquire's attempts (Wait), notice for a
// Release (Notices), log for a Release with a log.
func (l LockSpec) layers(log *ReleaseLog) []string {
	var out []string
	add := func(on bool, name string) {
		if on {
			out = append(out, name)
		}
	}
	add(l.Reentrant, "reentrant")
	add(l.Fencing, "fencing")
	add(l.Gate > 0, "gate")
	add(l.Record != "", "record")
	add(l.Mark != "", "mark")
	add(l.Wait, "wake")
	add(l.Notices, "notice")
	add(log != nil, "log")
	return out
}

// call builds script kind's call: the lock keys and core arguments, then
// the keys and arguments of each layer in the script, where the layout
// puts them.
func (l LockSpec) call(kindName string, core []string, aid string, log *ReleaseLog) Call {
	c := Call{Script: kindName, Keys: l.lockKeys(), Argv: core}
	for _, name := range l.layers(log) {
		if !inScript(kindName, name) {
			continue
		}
		c.Layers = append(c.Layers, name)
		c.Keys = append(c.Keys, l.layerKeys(name, log)...)
		c.Argv = append(c.Argv, l.layerArgs(name, aid, log)...)
	}
	return c
}

// layerKeys mirrors each layer's keys (redlock: reentrant.go,
// fencing.go, gating.go, record.go, highwater.go, releaselog.go).
func (l LockSpec) layerKeys(name string, log *ReleaseLog) []string {
	switch name {
	case "reentrant":
		return suffixed(l.lockKeys(), holdsSuffix)
	case "fencing":
		return l.CounterKeys()
	case "gate":
		return []string{l.Prefix + gateName, l.Prefix + legacyGateName}
	case "record":
		return []string{l.Prefix + l.Record}
	case "mark":
		return []string{l.Prefix + l.Mark}
	case "log":
		return []string{l.Prefix + log.Name}
	}
	return nil
}

// layerArgs mirrors each layer's arguments (the notice ID of a cleanup
// is "").
func (l LockSpec) layerArgs(name, aid string, log *ReleaseLog) []string {
	switch name {
	case "reentrant":
		return []string{aid}
	case "gate":
		return []string{itoa(l.Gate)}
	case "record":
		return []string{itoa(l.RecordTTL)}
	case "mark":
		return []string{itoa(l.MarkAt), itoa(l.MarkTTL)}
	case "notice":
		return []string{""}
	case "log":
		return append([]string{itoa(log.Len), itoa(log.TTL)}, log.Entries...)
	}
	return nil
}

// CounterKeys are the fencing counters.
func (l LockSpec) CounterKeys() []string { return suffixed(l.lockKeys(), fencingSuffix) }

// must is the number of tonumber(x) that the core's templates read.
func must(n int64, _ bool) int64 { return n }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// AcquireCall is acquire.go's acquire call of one attempt.
func (l LockSpec) AcquireCall(value, aid string, ttl int64) Call {
	return l.call("acquire", []string{value, itoa(ttl), itoa(int64(len(l.Resources)))}, aid, nil)
}

// ExtendCall is lock.go's extend call.
func (l LockSpec) ExtendCall(value, aid string, ttl int64) Call {
	return l.call("extend", []string{value, itoa(ttl), itoa(int64(len(l.Resources)))}, aid, nil)
}

// ReleaseCall is lock.go's releaseCall: a release, or the undo of a
// failed attempt (which also deletes its record and puts back its
// mark). log, when not nil, is WithReleaseLog's list: its length, TTL and
// entries.
func (l LockSpec) ReleaseCall(value, aid string, undo bool, log *ReleaseLog) Call {
	kindName := "release"
	if undo {
		kindName = "undo"
	}
	return l.call(kindName, []string{value, itoa(int64(len(l.Resources)))}, aid, log)
}

// ReleaseLog is WithReleaseLog's list.
type ReleaseLog struct {
	Name     string
	Len, TTL int64
	Entries  []string
}

// FenceCall records token on the counters (fencing.go).
func (l LockSpec) FenceCall(token, retention int64) Call {
	return Call{Script: "fence", Keys: l.CounterKeys(), Argv: []string{itoa(token), itoa(retention)}}
}

// CheckCall confirms a kept token (fencing.go).
func (l LockSpec) CheckCall(kept int64) Call {
	return Call{Script: "check", Keys: l.CounterKeys(), Argv: []string{itoa(kept)}}
}

// NoteCall notes token in the holds of acquisition aid (fencing.go).
func (l LockSpec) NoteCall(token int64, aid string) Call {
	return Call{Script: "note", Keys: suffixed(l.lockKeys(), holdsSuffix), Argv: []string{itoa(token), aid}}
}

// AbandonCall is Client.ReleaseAbandoned's call for a lock of one
// resource with metadata md (and the lock's mark, if any).
func (l LockSpec) AbandonCall(md string) Call {
	keys := []string{l.lockKeys()[0], l.lockKeys()[0] + holdsSuffix}
	if l.Mark != "" {
		keys = append(keys, l.Prefix+l.Mark)
	}
	return Call{Script: "abandon", Keys: keys, Argv: []string{md}}
}
