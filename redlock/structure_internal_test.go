package redlock

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// vocabulary is what every file of the package may use (docs/design.md,
// "Structure"): the errors and results, the key namespace, the options
// and the Client and Lock types.
var vocabulary = []string{"errors.go", "keys.go", "options.go", "client.go", "lock.go"}

// TestTheFileTableIsTrue: every package-level name a file of the package
// takes from another file is in a file that docs/design.md's table lets
// it use (its third column, or the vocabulary), and every file the table
// lists there is used. A new use is either a mistake (use the seam) or a
// line in that table.
func TestTheFileTableIsTrue(t *testing.T) {
	allowed, uses := designTable(t), fileUses(t)
	for file, used := range uses {
		may, ok := allowed[file]
		if !ok {
			t.Errorf("%s is not in docs/design.md's table (\"Structure\")", file)
			continue
		}
		for other, names := range used {
			if !slices.Contains(may, other) && !slices.Contains(vocabulary, other) {
				t.Errorf("%s uses %s (%s), which docs/design.md's table does not list for it: use the seam, or add it there",
					file, other, strings.Join(names, ", "))
			}
		}
	}
	for file, may := range allowed {
		for _, other := range may {
			if _, ok := uses[file][other]; !ok && !slices.Contains(vocabulary, other) {
				t.Errorf("docs/design.md's table lists %s as used by %s, which does not use it", other, file)
			}
		}
	}
}

// designTable returns, for each .go file named in the first column of
// docs/design.md's file table, the .go files named in its third.
func designTable(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	goFile := regexp.MustCompile("`([a-z_]+\\.go)`")
	table := map[string][]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		cols := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| `") || len(cols) != 3 {
			continue
		}
		var uses []string
		for _, m := range goFile.FindAllStringSubmatch(cols[2], -1) {
			uses = append(uses, m[1])
		}
		for _, m := range goFile.FindAllStringSubmatch(cols[0], -1) {
			table[m[1]] = uses
		}
	}
	if len(table) < 20 {
		t.Fatalf("docs/design.md's file table has %d files; the test reads it wrong", len(table))
	}
	return table
}

// fileUses type-checks the package's non-test files and returns, for each
// file, the other files whose package-level names (functions, types,
// variables, constants, methods and fields) it uses, with those names.
// Imports are stubbed: only the package's own names are resolved.
func fileUses(t *testing.T) map[string]map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: stubImporter{importer.Default()}, Error: func(error) {}}
	pkg, _ := conf.Check("github.com/schedlock/schedlock/redlock", fset, files, info)
	uses := map[string]map[string][]string{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		if v, ok := obj.(*types.Var); ok && !v.IsField() && v.Parent() != pkg.Scope() {
			continue // a local variable
		}
		if _, ok := obj.(*types.Var); !ok && obj.Parent() != nil && obj.Parent() != pkg.Scope() {
			continue // a local type or constant
		}
		from, to := filepath.Base(fset.Position(id.Pos()).Filename), filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		if uses[from] == nil {
			uses[from] = map[string][]string{}
		}
		if !slices.Contains(uses[from][to], obj.Name()) {
			uses[from][to] = append(uses[from][to], obj.Name())
			sort.Strings(uses[from][to])
		}
	}
	return uses
}

// stubImporter gives the standard library's packages from export data
// where it can, and an empty package for any other import: the check
// then resolves the package's own names, which is all fileUses needs.
type stubImporter struct{ std types.Importer }

func (s stubImporter) Import(path string) (*types.Package, error) {
	if !strings.Contains(strings.Split(path, "/")[0], ".") {
		if p, err := s.std.Import(path); err == nil {
			return p, nil
		}
	}
	name := path[strings.LastIndex(path, "/")+1:]
	if strings.HasPrefix(name, "v") && len(name) <= 3 { // github.com/redis/go-redis/v9
		name = "redis"
	}
	p := types.NewPackage(path, name)
	p.MarkComplete()
	return p, nil
}
