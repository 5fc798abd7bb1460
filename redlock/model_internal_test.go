package redlock

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/model"
)

// TestModelBuildsTheClientsCalls: the model (redlock/internal/model)
// builds the acquire, undo and release calls with the keys and arguments
// this package sends, for every combination of the features it models,
// so that the model's scripts, compared with Redis there, run what the
// client runs.
func TestModelBuildsTheClientsCalls(t *testing.T) {
	var nodes []redis.UniversalClient
	for i := range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", i+1)}) // never dialled
		t.Cleanup(func() { _ = rdb.Close() })
		nodes = append(nodes, rdb)
	}
	for _, gate := range []time.Duration{0, 2 * time.Second} {
		for _, owner := range []string{"", "o"} {
			for _, fencing := range []bool{false, true} {
				name := fmt.Sprintf("gate=%v owner=%q fencing=%v", gate, owner, fencing)
				opts := []Option{WithKeyPrefix("p:")}
				if gate > 0 {
					opts = append(opts, WithRestartGating(gate))
				}
				c, err := New(nodes, opts...)
				if err != nil {
					t.Fatal(err)
				}
				lockOpts := []LockOption{WithFencing(fencing)}
				if owner != "" {
					lockOpts = append(lockOpts, WithOwner(owner))
				}
				l, err := c.newLock(context.Background(), []string{"a", "b"}, 1500*time.Millisecond, lockOpts, true)
				if err != nil {
					t.Fatal(err)
				}
				a := l.nextAttempt()
				aid := ""
				if r := layerOf[*reentrant](l); r != nil {
					aid = r.aid
				}
				spec := model.LockSpec{Prefix: "p:", Resources: []string{"a", "b"}, Reentrant: owner != "", Fencing: fencing,
					Gate: gate.Milliseconds(), Wait: true, Notices: true}
				got := l.scriptCall(kindAcquire, "acquire", a, nil, []any{a.value, l.ttl.Milliseconds(), l.n})
				same(t, name+" acquire", got, spec.AcquireCall(a.value, aid, 1500))
				got = l.scriptCall(kindExtend, "extend", a, nil, []any{a.value, l.ttl.Milliseconds(), l.n})
				same(t, name+" extend", got, spec.ExtendCall(a.value, aid, 1500))
				for _, k := range []scriptKind{kindUndo, kindRelease} {
					same(t, name+" undo/release", l.releaseCall(k, a), spec.ReleaseCall(a.value, aid, k == kindUndo, nil))
				}
				log := &model.ReleaseLog{Name: "log", Len: 3, TTL: 5000, Entries: []string{"e1", "e2"}}
				extra, err := releaseLayers(l, []ReleaseOption{WithReleaseLog("log", 3, 5*time.Second, "e1", "e2")})
				if err != nil {
					t.Fatal(err)
				}
				got = l.releaseCall(kindRelease, a, extra...)
				same(t, name+" release with a log", got, spec.ReleaseCall(a.value, aid, false, log))
				if err := c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// same fails unless the call's keys, args and layout are the model's
// call's.
func same(t *testing.T, what string, got layerCall, want model.Call) {
	t.Helper()
	argv := make([]string, len(got.call.args))
	for i, a := range got.call.args {
		argv[i] = fmt.Sprint(a)
	}
	if !slices.Equal(got.keys, want.Keys) || !slices.Equal(argv, want.Argv) {
		t.Errorf("%s: the client sends keys %q args %q, the model %q %q", what, got.keys, argv, want.Keys, want.Argv)
	}
	if g, w := got.layout.Parts(), want.Layout().Parts(); !slices.Equal(g, w) {
		t.Errorf("%s: the client's script has the layers %q, the model's %q", what, g, w)
	}
}
