package readme

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// snippet is one ```go block of a Markdown file.
type snippet struct {
	line int // of its opening fence, 1-based
	code string
}

// readmeSnippets returns the Go blocks (fenced exactly ```go) of the
// Markdown file at path, in order.
func readmeSnippets(t *testing.T, path string) []snippet {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out  []snippet
		cur  *snippet
		body strings.Builder
		n    int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &snippet{line: n}
			body.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.code = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README.md:%d: a ```go block is not closed", cur.line)
	}
	return out
}

// fragmentImports are the packages a README fragment may use without
// importing them; each gets a blank use so that a fragment need not use all.
var fragmentImports = []struct{ path, use string }{
	{"context", "context.Background"},
	{"crypto/tls", "tls.VersionTLS12"},
	{"crypto/x509", "x509.NewCertPool"},
	{"errors", "errors.Is"},
	{"fmt", "fmt.Sprint"},
	{"log", "log.Print"},
	{"log/slog", "slog.Info"},
	{"net/http", "http.NewServeMux"},
	{"os", "os.ReadFile"},
	{"time", "time.Second"},
	{"github.com/google/uuid", "uuid.New"},
	{"github.com/go-co-op/gocron/v2", "gocron.NewScheduler"},
	{"github.com/redis/go-redis/v9", "redis.NewClient"},
	{"github.com/redis/go-redis/v9/logging", "logging.Disable"},
	{"github.com/schedlock/schedlock/elector", "elector.New"},
	{"github.com/schedlock/schedlock/redlock", "redlock.New"},
	{"github.com/schedlock/schedlock/scheduler", "scheduler.New"},
	{"github.com/schedlock/schedlock/tracing/otlp", "otlp.Setup"},
}

// fragmentPrelude declares what the docs' fragments take as given: a ctx,
// the redlock Client of the quick start (locks), its Scheduler (s), the
// go-redis clients of the nodes (nodes), an err to assign to, the
// application's HTTP mux and authentication middleware, and the user's own
// functions.
const fragmentPrelude = `
var (
	ctx   = context.Background()
	locks *redlock.Client
	s     *scheduler.Scheduler
	nodes []redis.UniversalClient
	err   error
	mux   = http.NewServeMux()
)

func requireAdmin(h http.Handler) http.Handler { return h }

func buildReport(context.Context) error { return nil }

func cleanup(context.Context) error { return nil }

func consume(context.Context, uint64) {}
`

// TestREADMESnippetsCompile builds every Go snippet of README.md (see
// compileSnippets), which must have the quick start: a complete program.
func TestREADMESnippetsCompile(t *testing.T) {
	programs := 0
	for _, sn := range compileSnippets(t, "README.md") {
		if strings.HasPrefix(firstCodeLine(sn.code), "package ") {
			programs++
		}
	}
	if programs == 0 {
		t.Fatal("README.md has no complete program (a snippet starting with package): the quick start is missing")
	}
}

// TestGuideSnippetsCompile builds every Go snippet of docs/guide.md, the
// API tour that starts from the README's quick start.
func TestGuideSnippetsCompile(t *testing.T) {
	if n := len(compileSnippets(t, filepath.Join("docs", "guide.md"))); n < 5 {
		t.Fatalf("found %d Go snippets in docs/guide.md, want the API tour (at least 5)", n)
	}
}

// TestIntegrationsSnippetsCompile builds every Go snippet of
// docs/integrations.md but the Prometheus one, which needs a module this
// one does not require (its fence is "```go prometheus", and it was checked
// by hand, as the page says).
func TestIntegrationsSnippetsCompile(t *testing.T) {
	if n := len(compileSnippets(t, filepath.Join("docs", "integrations.md"))); n < 4 {
		t.Fatalf("found %d Go snippets in docs/integrations.md, want at least 4 (cluster prefix, TLS, go-redis's logger)", n)
	}
}

// compileSnippets builds every Go snippet of the Markdown file at rel
// (from the repository's root) and returns them: a snippet that starts with
// "package" as a program of its own; one that starts with a declaration
// ("type", "func", "var" or "const", after its comments) as a file of the
// package of fragments; any other as the body of a function returning
// error in that package. The package has fragmentImports and
// fragmentPrelude in scope. The files are given to go build as an overlay,
// so nothing is written to the module.
func compileSnippets(t *testing.T, rel string) []snippet {
	t.Helper()
	if testing.Short() {
		t.Skip("runs go build")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	snippets := readmeSnippets(t, filepath.Join(root, rel))
	name := filepath.ToSlash(rel)

	tmp := t.TempDir()
	genDir := filepath.Join(root, "example", "internal", "readme", "generated")
	replace := map[string]string{}
	add := func(rel, src string) {
		file := filepath.Join(tmp, strings.ReplaceAll(rel, string(filepath.Separator), "_"))
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(genDir, rel)] = file
	}

	var imports, uses strings.Builder
	for _, im := range fragmentImports {
		fmt.Fprintf(&imports, "\t%q\n", im.path)
		fmt.Fprintf(&uses, "var _ = %s\n", im.use)
	}
	header := "package fragments\n\nimport (\n" + imports.String() + ")\n\n" + uses.String()
	add(filepath.Join("fragments", "prelude.go"), header+fragmentPrelude)

	for _, sn := range snippets {
		switch first := firstCodeLine(sn.code); {
		case strings.HasPrefix(first, "package "):
			add(filepath.Join(fmt.Sprintf("program%d", sn.line), "main.go"), fmt.Sprintf("//line %s:%d\n%s", name, sn.line+1, sn.code))
		case isDecl(first):
			add(filepath.Join("fragments", fmt.Sprintf("decl%d.go", sn.line)), fmt.Sprintf("%s//line %s:%d\n%s", header, name, sn.line+1, sn.code))
		default:
			src := fmt.Sprintf("%s\nfunc snippetLine%d() error {\n//line %s:%d\n%s\treturn nil\n}\n", header, sn.line, name, sn.line+1, sn.code)
			add(filepath.Join("fragments", fmt.Sprintf("line%d.go", sn.line)), src)
		}
	}

	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-overlay", overlayFile, "-o", os.DevNull, "./example/internal/readme/generated/...")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s snippets do not compile (%v):\n%s", name, err, out)
	}
	return snippets
}

// firstCodeLine returns the first line of code that is not blank or a
// comment.
func firstCodeLine(code string) string {
	for line := range strings.Lines(code) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "//") {
			return l
		}
	}
	return ""
}

// isDecl reports whether a snippet's first line of code starts a
// package-level declaration.
func isDecl(line string) bool {
	for _, kw := range []string{"type ", "func ", "var ", "const "} {
		if strings.HasPrefix(line, kw) {
			return true
		}
	}
	return false
}
