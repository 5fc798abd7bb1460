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
				l, err := c.newLock(context.Background(), []string{"a", "b"}, 1500*time.Millisecond, lockOpts)
				if err != nil {
					t.Fatal(err)
				}
				value, aid := l.nextAttempt()
				spec := model.LockSpec{Prefix: "p:", Resources: []string{"a", "b"}, Reentrant: owner != "", Fencing: fencing,
					Gate: gate.Milliseconds(), Wait: true}
				got := c.acquireSpec(l, value, aid, 2, true)
				same(t, name+" acquire", got.keys, got.args, spec.AcquireCall(value, aid, 1500))
				for _, op := range []string{"undo", "release"} {
					got := c.releaseCall(l, op, value, aid, "")
					same(t, name+" "+op, got.keys, got.args, spec.ReleaseCall(value, aid, op == "undo", nil))
				}
				if err := c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// same fails unless keys and args are the model's call's.
func same(t *testing.T, what string, keys []string, args []any, want model.Call) {
	t.Helper()
	argv := make([]string, len(args))
	for i, a := range args {
		argv[i] = fmt.Sprint(a)
	}
	if !slices.Equal(keys, want.Keys) || !slices.Equal(argv, want.Argv) {
		t.Errorf("%s: the client sends keys %q args %q, the model %q %q", what, keys, argv, want.Keys, want.Argv)
	}
}
