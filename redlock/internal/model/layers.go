package model

import (
	"slices"
	"strings"
	"sync"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The layers of redlock's scripts (redlock/layer.go): the core templates
// acquire.lua, extend.lua and release.lua (for a release and an undo)
// with the fragments of the layers a lock uses, laid out by
// internal/script. kinds and shapes mirror redlock's templates and each
// layer's script.Part; TestModelBuildsTheClientsCalls (package redlock)
// compares the calls built from them with the client's.

// kind is one of redlock's templates with its hooks and the core's
// argument and reply counts.
type kind struct {
	template      string
	hooks         []string
	args, replies int
}

var kinds = map[string]kind{
	"acquire": {"acquire", []string{"check", "refused", "granted"}, 3, 1},
	"extend":  {"extend", []string{"regain", "extended"}, 3, 0},
	"release": {"release", []string{"hold", "deleted", "released"}, 2, 0},
	"undo":    {"release", []string{"undo", "hold"}, 2, 0},
}

// shape is a layer's script.Part without its Lua: file is its fragment
// (redlock/scripts/<file>.lua).
type shape struct {
	file                      string
	perKey, fixed, args, repl int
	hooks                     []string
}

var shapes = map[string]shape{
	"reentrant": {"reentrant", 1, 0, 1, 0, []string{"granted", "extended", "hold"}},
	"fencing":   {"fencing", 1, 0, 0, 3, []string{"granted"}},
	"gate":      {"gate", 0, 2, 1, 0, []string{"check", "regain"}},
	"record":    {"record", 0, 1, 1, 0, []string{"check", "granted", "undo"}},
	"mark":      {"highwater", 0, 1, 2, 1, []string{"check", "granted", "undo"}},
	// wake is two layers of one fragment: an Acquire's marks a refusing
	// key (no argument), a Release's publishes its notice ID.
	"wake":   {"wake", 0, 0, 0, 0, []string{"refused"}},
	"notice": {"wake", 0, 0, 1, 0, []string{"deleted"}},
	"log":    {"releaselog", 0, 1, -1, 0, []string{"released"}},
}

// refusing are the layers that refuse with an index of their own
// (script.Part.Refuses).
var refusing = map[string]bool{"record": true, "mark": true}

// Parts returns the parts of layers (names of shapes, in order) with the
// Lua of each hook from src (fragment sources by file name; nil: empty
// sections, enough for the layout).
func Parts(layers []string, src map[string]string) []script.Part {
	parts := make([]script.Part, len(layers))
	for i, name := range layers {
		sh := shapes[name]
		lua := script.Parse(src[sh.file])
		hooks := map[string]string{}
		for _, h := range sh.hooks {
			hooks[h] = lua[h]
		}
		pname := name
		if name == "notice" {
			pname = "wake" // the same name in Lua: never in one script with wake
		}
		parts[i] = script.Part{Name: pname, PerKey: sh.perKey, Fixed: sh.fixed, Args: sh.args, Reply: sh.repl,
			Refuses: refusing[name], Hooks: hooks}
	}
	return parts
}

// Layout returns the layout of script kind (a key of kinds) for layers.
func Layout(kindName string, layers []string, src map[string]string) *script.Layout {
	k := kinds[kindName]
	return script.New(k.hooks, k.args, k.replies, Parts(layers, src)...)
}

// run is one call of an assembled script on a store: what its
// fragments read.
type run struct {
	st    *Store
	lay   *script.Layout
	keys  []string
	argv  []string
	n     int
	value string
	tok   string
	ttl   int64
}

// key is KEYS[K.name + j] (j 1-based, as in Lua).
func (x *run) key(name string, j int) string { return x.keys[x.lay.Key(name, x.n, j-1)] }

// arg is ARGV[A.name + j] (j 1-based).
func (x *run) arg(name string, j int) string { return x.argv[x.lay.Arg(name)+j-1] }

// refusal is I.name: the index with which layer name refuses.
func (x *run) refusal(name string) int64 {
	i, _ := x.lay.Refusal(name)
	return int64(i)
}

// has reports whether layer name is in the script.
func (x *run) has(name string) bool { return x.lay.Has(name) }

// inScript reports whether layer name takes part in script kind: it has
// a section for one of the kind's hooks.
func inScript(kindName, name string) bool {
	return slices.ContainsFunc(shapes[name].hooks, func(h string) bool { return slices.Contains(kinds[kindName].hooks, h) })
}

var layouts sync.Map

// cachedLayout is Layout without Lua, once per combination.
func cachedLayout(kindName string, layers []string) *script.Layout {
	id := kindName + " " + strings.Join(layers, " ")
	if v, ok := layouts.Load(id); ok {
		return v.(*script.Layout)
	}
	v, _ := layouts.LoadOrStore(id, Layout(kindName, layers, nil))
	return v.(*script.Layout)
}
