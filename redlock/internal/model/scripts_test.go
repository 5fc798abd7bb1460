package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/script"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// redisNode runs calls on a real redis-server and reads its key space.
type redisNode struct {
	t   *testing.T
	rdb *redis.Client
	src map[string]string // script sources by name, from redlock/scripts
}

func newRedisNode(t *testing.T) *redisNode {
	t.Helper()
	s := redlocktest.StartServer(t)
	n := &redisNode{t: t, rdb: s.Client(t), src: map[string]string{}}
	for _, name := range []string{"acquire", "extend", "release", "fence", "check", "note", "abandon", "holders",
		"reentrant", "fencing", "gate", "record", "highwater", "wake", "releaselog"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "scripts", name+".lua"))
		if err != nil {
			t.Fatal(err)
		}
		n.src[name] = string(b)
	}
	return n
}

func (n *redisNode) run(c Call) any {
	argv := make([]any, len(c.Argv))
	for i, a := range c.Argv {
		argv[i] = a
	}
	src := n.src[c.Script]
	if k, ok := kinds[c.Script]; ok { // a template with the call's layers
		src = Layout(c.Script, c.Layers, n.src).Assemble(n.src[k.template])
	} else if strings.Contains(src, "--@ layout") { // a whole script that reads TOKEN (abandon)
		src = script.New(nil, 0, 0).Assemble(src)
	}
	v, err := n.rdb.Eval(context.Background(), src, c.Keys, argv...).Result()
	if err != nil && err != redis.Nil {
		n.t.Fatalf("%s on redis: %v", c.Script, err)
	}
	return v
}

// dumpScript reads the whole key space and the clock in one script, so
// that a pause of the test process while the keys are read neither lets
// keys expire between them nor moves their expiry: {now in ms, {key,
// type, value (a string, or a flat list of fields and values, or the
// list's elements), PTTL}...}.
var dumpScript = redis.NewScript(`
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
for _, k in ipairs(redis.call('KEYS', '*')) do
  local typ = redis.call('TYPE', k)['ok']
  local v = false
  if typ == 'string' then v = redis.call('GET', k)
  elseif typ == 'hash' then v = redis.call('HGETALL', k)
  elseif typ == 'list' then v = redis.call('LRANGE', k, 0, -1)
  end
  out[#out + 1] = {k, typ, v, redis.call('PTTL', k)}
end
return out
`)

// store reads the node's key space as a Store, at the node's time of
// the reading (dumpScript).
func (n *redisNode) store() Store {
	v, err := dumpScript.Run(context.Background(), n.rdb, nil).Slice()
	if err != nil {
		n.t.Fatal(err)
	}
	st := Store{Now: v[0].(int64)}
	for _, x := range v[1:] {
		kv := x.([]any)
		e := Entry{Key: kv[0].(string)}
		switch typ := kv[1].(string); typ {
		case "string":
			e.Kind, e.Str = 's', kv[2].(string)
		case "hash":
			e.Kind = 'h'
			h := kv[2].([]any)
			for i := 0; i+1 < len(h); i += 2 {
				e.Hash = append(e.Hash, Field{h[i].(string), h[i+1].(string)})
			}
			slices.SortFunc(e.Hash, func(a, b Field) int { return strings.Compare(a.Name, b.Name) })
		case "list":
			e.Kind = 'l'
			for _, y := range kv[2].([]any) {
				e.List = append(e.List, y.(string))
			}
		default:
			n.t.Fatalf("key %q of type %s", e.Key, typ)
		}
		if pttl := kv[3].(int64); pttl >= 0 { // 0: it expires within the millisecond
			e.Exp = st.Now + pttl
		}
		st.put(e)
	}
	return st
}

// tolerance bounds the clock difference between the node's run of a call
// and the model's (the model runs at the node time read just before).
const tolerance = 40 // ms

// sameInt compares replies and values that may come from the clock:
// equal, or both clock readings (ms or µs) or durations above 9 ms within
// the tolerance. Flags, counts and indexes (below 10) must be equal.
func sameInt(a, b int64) bool {
	d := max(a-b, b-a)
	switch {
	case a == b:
		return true
	case min(a, b) > 1e14: // µs clock readings (fencing tokens)
		return d <= tolerance*1000
	case min(a, b) >= 10:
		return d <= tolerance
	}
	return false
}

// sameReply compares a reply of redis (go-redis's types) with the model's.
func sameReply(got, want any) bool {
	switch w := want.(type) {
	case nil:
		return got == nil
	case int64:
		g, ok := got.(int64)
		return ok && sameInt(g, w)
	case string:
		return sameValue(fmt.Sprint(got), w)
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameReply(g[i], w[i]) {
				return false
			}
		}
		return true
	}
	return false
}

