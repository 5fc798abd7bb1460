package redlock

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// grants is a feature written only here, as a new one would be in its
// own file: it counts the grants of a lock's first resource on each node
// (in the acquire script, all or nothing with the lock's keys), reads the
// count back from the reply, and deletes the counter with the lock.
type grants struct {
	baseLayer
	seen int64 // the largest count a quorum's grant returned
}

var grantsPart = script.Part{Name: "grants", Fixed: 1, Reply: 1, Hooks: map[string]string{
	"granted": "reply[R.grants + 1] = redis.call('INCR', KEYS[K.grants + 1])",
	"deleted": "if i == 1 then redis.call('DEL', KEYS[K.grants + 1]) end",
}}

func (*grants) part() script.Part { return grantsPart }

func (*grants) keys(lockKeys []string) []string { return []string{lockKeys[0] + nul + "grants"} }

func (g *grants) granted(_ context.Context, _ *attempt, lay *script.Layout, _ call, rs []NodeResult) *QuorumError {
	for _, r := range rs {
		if r.Outcome == OutcomeOK {
			g.seen = max(g.seen, intAt(r.reply, lay.Reply("grants")))
		}
	}
	return nil
}

// TestANewFeatureIsOneLayer: a layer that the core has never heard of
// takes part in the acquire and release scripts through the seam alone:
// its key and reply element are laid out, its fragment runs at its hooks,
// and its Go step reads what the script returned.
func TestANewFeatureIsOneLayer(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c, err := New([]redis.UniversalClient{rdb}, WithKeyPrefix("p:"), WithFencing(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	ctx := context.Background()
	var l *Lock
	for want := int64(1); want <= 2; want++ {
		if l != nil {
			m.Del("p:r") // the lock's key expired, say: the counter stays
		}
		if l, err = c.newLock(ctx, []string{"r"}, time.Second, nil, true); err != nil {
			t.Fatal(err)
		}
		g := &grants{}
		l.layers = append(l.layers, g)
		if q := c.attempt(ctx, l, 1, true); q != nil {
			t.Fatalf("attempt %d: %v", want, q)
		}
		if g.seen != want {
			t.Errorf("grant %d: the layer read count %d from the reply, want %d", want, g.seen, want)
		}
		if got := l.FencingToken(); got == 0 {
			t.Errorf("grant %d: fencing token 0 beside the new layer", want)
		}
		if got, _ := m.Get("p:r\x00grants"); got != strconv.FormatInt(want, 10) {
			t.Errorf("grant %d: counter on the node %q, want %d", want, got, want)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Exists("p:r") || m.Exists("p:r\x00grants") {
		t.Errorf("after Release the node has keys %q, want neither the lock's nor the counter", m.Keys())
	}
}

// TestScriptKeyHoldsEveryLayer: a script's key has room for every layer
// of the registry and a Release's log.
func TestScriptKeyHoldsEveryLayer(t *testing.T) {
	if n := len(registry) + 1; n > maxLayers {
		t.Fatalf("%d layers (the registry's and a Release's log), scriptKey holds %d: raise maxLayers", n, maxLayers)
	}
}

// TestTheCoreNamesNoFeature: the core files' code (not their comments)
// names no feature: each comes in through the seam (issue 32). A new
// feature's name belongs in this list.
func TestTheCoreNamesNoFeature(t *testing.T) {
	feature := regexp.MustCompile(`(?i)fenc|reentr|gate|gating|wake|notice|record|highwater|mark|releaselog|quorumfirst|hedge|unasked|heldback`)
	for _, name := range []string{"acquire.go", "round.go", "lock.go", "client.go"} {
		fs := token.NewFileSet()
		f, err := parser.ParseFile(fs, name, nil, 0) // no comments
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var text string
			switch x := n.(type) {
			case *ast.Ident:
				text = x.Name
			case *ast.BasicLit:
				text = x.Value
			}
			if feature.MatchString(text) {
				t.Errorf("%s: %s names a feature; use the seam (layer.go, round.go's askingOrder)", fs.Position(n.Pos()), text)
			}
			return true
		})
	}
}
