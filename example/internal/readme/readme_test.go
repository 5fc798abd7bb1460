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

// snippet is one ```go block of README.md.
type snippet struct {
	line int // of its opening fence, 1-based
	code string
}

// readmeSnippets returns the Go blocks of the README at path, in order.
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
	{"errors", "errors.Is"},
	{"fmt", "fmt.Sprint"},
	{"log", "log.Print"},
	{"log/slog", "slog.Info"},
	{"time", "time.Second"},
	{"github.com/google/uuid", "uuid.New"},
	{"github.com/go-co-op/gocron/v2", "gocron.NewScheduler"},
	{"github.com/redis/go-redis/v9", "redis.NewClient"},
	{"github.com/schedlock/schedlock/elector", "elector.New"},
	{"github.com/schedlock/schedlock/redlock", "redlock.New"},
	{"github.com/schedlock/schedlock/scheduler", "scheduler.New"},
	{"github.com/schedlock/schedlock/tracing/otlp", "otlp.Setup"},
}

// fragmentPrelude declares what the README's fragments take as given: a
// ctx, the redlock Client of the quick start (locks), its Scheduler (s), an
// err to assign to, and the user's own functions.
const fragmentPrelude = `
var (
	ctx   = context.Background()
	locks *redlock.Client
	s     *scheduler.Scheduler
	err   error
)

func buildReport(context.Context) error { return nil }

func cleanup(context.Context) error { return nil }

func consume(context.Context, uint64) {}
`

// TestREADMESnippetsCompile builds every Go snippet of README.md: a snippet
// that starts with "package" as a program of its own, any other as the body
// of a function returning error, with fragmentImports and fragmentPrelude in
// scope. The files are given to go build as an overlay, so nothing is
// written to the module.
func TestREADMESnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	snippets := readmeSnippets(t, filepath.Join(root, "README.md"))
	if len(snippets) < 5 {
		t.Fatalf("found %d Go snippets in README.md, want the quick start and the API tour (at least 5)", len(snippets))
	}

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

	programs := 0
	for _, sn := range snippets {
		if strings.HasPrefix(strings.TrimSpace(sn.code), "package ") {
			programs++
			add(filepath.Join(fmt.Sprintf("program%d", sn.line), "main.go"), fmt.Sprintf("//line README.md:%d\n%s", sn.line+1, sn.code))
			continue
		}
		src := fmt.Sprintf("%s\nfunc readmeLine%d() error {\n//line README.md:%d\n%s\treturn nil\n}\n", header, sn.line, sn.line+1, sn.code)
		add(filepath.Join("fragments", fmt.Sprintf("line%d.go", sn.line)), src)
	}
	if programs == 0 {
		t.Fatal("README.md has no complete program (a snippet starting with package): the quick start is missing")
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
		t.Fatalf("README.md snippets do not compile (%v):\n%s", err, out)
	}
}