// sameValue compares stored strings: equal, or integers equal by sameInt.
func sameValue(a, b string) bool {
	x, errA := strconv.ParseInt(a, 10, 64)
	y, errB := strconv.ParseInt(b, 10, 64)
	if errA == nil && errB == nil {
		return sameInt(x, y)
	}
	return a == b
}

// diffStores returns how the live keys of got (redis) and want (model)
// differ: kinds, values, fields and TTLs (within the tolerance); "" when
// they agree.
func diffStores(got, want Store) string {
	var diffs []string
	live := func(s Store) map[string]Entry {
		m := map[string]Entry{}
		for _, e := range s.Keys {
			if e.Exp == 0 || s.Now <= e.Exp {
				m[e.Key] = e
			}
		}
		return m
	}
	// A key that one side still has and the other has let expire is no
	// difference when it has at most the tolerance left: the two ran the
	// call that set it up to the tolerance apart.
	expiring := func(e Entry, now int64) bool { return e.Exp != 0 && e.Exp-now <= tolerance }
	g, w := live(got), live(want)
	for k, we := range w {
		ge, ok := g[k]
		if !ok {
			if !expiring(we, want.Now) {
				diffs = append(diffs, fmt.Sprintf("%q: missing on redis (model: %s)", k, entryText(we, want.Now)))
			}
			continue
		}
		if !sameEntry(ge, got.Now, we, want.Now) {
			diffs = append(diffs, fmt.Sprintf("%q: redis %s, model %s", k, entryText(ge, got.Now), entryText(we, want.Now)))
		}
	}
	for k, ge := range g {
		if _, ok := w[k]; !ok && !expiring(ge, got.Now) {
			diffs = append(diffs, fmt.Sprintf("%q: only on redis (%s)", k, entryText(ge, got.Now)))
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "\n")
}

func entryText(e Entry, now int64) string {
	s := Store{Now: now, Keys: []Entry{e}}
	return strings.TrimSpace(s.String())
}

func sameEntry(g Entry, gNow int64, w Entry, wNow int64) bool {
	if g.Kind != w.Kind || !sameValue(g.Str, w.Str) || len(g.Hash) != len(w.Hash) || !slices.Equal(g.List, w.List) {
		return false
	}
	for i := range g.Hash {
		if g.Hash[i].Name != w.Hash[i].Name || !sameValue(g.Hash[i].Val, w.Hash[i].Val) {
			return false
		}
	}
	if (g.Exp == 0) != (w.Exp == 0) {
		return false
	}
	return g.Exp == 0 || max(g.Exp-gNow, 0)-max(w.Exp-wNow, 0) <= tolerance && max(w.Exp-wNow, 0)-max(g.Exp-gNow, 0) <= tolerance
}

// nearExpiry returns how long until both copies of every key that
// expires within the tolerance on either side, a or b, have expired, or 0:
// a call then would race the expiry. The two copies' expiry times may
// differ by up to the tolerance (the calls that set them ran that far
// apart).
func nearExpiry(a, b Store) time.Duration {
	// left maps each key of s that expires to its time left (0 if past).
	left := func(s Store) map[string]int64 {
		m := map[string]int64{}
		for _, e := range s.Keys {
			if e.Exp != 0 {
				m[e.Key] = max(e.Exp-s.Now, 0)
			}
		}
		return m
	}
	la, lb := left(a), left(b)
	var wait int64
	for _, m := range []map[string]int64{la, lb} {
		for k, l := range m {
			if l <= tolerance {
				wait = max(wait, la[k]+2, lb[k]+2)
			}
		}
	}
	return time.Duration(wait) * time.Millisecond
}

// lockstep runs calls on a redis node and on a model store side by side.
type lockstep struct {
	t     *testing.T
	node  *redisNode
	model Store
	seen  map[string]bool // reply kinds seen, "script:kind"
	calls int
}

func newLockstep(t *testing.T) *lockstep {
	return &lockstep{t: t, node: newRedisNode(t), seen: map[string]bool{}}
}

// sync sets the model's clock to the node's, after waiting out keys about
// to expire, and returns the node's key space as the call will find it.
func (ls *lockstep) sync() Store {
	st := ls.node.store()
	ls.model.Now = st.Now
	if d := nearExpiry(ls.model, st); d > 0 {
		time.Sleep(d)
		st = ls.node.store()
		ls.model.Now = st.Now
	}
	return st
}

// call runs c on both, compares the replies and the key spaces, and
// returns the node's reply.
func (ls *lockstep) call(what string, c Call) any {
	ls.t.Helper()
	node := ls.sync()
	before := ls.model.String()
	want := c.Run(&ls.model)
	got := ls.node.run(c)
	ls.calls++
	ls.seen[c.Script+":"+replyKind(c.Script, want)] = true
	if !sameReply(got, want) {
		ls.t.Fatalf("%s: %s%q %q: redis replied %#v, the model %#v\nmodel before:\n%s\nredis before:\n%s", what, c.Script, c.Keys, c.Argv, got, want, before, node.String())
	}
	ls.compare(what + ": after " + c.Script)
	return got
}

// compare fails the test when the key spaces differ.
func (ls *lockstep) compare(what string) {
	ls.t.Helper()
	st := ls.node.store()
	ls.model.Now = st.Now
	ls.model.Purge()
	if d := diffStores(st, ls.model); d != "" {
		ls.t.Fatalf("%s: the key spaces differ:\n%s\nmodel:\n%s", what, d, ls.model.String())
	}
}

// sleep lets time pass on both (the model follows the node's clock).
func (ls *lockstep) sleep(d time.Duration) {
	time.Sleep(d)
	ls.compare(fmt.Sprintf("after %v", d))
}

// restart empties both, as a restart without persistence does.
func (ls *lockstep) restart() {
	if err := ls.node.rdb.FlushAll(context.Background()).Err(); err != nil {
		ls.t.Fatal(err)
	}
	ls.model.Keys = nil
}

// replyKind names the kind of a reply, for coverage.
func replyKind(script string, r any) string {
	switch v := r.(type) {
	case int64:
		if (script == "release" || script == "undo") && v > 1 {
			return "n"
		}
		return strconv.FormatInt(v, 10)
	case []any:
		if script == "holders" {
			return "read"
		}
		k := fmt.Sprint(v[0])
		if script == "acquire" && v[0] == int64(0) {
			k += fmt.Sprintf("/by%d", min(v[3].(int64), 1))
		}
		if script == "acquire" && v[0] == int64(1) && len(v) > 3 && v[3].(int64) > 0 {
			k += "/kept"
		}
		return k
	}
	return fmt.Sprint(r)
}

// TestScriptsMatchRedis runs the same calls (keys and arguments as the
// redlock client builds them, and clock advances) on a real redis-server
// and on the model's scripts, and compares every reply and the whole key
// space after every call: values, hash fields, lists and TTLs (within
// the tolerance). A change to a .lua file that the model does not follow
// fails here. The named scenarios reach every reply of every script; the
// random part mixes owners, features and restarts.
func TestScriptsMatchRedis(t *testing.T) {
	ls := newLockstep(t)
	scenarios(ls)
	random(ls, rand.New(rand.NewPCG(33, 1)), 400)
	want := []string{
		"acquire:1", "acquire:1/kept", "acquire:0/by1", "acquire:0/by0", "acquire:0/by-1", "acquire:2",
		"extend:0", "extend:1", "extend:3", "extend:2",
		"release:0", "release:1", "release:n", "fence:0", "fence:1", "check:0", "check:1", "note:1",
		"abandon:0", "abandon:1", "holders:read",
	}
	for _, k := range want {
		if !ls.seen[k] {
			t.Errorf("no call replied %s: the comparison misses that branch", k)
		}
	}
	t.Logf("%d calls compared", ls.calls)
}

// scenarios plays named sequences that reach each reply of each script.
func scenarios(ls *lockstep) {
	plain := LockSpec{Prefix: "p:", Resources: []string{"r"}, Wait: true}
	a, b := Value("a", "ma"), Value("b", "mb")
	ls.call("plain grant", plain.AcquireCall(a, "", 400))
	ls.call("refused and marked", plain.AcquireCall(b, "", 400))
	ls.call("extend ours", plain.ExtendCall(a, "", 1000))
	ls.call("shorter extend keeps the TTL", plain.ExtendCall(a, "", 300))
	ls.call("extend another's", plain.ExtendCall(b, "", 1000))
	ls.call("release another's", plain.ReleaseCall(b, "", false, nil))
	ls.call("release ours", plain.ReleaseCall(a, "", false, nil))
	ls.call("extend regains", plain.ExtendCall(a, "", 200))
	ls.sleep(250 * time.Millisecond)

	multi := LockSpec{Prefix: "p:", Resources: []string{"x", "y"}, Fencing: true}
	ls.call("multi grant", multi.AcquireCall(a, "", 500))
	ls.call("fence", multi.FenceCall(5, 60000))
	ls.call("fence repeated", multi.FenceCall(5, 60000))
	ls.call("check above", multi.CheckCall(4))
	ls.call("check at", multi.CheckCall(5))
	ls.call("multi refused by y", LockSpec{Prefix: "p:", Resources: []string{"z", "y"}}.AcquireCall(b, "", 500))
	ls.call("multi release", multi.ReleaseCall(a, "", false, nil))

	re := LockSpec{Prefix: "p:", Resources: []string{"q"}, Reentrant: true, Fencing: true}
	o := Value("owner", "")
	ls.call("first hold", re.AcquireCall(o, "h1", 600))
	ls.call("first hold's fence", re.FenceCall(7, 60000))
	ls.call("note", re.NoteCall(7, "h1"))
	ls.call("re-entry keeps", re.AcquireCall(o, "h2", 300))
	ls.call("reentrant extend", re.ExtendCall(o, "h2", 900))
	ls.call("release of a hold not there", re.ReleaseCall(o, "h9", false, nil))
	ls.call("one hold left", re.ReleaseCall(o, "h1", false, nil))
	ls.call("last hold", re.ReleaseCall(o, "h2", false, nil))

	gated := LockSpec{Prefix: "g:", Resources: []string{"r"}, Gate: 300}
	ls.call("fresh node gated", gated.AcquireCall(a, "", 300))
	ls.call("still gated", gated.ExtendCall(a, "", 300))
	ls.sleep(320 * time.Millisecond)
	ls.call("gate passed", gated.AcquireCall(a, "", 300))
	ls.restart()
	ls.call("restarted: extend gated", gated.ExtendCall(a, "", 300))

	rec := LockSpec{Prefix: "s:", Resources: []string{"job"}, Record: "rec", RecordTTL: 800, Mark: "mark", MarkAt: 10, MarkTTL: 5000}
	ls.call("record and mark", rec.AcquireCall(a, "", 300))
	ls.call("release keeps the record", rec.ReleaseCall(a, "", false, &ReleaseLog{Name: "log", Len: 2, TTL: 5000, Entries: []string{"e1", "e2", "e3"}}))
	ls.call("refused by the record", rec.AcquireCall(b, "", 300))
	ls.sleep(820 * time.Millisecond)
	ls.call("refused by the mark", rec.AcquireCall(b, "", 300))
	rec.MarkAt = 11
	ls.call("mark raised", rec.AcquireCall(b, "", 300))
	ls.call("undo puts the mark back", rec.ReleaseCall(b, "", true, nil))
	ls.call("second undo leaves it", rec.ReleaseCall(b, "", true, nil))
	ls.call("holders", Call{Script: "holders", Keys: []string{"s:job", "p:q", "g:r"}})
	ls.call("abandon of none", rec.AbandonCall("zz"))
	ls.call("abandon", rec.AbandonCall("ma"))
}

// random plays n random calls of three owners (one reentrant) on two
// resources with random features, TTLs, sleeps and restarts.
func random(ls *lockstep, rng *rand.Rand, n int) {
	specs := []LockSpec{
		{Prefix: "z:", Resources: []string{"r"}},
		{Prefix: "z:", Resources: []string{"r"}, Fencing: true, Wait: true},
		{Prefix: "z:", Resources: []string{"r", "s"}, Fencing: true},
		{Prefix: "z:", Resources: []string{"r"}, Reentrant: true, Fencing: true},
		{Prefix: "z:", Resources: []string{"s"}, Gate: 400},
		{Prefix: "z:", Resources: []string{"s"}, Record: "rec", RecordTTL: 300, Mark: "m", MarkAt: 1, MarkTTL: 900},
	}
	owners := []string{"x", "y", "w"}
	for i := range n {
		spec := specs[rng.IntN(len(specs))]
		owner := owners[rng.IntN(len(owners))]
		v, aid := Value(owner, "md"+owner), ""
		if spec.Reentrant {
			v, aid = Value("reentrant", ""), fmt.Sprintf("a%d", rng.IntN(3))
		}
		spec.MarkAt = int64(1 + rng.IntN(3))
		ttl := int64(100 + rng.IntN(600))
		what := fmt.Sprintf("random call %d", i)
		switch k := rng.IntN(20); {
		case k < 6:
			r := ls.call(what, spec.AcquireCall(v, aid, ttl))
			if g, ok := r.([]any); ok && g[0] == int64(1) && spec.Fencing && rng.IntN(4) > 0 {
				tok := g[1].(int64)
				ls.call(what+" fence", spec.FenceCall(tok, 5000))
				if spec.Reentrant {
					ls.call(what+" note", spec.NoteCall(tok, aid))
				}
			}
		case k < 10:
			ls.call(what, spec.ExtendCall(v, aid, ttl))
		case k < 14:
			ls.call(what, spec.ReleaseCall(v, aid, rng.IntN(2) == 0, nil))
		case k < 15 && spec.Fencing:
			ls.call(what, spec.CheckCall(int64(rng.IntN(3))*1e15))
		case k < 16:
			ls.call(what, spec.AbandonCall("md"+owner))
		case k < 19:
			ls.sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		default:
			ls.restart()
		}
	}
}
