// Package script assembles redlock's Lua scripts from a core template and
// the fragments of the layers a lock uses, and owns the layout of their
// KEYS, ARGV and replies: where each layer's keys, arguments and reply
// elements are. Both the client (package redlock) and the model
// (redlock/internal/model) read every offset from a Layout, and the
// scripts get them written in by Assemble, so that no offset is computed
// anywhere else.
//
// A template is a Lua script with hook lines, "--@ <hook>", where the
// fragments of that hook go, in the order of the layers, each in its own
// do ... end block (so a fragment's locals stay its own), and one line
// "--@ layout" where the conventions every script shares go:
//
//	local TOKEN = 32 -- the owner token: the first TOKEN bytes of a lock value
//
// Template and fragments name a layer's offsets as
//
//	K.<layer>  KEYS[K.<layer> + j]: the layer's j-th key, an expression of n
//	A.<layer>  ARGV[A.<layer> + j]: its (j+1)-th argument
//	R.<layer>  reply[R.<layer> + j]: its (j+1)-th reply element
//	I.<layer>  {0, value, PTTL, I.<layer>, ...}: refused by the layer's key
//
// and Assemble writes each one's value in its place, in parentheses
// ("KEYS[(2 * n + 1) + j]"), where n, the number of the lock's
// resources, is a local of the template: the script builds no table on
// the node to look them up (four tables cost a release call about 1 us
// of the node's CPU, a tenth of it). A part that is not in the script
// reads nil, as a missing table entry would, so that a fragment may ask
// whether another part is there ("if K.reentrant then", fencing.lua).
// Comments are left as written: a line's code ends at its first "--", so
// a fragment keeps "--" and references out of its string literals.
//
// A refusal by lock key i is {0, value, PTTL, i}, i >= 1; each part that
// refuses (Part.Refuses) gets its own index, 0, -1, ... in the order of
// the parts in the script. A fragment file holds sections, each
// introduced by a line "--@ <hook> [<hook>...]" (one section may serve
// several hooks); the text before the first section is its header
// comment.
package script

import (
	"fmt"
	"regexp"
	"strings"
)

// TokenLen is the length of the owner token, the first bytes of every
// lock value: the scripts (TOKEN) and the client compare owners by it.
const TokenLen = 32

// Part is one layer's share of a script: its name (its offsets are
// K.<name>, A.<name>, R.<name> and I.<name>), its keys (PerKey per
// resource, then Fixed more), how many arguments it passes, how many
// reply elements it sets, and its Lua, by hook.
type Part struct {
	Name   string
	PerKey int // keys per resource (Layout.Key)
	Fixed  int // keys after the per-resource ones
	Args   int // arguments; -1: all the remaining ones (the last part only)
	Reply  int // reply elements
	// Refuses says that its sections may refuse an acquisition with
	// {0, value, PTTL, I.<name>, ...} (Layout.Refusal).
	Refuses bool
	Hooks   map[string]string
}

// Parse splits a fragment file into its sections by hook.
func Parse(src string) map[string]string {
	hooks := map[string]string{}
	var names []string
	var body strings.Builder
	flush := func() {
		for _, h := range names {
			hooks[h] = strings.TrimRight(body.String(), "\n")
		}
		body.Reset()
	}
	for line := range strings.Lines(src) {
		if rest, ok := strings.CutPrefix(line, "--@ "); ok {
			flush()
			names = strings.Fields(rest)
			continue
		}
		if names != nil {
			body.WriteString(line)
		}
	}
	flush()
	return hooks
}

// Layout places the parts of one script after the core's keys (n lock
// keys) and arguments (coreArgs). Parts that have no section for any of
// the script's hooks are not in the script: they have no keys, no
// arguments and no reply elements there.
type Layout struct {
	parts    []Part
	coreArgs int
	coreRepl int
	key      map[string][2]int // name -> offset a*n + b (a per-resource multiplier)
	arg      map[string]int    // name -> ARGV offset (A.name + 1 is its first)
	reply    map[string]int    // name -> reply offset (R.name + 1 is its first)
	refusal  map[string]int    // name -> refusal index (I.name), for the parts that refuse
}

// New lays out parts for a script of hooks, after coreArgs arguments and
// coreReply reply elements of the core.
func New(hooks []string, coreArgs, coreReply int, parts ...Part) *Layout {
	l := &Layout{coreArgs: coreArgs, coreRepl: coreReply, key: map[string][2]int{}, arg: map[string]int{}, reply: map[string]int{},
		refusal: map[string]int{}}
	perKey, fixed, args, reply, refusal := 1, 0, coreArgs, coreReply, 0
	for _, p := range parts {
		if !p.In(hooks) {
			continue
		}
		if _, dup := l.key[p.Name]; dup {
			panic("script: two parts named " + p.Name)
		}
		l.parts = append(l.parts, p)
		l.key[p.Name] = [2]int{perKey, fixed}
		perKey, fixed = perKey+p.PerKey, fixed+p.Fixed
		l.arg[p.Name], l.reply[p.Name] = args, reply
		args, reply = args+max(p.Args, 0), reply+p.Reply
		if p.Refuses {
			l.refusal[p.Name] = refusal
			refusal--
		}
	}
	return l
}

