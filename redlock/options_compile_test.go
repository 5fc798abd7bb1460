package redlock_test

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
)

// snippetPrelude declares what the snippets of TestOptionKinds use: a
// snippet is the body of a function with ctx, nodes, a Client c and a
// Lock l.
const snippetPrelude = `package snippet

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/schedlock/schedlock/redlock"
)

var _ = time.Second

func snippet(ctx context.Context, nodes []redis.UniversalClient, c *redlock.Client, l *redlock.Lock) {
`

// TestOptionKinds type-checks small programs against the package, as a
// user's build would: an option compiles where it applies, and one that
// does not apply somewhere does not compile there (New takes no
// call-only option, Keep only KeepOptions).
func TestOptionKinds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	check := snippetChecker(t, "context", "time", "github.com/redis/go-redis/v9", "github.com/schedlock/schedlock/redlock")
	compiles := map[string]string{
		"client and shared options at New": `redlock.New(nodes, redlock.WithKeyPrefix("p:"), redlock.WithRetry(redlock.DefaultRetry),
			redlock.WithFencing(true), redlock.WithMetadata("m"), redlock.WithMetadataFunc(func() string { return "m" }),
			redlock.WithNodeTimeout(time.Second), redlock.WithOwner("o"), redlock.WithReleaseNotices(false),
			redlock.WithRetryIf(nil), redlock.WithPatientRounds(), redlock.WithQuorumFirst(),
			redlock.WithRefusalText(nil), redlock.ExtendEvery(time.Second))`,
		"call options": `opts := []redlock.LockOption{redlock.WithRecord("r", time.Second), redlock.WithHighWater("m", 1, time.Second),
			redlock.WithFencing(true), redlock.WithOwner("o"), redlock.WithNodeTimeout(time.Second), redlock.ExtendEvery(time.Second)}
		c.Acquire(ctx, []string{"a"}, time.Second, opts...)
		c.TryAcquire(ctx, []string{"a"}, time.Second, opts...)
		c.Do(ctx, []string{"a"}, time.Second, nil, opts...)`,
		"ExtendEvery everywhere": `e := redlock.ExtendEvery(time.Second)
		redlock.New(nodes, e)
		c.Acquire(ctx, []string{"a"}, time.Second, e)
		c.Do(ctx, []string{"a"}, time.Second, nil, e)
		l.Keep(ctx, e)
		l.Keep(ctx, []redlock.KeepOption{e}...)`,
		"a SharedOption value in both places": `var s redlock.SharedOption = redlock.WithRetry(redlock.DefaultRetry)
		redlock.New(nodes, s)
		c.Acquire(ctx, []string{"a"}, time.Second, s)`,
		"the deprecated AcquireOption": `var a redlock.AcquireOption = redlock.WithRecord("r", time.Second)
		c.Acquire(ctx, []string{"a"}, time.Second, a)`,
	}
	for name, body := range compiles {
		if errs := check(body); len(errs) > 0 {
			t.Errorf("%s: does not compile: %v", name, errs)
		}
	}
	rejected := []struct{ body, want string }{
		{`redlock.New(nodes, redlock.WithRecord("r", time.Second))`, "does not implement redlock.Option"},
		{`redlock.New(nodes, redlock.WithHighWater("m", 1, time.Second))`, "does not implement redlock.Option"},
		{`l.Keep(ctx, redlock.WithFencing(true))`, "does not implement redlock.KeepOption"},
		{`l.Keep(ctx, redlock.WithRecord("r", time.Second))`, "does not implement redlock.KeepOption"},
		{`l.Keep(ctx, redlock.WithKeyPrefix("p:"))`, "does not implement redlock.KeepOption"},
		{`c.Acquire(ctx, []string{"a"}, time.Second, redlock.WithKeyPrefix("p:"))`, "does not implement redlock.LockOption"},
		{`c.Do(ctx, []string{"a"}, time.Second, nil, redlock.WithRestartGating(time.Second))`, "does not implement redlock.LockOption"},
		{`var o redlock.LockOption = redlock.WithRetry(redlock.DefaultRetry)
		redlock.New(nodes, o)`, "does not implement redlock.Option"},
		{`var s redlock.SharedOption = redlock.WithRecord("r", time.Second)
		_ = s`, "does not implement redlock.SharedOption"},
		{`opts := []redlock.LockOption{redlock.ExtendEvery(time.Second)}
		l.Keep(ctx, opts...)`, "cannot use opts"},
	}
	for _, r := range rejected {
		errs := check(r.body)
		if len(errs) != 1 || !strings.Contains(errs[0], r.want) {
			t.Errorf("%s\ncompiles with errors %q, want one error containing %q", r.body, errs, r.want)
		}
	}
}

// snippetChecker returns a function that type-checks a function body
// (snippetPrelude) against the packages pkgs and their dependencies,
// compiled by `go list -export` (from the build cache when they are
// there; GOPROXY=off: no network), and returns its errors.
func snippetChecker(t *testing.T, pkgs ...string) func(body string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-f", "{{if .Export}}{{.ImportPath}} {{.Export}}{{end}}"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if path, file, ok := strings.Cut(sc.Text(), " "); ok {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})
	return func(body string) []string {
		f, err := parser.ParseFile(fset, "snippet.go", snippetPrelude+body+"\n}\n", 0)
		if err != nil {
			t.Fatalf("snippet does not parse: %v\n%s", err, body)
		}
		var errs []string
		conf := types.Config{Importer: imp, Error: func(err error) { errs = append(errs, err.Error()) }}
		_, _ = conf.Check("snippet", fset, []*ast.File{f}, nil)
		return errs
	}
}

// TestCallOnlyOptionsAreNotOptions: the options that do not compile at
// New are not Options at run time either (a type assertion cannot pass
// them to New), and only KeepOptions are: New and Keep need no run-time
// check of an option's kind.
func TestCallOnlyOptionsAreNotOptions(t *testing.T) {
	for name, o := range map[string]redlock.LockOption{
		"WithRecord":    redlock.WithRecord("r", time.Second),
		"WithHighWater": redlock.WithHighWater("m", 1, time.Second),
	} {
		if _, ok := o.(redlock.Option); ok {
			t.Errorf("%s is an Option", name)
		}
	}
	for name, o := range map[string]redlock.LockOption{
		"WithFencing":        redlock.WithFencing(true),
		"WithNodeTimeout":    redlock.WithNodeTimeout(time.Second),
		"WithReleaseNotices": redlock.WithReleaseNotices(false),
		"WithRecord":         redlock.WithRecord("r", time.Second),
	} {
		if _, ok := o.(redlock.KeepOption); ok {
			t.Errorf("%s is a KeepOption", name)
		}
	}
}
