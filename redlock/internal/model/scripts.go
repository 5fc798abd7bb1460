package model

import (
	"strconv"
)

// The scripts of redlock/scripts/*.lua, one Go function each, line for
// line: same keys, same arguments (strings, as ARGV), same replies (int64
// for a Lua number, string, nil for false, []any for a table). A reviewer
// reads each beside its .lua file; TestScriptsMatchRedis runs both on the
// same calls and compares replies and key spaces, so that a change to one
// without the other fails.

// Script runs one script by its file name (without .lua) on st.
func Script(st *Store, name string, keys, argv []string) any {
	switch name {
	case "acquire":
		return Acquire(st, keys, argv)
	case "extend":
		return Extend(st, keys, argv)
	case "release":
		return Release(st, keys, argv)
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
	panic("model: no script " + name)
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

// arg returns argv[i] (1-based, as in Lua) and whether it is there.
func arg(argv []string, i int) (string, bool) {
	if i > len(argv) {
		return "", false
	}
	return argv[i-1], true
}

// tok returns string.sub(v, 1, 32): the owner token.
func tok(v string) string { return v[:min(32, len(v))] }

// nowMs is the scripts' TIME in ms: t[1] * 1000 + floor(t[2] / 1000).
func nowMs(st *Store) int64 {
	sec, usec := st.Time()
	return sec*1000 + usec/1000
}

// gate is the restart gate check of acquire.lua and extend.lua: nil when
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

// Acquire is scripts/acquire.lua.
func Acquire(st *Store, keys, argv []string) any {
	n, _ := num(argv[2])
	aid := argv[3]
	ttl, _ := num(argv[1])
	rttl, _ := num(argv[7])
	hwArg, _ := arg(argv, 9)
	hw, hasHW := num(hwArg)
	last := len(keys)
	mk := ""
	if hasHW {
		mk = keys[last-1]
		last--
	}
	rk := ""
	if rttl > 0 {
		rk = keys[last-1]
		last--
	}
	nk := n
	if aid != "" {
		nk = 2 * n
	}

	// Restart gating.
	if argv[5] != "0" {
		g, _ := num(argv[5])
		if r := gate(st, g, keys[last-2], keys[last-1]); r != nil {
			return r
		}
	}

	t := tok(argv[0])
	if rk != "" {
		if v, ok := st.Get(rk); ok && tok(v) != t {
			return []any{int64(0), v, st.PTTL(rk), int64(0)}
		}
	}
	var mark [3]string // m, v, pm
	var markOK [3]bool
	if mk != "" {
		for i, f := range []string{"m", "v", "pm"} {
			mark[i], markOK[i] = st.HGet(mk, f)
		}
		if m, _ := num(mark[0]); markOK[0] && tok(mark[1]) != t && m >= hw {
			return []any{int64(0), mark[1], st.PTTL(mk), int64(-1), m}
		}
	}
	mine := int64(0)
	for i := range n {
		v, ok := st.Get(keys[i])
		if ok {
			if tok(v) != t {
				if argv[6] == "1" && len(v) > 32 {
					switch v[32] {
					case '-':
						st.SetRange1(keys[i], 32, '_')
					case 'T':
						st.SetRange1(keys[i], 32, 't')
					}
				}
				return []any{int64(0), v, st.PTTL(keys[i]), i + 1}
			}
			mine++
		}
	}
	for i := range n {
		raise(st, keys[i], argv[0], ttl)
		if aid != "" {
			st.HSet(keys[n+i], aid, "1")
			if st.PTTL(keys[n+i]) < ttl {
				st.PExpire(keys[n+i], ttl)
			}
		}
	}
	if rk != "" {
		st.Set(rk, argv[0], rttl, false)
	}
	before := int64(0)
	if mk != "" {
		if markOK[0] && tok(mark[1]) == t {
			before, _ = num(mark[2])
		} else {
			before, _ = num(mark[0])
			st.HSet(mk, "m", hwArg)
			st.HSet(mk, "v", argv[0])
			st.HSet(mk, "pm", mark[0]) // '' when there was none
			st.HSet(mk, "pv", mark[1])
		}
		mttl, _ := num(argv[9])
		st.PExpire(mk, mttl)
	}
	if argv[4] != "1" {
		if mk != "" {
			return []any{int64(1), int64(0), int64(0), int64(0), before}
		}
		return []any{int64(1)}
	}

	// Fencing.
	largest := int64(0)
	for i := nk; i < nk+n; i++ {
		if c := numOr0(st.Get(keys[i])); c > largest {
			largest = c
		}
	}
	sec, usec := st.Time()
	token := max(largest+1, sec*1000000+usec)
	if aid != "" && mine == n {
		if kept, ok := st.HGet(keys[n], "_t"); ok {
			k, _ := num(kept)
			return []any{int64(1), token, largest, k, before}
		}
	}
	return []any{int64(1), token, largest, int64(0), before}
}

// Extend is scripts/extend.lua.
func Extend(st *Store, keys, argv []string) any {
	t := tok(argv[0])
	ttl, _ := num(argv[1])
	reentrant := argv[2] == "1"
	gated := argv[4] != "0"
	last := len(keys)
	if gated {
		last -= 2
	}
	n := last
	if reentrant {
		n /= 2
	}
	missing := false
	for i := range n {
		v, ok := st.Get(keys[i])
		if !ok {
			missing = true
		} else if tok(v) != t {
			return int64(0)
		}
	}
	if missing && gated {
		g, _ := num(argv[4])
		if r := gate(st, g, keys[last], keys[last+1]); r != nil {
			return r
		}
	}
	for i := range n {
		raise(st, keys[i], argv[0], ttl)
		if reentrant {
			st.HSet(keys[n+i], argv[3], "1")
			if st.PTTL(keys[n+i]) < ttl {
				st.PExpire(keys[n+i], ttl)
			}
		}
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

// Release is scripts/release.lua.
func Release(st *Store, keys, argv []string) any {
	t := tok(argv[0])
	aid := argv[1]
	n := len(keys)
	list := ""
	if _, ok := arg(argv, 5); ok {
		list = keys[n-1]
		n--
	}
	if a, _ := arg(argv, 4); a == "1" {
		mk := keys[n-1]
		n--
		if m, ok := hmget(st, mk, "v", "pm", "pv"); ok[0] && tok(m[0]) == t {
			undoMark(st, mk, m, ok)
		}
	}
	if aid != "" {
		n /= 2
	}
	mine := int64(0)
	for i := range n {
		v, ok := st.Get(keys[i])
		if ok && tok(v) == t {
			mine++
			last := true
			if aid != "" {
				h := keys[n+i]
				st.HDel(h, aid)
				_, hasT := st.HGet(h, "_t")
				tc := int64(0)
				if hasT {
					tc = 1
				}
				last = st.HLen(h)-tc <= 0
				if last {
					st.Del(h)
				}
			}
			if last {
				st.Del(keys[i])
				// PUBLISH of a release notice: no state.
			}
		}
	}
	if list != "" {
		for i := 7; i <= len(argv); i++ {
			st.LPush(list, argv[i-1])
		}
		l, _ := num(argv[4])
		st.LTrim(list, int(l))
		px, _ := num(argv[5])
		st.PExpire(list, px)
	}
	return mine
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
	if len(v) < 33 {
		return "", false
	}
	switch v[32] {
	case '-', '_':
		return v[33:], true
	case 'T', 't':
		return v[min(len(v), 33+55):], true
	}
	return "", false
}

// Abandon is scripts/abandon.lua.
func Abandon(st *Store, keys, argv []string) any {
	done := int64(0)
	if v, ok := st.Get(keys[0]); ok {
		if md, ok := metadata(v); ok && md == argv[0] {
			st.Del(keys[0])
			done = 1
		}
	}
	if len(keys) >= 2 {
		m, ok := hmget(st, keys[1], "v", "pm", "pv")
		if md, mdOK := metadata(m[0]); ok[0] && mdOK && md == argv[0] {
			undoMark(st, keys[1], m, ok)
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