// In reports whether p takes part in a script of hooks: it has a
// section for one of them.
func (p Part) In(hooks []string) bool {
	for _, h := range hooks {
		if _, ok := p.Hooks[h]; ok {
			return true
		}
	}
	return false
}

// Replies returns the number of reply elements: the core's and every
// part's.
func (l *Layout) Replies() int {
	n := l.coreRepl
	for _, p := range l.parts {
		n += p.Reply
	}
	return n
}

// Parts returns the names of the parts in the script, in order.
func (l *Layout) Parts() []string {
	names := make([]string, len(l.parts))
	for i, p := range l.parts {
		names[i] = p.Name
	}
	return names
}

// Has reports whether part name is in the script.
func (l *Layout) Has(name string) bool {
	_, ok := l.key[name]
	return ok
}

// Key returns the 0-based index in KEYS of the j-th (0-based) key of part
// name for a lock of n resources: its per-resource keys first (resource
// i's is j = i), then its fixed keys (j = PerKey*n + k). -1 when the part
// is not in the script.
func (l *Layout) Key(name string, n, j int) int {
	o, ok := l.key[name]
	if !ok {
		return -1
	}
	return o[0]*n + o[1] + j
}

// Arg returns the 0-based index in ARGV of part name's first argument,
// or -1 when the part is not in the script.
func (l *Layout) Arg(name string) int {
	a, ok := l.arg[name]
	if !ok {
		return -1
	}
	return a
}

// Reply returns the 0-based index in the reply of part name's first
// element, or -1 when the part is not in the script.
func (l *Layout) Reply(name string) int {
	r, ok := l.reply[name]
	if !ok {
		return -1
	}
	return r
}

// Refusal returns the index (I.<name>, at most 0) with which part name
// refuses an acquisition, {0, value, PTTL, index, ...}; false when the
// part is not in the script or does not refuse. A lock key's refusal has
// its key's 1-based index instead.
func (l *Layout) Refusal(name string) (int, bool) {
	i, ok := l.refusal[name]
	return i, ok
}

// Assemble returns template with the shared conventions (TOKEN) at
// "--@ layout", the parts' sections at each hook, and every K, A, R and I
// reference in the code (not the comments) replaced by its value: nil
// for a part that is not in the script (and I for one that does not
// refuse).
func (l *Layout) Assemble(template string) string {
	var out strings.Builder
	for line := range strings.Lines(template) {
		hook, ok := strings.CutPrefix(strings.TrimSpace(line), "--@ ")
		if !ok {
			out.WriteString(l.resolve(line))
			continue
		}
		indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
		if hook == "layout" {
			fmt.Fprintf(&out, "local TOKEN = %d\n", TokenLen)
			continue
		}
		for _, p := range l.parts {
			if src, ok := p.Hooks[hook]; ok {
				fmt.Fprintf(&out, "%sdo -- %s\n", indent, p.Name)
				for s := range strings.Lines(src + "\n") {
					if strings.TrimSpace(s) == "" {
						out.WriteString("\n")
					} else {
						out.WriteString(indent + "  " + l.resolve(s))
					}
				}
				fmt.Fprintf(&out, "%send\n", indent)
			}
		}
	}
	return out.String()
}

// reference matches K.<name>, A.<name>, R.<name> and I.<name> that are
// not part of a longer name (a field, x.K.name), also after Lua's
// concatenation operator ('k'..K.name).
var reference = regexp.MustCompile(`(^|[^A-Za-z0-9_.]|\.\.)([KARI])\.([A-Za-z_][A-Za-z0-9_]*)`)

// resolve returns line with the references in its code (before a "--"
// comment) replaced by their values.
func (l *Layout) resolve(line string) string {
	code, comment := line, ""
	if i := strings.Index(line, "--"); i >= 0 {
		code, comment = line[:i], line[i:]
	}
	code = reference.ReplaceAllStringFunc(code, func(m string) string {
		sub := reference.FindStringSubmatch(m)
		return sub[1] + l.value(sub[2], sub[3])
	})
	return code + comment
}

// value returns the Lua expression of table's entry for part name, or
// nil.
func (l *Layout) value(table, name string) string {
	var v string
	ok := false
	switch table {
	case "K":
		var o [2]int
		if o, ok = l.key[name]; ok {
			v = offset(o[0], o[1])
		}
	case "A":
		var a int
		a, ok = l.arg[name]
		v = fmt.Sprint(a)
	case "R":
		var r int
		r, ok = l.reply[name]
		v = fmt.Sprint(r)
	case "I":
		var i int
		i, ok = l.refusal[name]
		v = fmt.Sprint(i)
	}
	if !ok {
		return "nil"
	}
	return "(" + v + ")"
}

// offset renders a*n + b in Lua.
func offset(a, b int) string {
	var s string
	switch a {
	case 0:
		return fmt.Sprint(b)
	case 1:
		s = "n"
	default:
		s = fmt.Sprintf("%d * n", a)
	}
	if b > 0 {
		s += fmt.Sprintf(" + %d", b)
	}
	return s
}
