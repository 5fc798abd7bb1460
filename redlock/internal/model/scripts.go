package model

import (
	"strconv"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The scripts of redlock/scripts/*.lua, one Go function each, line for
// line: same keys, same arguments (strings, as ARGV), same replies (int64
// for a Lua number, string, nil for false, []any for a table). A reviewer
// reads each beside its .lua file; TestScriptsMatchRedis runs both on the
// same calls and compares replies and key spaces, so that a change to one
// without the other fails.

// Script runs c's script on st: acquire, extend, release and undo are
// the core's templates with c's layers; the others are whole scripts, by
// file name (without .lua).
func Script(st *Store, c Call) any {
	keys, argv := c.Keys, c.Argv
	switch c.Script {
	case "acquire":
		return Acquire(st, c)
	case "extend":
		return Extend(st, c)
	case "release", "undo":
		return Release(st, c)
	case "fence":
		return Fence(st, keys, argv)
	case "check":
		return Check(st, keys, argv)
	case "note":
		return Note(st, keys, argv)
	case "abandon":
		return Abandon(st, keys, argv)
	case "holders":
		return Holders(st, keys, argv)
	}
	panic("model: no script " + c.Script)
}

// num is Lua's tonumber for the integers the scripts pass; false for
// anything else, the empty string included.
func num(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// numOr0 is tonumber(x or '0') or 0.
func numOr0(s string, ok bool) int64 {
	if !ok {
		return 0
	}
	n, _ := num(s)
	return n
}

// tok returns string.sub(v, 1, TOKEN): the owner token.
func tok(v string) string { return v[:min(script.TokenLen, len(v))] }

// nowMs is the scripts' TIME in ms: t[1] * 1000 + floor(t[2] / 1000).
func nowMs(st *Store) int64 {
	sec, usec := st.Time()
	return sec*1000 + usec/1000
}

// gate is the restart gate check of gate.lua: nil when
// the gate has passed, else the reply {2, ms left} (after storing the
// server time in a missing marker).
func gate(st *Store, gateMs int64, marker, legacy string) any {
	now := nowMs(st)
	since, ok := num(getOr(st, marker))
	if !ok {
		since, ok = num(getOr(st, legacy))
		if !ok {
			st.Set(marker, strconv.FormatInt(now, 10), 0, false)
			return []any{int64(2), gateMs}
		}
		st.Set(marker, strconv.FormatInt(since, 10), 0, false)
	}
	if now-since < gateMs {
		return []any{int64(2), gateMs - (now - since)}
	}
	return nil
}

// getOr is redis.call('GET', k) or ”.
func getOr(st *Store, k string) string {
	v, _ := st.Get(k)
	return v
}

// raise is the scripts' "SET NX PX ttl, else raise the TTL to ttl when
// lower" of a lock key.
func raise(st *Store, key, val string, ttl int64) {
	if !st.Set(key, val, ttl, true) && st.PTTL(key) < ttl {
		st.PExpire(key, ttl)
	}
}

// Acquire is scripts/acquire.lua with the fragments of c's layers.
func Acquire(st *Store, c Call) any {
	x := c.run(st)
	for _, name := range x.lay.Parts() {
		if r := checkHook[name](x); r != nil {
			return r
		}
	}
	var set []int
	mine := 0
	for i := range x.n {
		if st.Set(x.keys[i], x.value, x.ttl, true) {
			set = append(set, i)
			continue
		}
		v, _ := st.Get(x.keys[i])
		if tok(v) != x.tok {
			for _, j := range set {
				st.Del(x.keys[j])
			}
			if x.has("wake") {
				wakeRefused(x, i, v)
			}
			return []any{int64(0), v, st.PTTL(x.keys[i]), int64(i + 1)}
		}
		mine++
	}
	for i := range x.n {
		if st.PTTL(x.keys[i]) < x.ttl {
			st.PExpire(x.keys[i], x.ttl)
		}
	}
	reply := make([]any, x.lay.Replies())
	reply[0] = int64(1)
	for _, name := range x.lay.Parts() {
		grantedHook[name](x, reply, mine)
	}
	return reply
}

// checkHook and grantedHook are the layers' check and granted sections
// of the acquire script (nil result: go on).
var (
	checkHook = map[string]func(x *run) any{
		"reentrant": func(*run) any { return nil },
		"fencing":   func(*run) any { return nil },
		"gate":      gateCheck,
		"record":    recordCheck,
		"mark":      markCheck,
		"wake":      func(*run) any { return nil },
	}
	grantedHook = map[string]func(x *run, reply []any, mine int){
		"reentrant": func(x *run, _ []any, _ int) { reentrantHolds(x) },
		"fencing":   fencingGranted,
		"gate":      func(*run, []any, int) {},
		"record":    func(x *run, _ []any, _ int) { recordGranted(x) },
		"mark":      func(x *run, reply []any, _ int) { markGranted(x, reply) },
		"wake":      func(*run, []any, int) {},
	}
)

// gateCheck is gate.lua (check and regain): nil when the gate has passed.
func gateCheck(x *run) any {
	g, _ := num(x.arg("gate", 1))
	return gate(x.st, g, x.key("gate", 1), x.key("gate", 2))
}

// recordCheck is record.lua's check.
func recordCheck(x *run) any {
	rk := x.key("record", 1)
	if v, ok := x.st.Get(rk); ok && tok(v) != x.tok {
		return []any{int64(0), v, x.st.PTTL(rk), x.refusal("record")}
	}
	return nil
}

// recordGranted is record.lua's granted.
func recordGranted(x *run) {
	px, _ := num(x.arg("record", 1))
	x.st.Set(x.key("record", 1), x.value, px, false)
}

// markCheck is highwater.lua's check.
func markCheck(x *run) any {
	mk := x.key("mark", 1)
	m, ok := hmget(x.st, mk, "m", "v")
	hw, _ := num(x.arg("mark", 1))
	if mv, _ := num(m[0]); ok[0] && tok(m[1]) != x.tok && mv >= hw {
		return []any{int64(0), m[1], x.st.PTTL(mk), x.refusal("mark"), mv}
	}
	return nil
}

// markGranted is highwater.lua's granted.
func markGranted(x *run, reply []any) {
	mk := x.key("mark", 1)
	m, ok := hmget(x.st, mk, "m", "v", "pm")
	at := x.lay.Reply("mark")
	if ok[0] && tok(m[1]) == x.tok {
		reply[at], _ = num(m[2])
	} else {
		reply[at], _ = num(m[0])
		x.st.HSet(mk, "m", x.arg("mark", 1))
		x.st.HSet(mk, "v", x.value)
		x.st.HSet(mk, "pm", m[0]) // '' when there was none
		x.st.HSet(mk, "pv", m[1])
	}
	mttl, _ := num(x.arg("mark", 2))
	x.st.PExpire(mk, mttl)
}

// wakeRefused is wake.lua's refused: mark the holder's key.
func wakeRefused(x *run, i int, v string) {
	if len(v) > script.TokenLen {
		switch v[script.TokenLen] {
		case '-':
			x.st.SetRange1(x.keys[i], script.TokenLen, '_')
		case 'T':
			x.st.SetRange1(x.keys[i], script.TokenLen, 't')
		}
	}
}

// reentrantHolds is reentrant.lua's granted and extended.
func reentrantHolds(x *run) {
	for i := 1; i <= x.n; i++ {
		h := x.key("reentrant", i)
		x.st.HSet(h, x.arg("reentrant", 1), "1")
		if x.st.PTTL(h) < x.ttl {
			x.st.PExpire(h, x.ttl)
		}
	}
}

// fencingGranted is fencing.lua's granted.
func fencingGranted(x *run, reply []any, mine int) {
	largest := int64(0)
	for i := 1; i <= x.n; i++ {
		if c := numOr0(x.st.Get(x.key("fencing", i))); c > largest {
			largest = c
		}
	}
	sec, usec := x.st.Time()
	at := x.lay.Reply("fencing")
	reply[at], reply[at+1], reply[at+2] = max(largest+1, sec*1000000+usec), largest, int64(0)
	if x.has("reentrant") && mine == x.n {
		if kept, ok := x.st.HGet(x.key("reentrant", 1), "_t"); ok {
			reply[at+2], _ = num(kept)
		}
	}
}

// Extend is scripts/extend.lua with the fragments of c's layers.
func Extend(st *Store, c Call) any {
	x := c.run(st)
	missing := false
	for i := range x.n {
		v, ok := st.Get(x.keys[i])
		if !ok {
			missing = true
		} else if tok(v) != x.tok {
			return int64(0)
		}
	}
	if missing && x.has("gate") {
		if r := gateCheck(x); r != nil {
			return r
		}
	}
	for i := range x.n {
		raise(st, x.keys[i], x.value, x.ttl)
	}
	if x.has("reentrant") {
		reentrantHolds(x)
	}
	if missing {
		return int64(3)
	}
	return int64(1)
}

// undoMark is the high-water mark undo of release.lua and abandon.lua:
// put back the mark before the one this acquisition raised (m holds v,
// pm, pv of the mark).
func undoMark(st *Store, mk string, m [3]string, ok [3]bool) {
	switch {
	case ok[1] && m[1] == "r":
		// the mark before is not known: leave it
	case ok[1] && m[1] != "":
		st.HSet(mk, "m", m[1])
		st.HSet(mk, "v", m[2])
		st.HSet(mk, "pm", "r")
		st.HSet(mk, "pv", "")
	default:
		st.Del(mk)
	}
}

// hmget is HMGET key f... (values and whether each is there).
func hmget(st *Store, key string, fields ...string) (m [3]string, ok [3]bool) {
	for i, f := range fields {
		m[i], ok[i] = st.HGet(key, f)
	}
	return m, ok
}

// Release is scripts/release.lua with the fragments of c's layers, for
// a release (c.Script "release") or an undo ("undo").
func Release(st *Store, c Call) any {
	x := c.run(st)
	if x.has("record") {
		if v, ok := st.Get(x.key("record", 1)); ok && tok(v) == x.tok {
			st.Del(x.key("record", 1))
		}
	}
	if x.has("mark") && c.Script == "undo" {
		mk := x.key("mark", 1)
		if m, ok := hmget(st, mk, "v", "pm", "pv"); ok[0] && tok(m[0]) == x.tok {
			undoMark(st, mk, m, ok)
		}
	}
	mine := releaseKeys(st, x)
	if x.has("log") {
		list := x.key("log", 1)
		for j := x.lay.Arg("log") + 3; j <= len(x.argv); j++ {
			st.LPush(list, x.argv[j-1])
		}
		l, _ := num(x.arg("log", 1))
		st.LTrim(list, int(l))
		px, _ := num(x.arg("log", 2))
		st.PExpire(list, px)
	}
	return mine
}

// releaseKeys is release.lua's loop over the lock keys: it deletes
// those that hold the lock's owner token (a reentrant hold keeps a key
// other holds use) and returns how many were this lock's.
func releaseKeys(st *Store, x *run) int64 {
	mine := int64(0)
	for i := range x.n {
		v, ok := st.Get(x.keys[i])
		if !ok || tok(v) != x.tok {
			continue
		}
		ours, last := true, true
		if x.has("reentrant") {
			ours, last = releaseHold(x, i+1)
		}
		if ours {
			mine++
		}
		if last {
			st.Del(x.keys[i])
			// wake.lua's deleted: PUBLISH of a release notice, no state.
		}
	}
	return mine
}

// releaseHold is reentrant.lua's hold: remove this hold of lock key i
// and report whether the key is still this hold's (ours: the hold was
// there) and whether it was the last.
func releaseHold(x *run, i int) (ours, last bool) {
	h := x.key("reentrant", i)
	if x.st.HDel(h, x.arg("reentrant", 1)) == 0 {
		return false, false
	}
	_, hasT := x.st.HGet(h, "_t")
	tc := int64(0)
	if hasT {
		tc = 1
	}
	last = x.st.HLen(h)-tc <= 0
	if last {
		x.st.Del(h)
	}
	return true, last
}

// Fence is scripts/fence.lua.
func Fence(st *Store, keys, argv []string) any {
	t, _ := num(argv[0])
	for _, k := range keys {
		if numOr0(st.Get(k)) >= t {
			return int64(0)
		}
	}
	px, _ := num(argv[1])
	for _, k := range keys {
		st.Set(k, argv[0], px, false)
	}
	return int64(1)
}

// Check is scripts/check.lua.
func Check(st *Store, keys, argv []string) any {
	m := int64(0)
	for _, k := range keys {
		if c := numOr0(st.Get(k)); c > m {
			m = c
		}
	}
	if kept, _ := num(argv[0]); m <= kept {
		return []any{int64(1), m}
	}
	return []any{int64(0), m}
}

// Note is scripts/note.lua.
func Note(st *Store, keys, argv []string) any {
	for _, k := range keys {
		if _, ok := st.HGet(k, argv[1]); ok {
			st.HSet(k, "_t", argv[0])
		}
	}
	return int64(1)
}

// metadata is abandon.lua's metadata(v): the metadata of a lock value,
// false for a value of another layout.
func metadata(v string) (string, bool) {
	t := script.TokenLen
	if len(v) < t+1 {
		return "", false
	}
	switch v[t] {
	case '-', '_':
		return v[t+1:], true
	case 'T', 't':
		return v[min(len(v), t+1+55):], true
	}
	return "", false
}

// Abandon is scripts/abandon.lua.
func Abandon(st *Store, keys, argv []string) any {
	done := int64(0)
	if v, ok := st.Get(keys[0]); ok && st.HLen(keys[1]) == 0 {
		if md, ok := metadata(v); ok && md == argv[0] {
			st.Del(keys[0])
			done = 1
		}
	}
	if len(keys) >= 3 {
		m, ok := hmget(st, keys[2], "v", "pm", "pv")
		if md, mdOK := metadata(m[0]); ok[0] && mdOK && md == argv[0] {
			undoMark(st, keys[2], m, ok)
			done = 1
		}
	}
	return done
}

// Holders is scripts/holders.lua (a read for Client.Holders: it changes
// nothing, and the protocol model does not call it).
func Holders(st *Store, keys, _ []string) any {
	out := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		if v, ok := st.Get(k); ok {
			out = append(out, v)
		} else {
			out = append(out, nil)
		}
		out = append(out, st.PTTL(k))
	}
	return out
}
