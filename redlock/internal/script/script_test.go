package script

import (
	"strings"
	"testing"
)

// TestLayout: parts take the keys, arguments and reply elements after
// the core's, in order; a part without a section for the script's hooks
// is not in it.
func TestLayout(t *testing.T) {
	holds := Part{Name: "holds", PerKey: 1, Args: 1, Hooks: map[string]string{"granted": "x"}}
	gate := Part{Name: "gate", Fixed: 2, Args: 1, Hooks: map[string]string{"check": "y"}}
	mark := Part{Name: "mark", Fixed: 1, Args: 2, Reply: 1, Hooks: map[string]string{"granted": "z"}}
	other := Part{Name: "other", Fixed: 5, Args: 5, Reply: 5, Hooks: map[string]string{"released": "w"}}
	l := New([]string{"check", "granted"}, 3, 1, holds, other, gate, mark)
	const n = 2 // resources: lock keys 0 and 1
	for _, tc := range []struct {
		what      string
		got, want int
	}{
		{"holds of resource 0", l.Key("holds", n, 0), 2},
		{"holds of resource 1", l.Key("holds", n, 1), 3},
		{"gate's first key", l.Key("gate", n, 0), 4},
		{"gate's second key", l.Key("gate", n, 1), 5},
		{"mark's key", l.Key("mark", n, 0), 6},
		{"other's key (not in the script)", l.Key("other", n, 0), -1},
		{"holds' argument", l.Arg("holds"), 3},
		{"gate's argument", l.Arg("gate"), 4},
		{"mark's arguments", l.Arg("mark"), 5},
		{"mark's reply", l.Reply("mark"), 1},
		{"reply length", l.Replies(), 2},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.what, tc.got, tc.want)
		}
	}
	if got, want := strings.Join(l.Parts(), " "), "holds gate mark"; got != want {
		t.Errorf("parts %q, want %q", got, want)
	}
}

// TestRefusal: the parts that refuse get the indexes 0, -1, ... in the
// order of the parts in the script (a lock key's is its index, >= 1);
// the others, and those not in the script, none.
func TestRefusal(t *testing.T) {
	record := Part{Name: "record", Fixed: 1, Refuses: true, Hooks: map[string]string{"check": "x"}}
	gate := Part{Name: "gate", Fixed: 2, Hooks: map[string]string{"check": "y"}}
	mark := Part{Name: "mark", Fixed: 1, Refuses: true, Hooks: map[string]string{"check": "z"}}
	other := Part{Name: "other", Refuses: true, Hooks: map[string]string{"released": "w"}}
	for _, tc := range []struct {
		what  string
		parts []Part
		name  string
		want  int
		ok    bool
	}{
		{"record, first", []Part{other, record, gate, mark}, "record", 0, true},
		{"mark, after the record", []Part{other, record, gate, mark}, "mark", -1, true},
		{"mark alone", []Part{gate, mark}, "mark", 0, true},
		{"a part that does not refuse", []Part{record, gate, mark}, "gate", 0, false},
		{"a part not in the script", []Part{other, record}, "other", 0, false},
	} {
		got, ok := New([]string{"check", "granted"}, 3, 1, tc.parts...).Refusal(tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: Refusal = %d, %v; want %d, %v", tc.what, got, ok, tc.want, tc.ok)
		}
	}
}

// TestAssemble: the shared conventions go at the layout line, each
// part's sections at their hooks in order, each in its own block (a
// section may serve several hooks), and every K, A, R and I reference in
// code, in template and fragments alike, becomes its value in
// parentheses; comments and longer names keep theirs.
func TestAssemble(t *testing.T) {
	frag := Parse("-- header\n--@ check granted\nlocal a = KEYS[K.p + 1] -- K.p\n")
	if frag["check"] != "local a = KEYS[K.p + 1] -- K.p" || frag["granted"] != frag["check"] {
		t.Fatalf("Parse = %q", frag)
	}
	l := New([]string{"check", "granted"}, 3, 1,
		Part{Name: "p", PerKey: 1, Args: 1, Reply: 1, Hooks: frag},
		Part{Name: "q", Fixed: 1, Refuses: true, Hooks: map[string]string{"granted": "f(K.q, A.q, R.q, I.q, x.K.q, KK.q, 'k'..K.q)"}})
	got := l.Assemble("local n = 2\n--@ layout\n--@ check\nif ARGV[A.p + 1] then\n  --@ granted\nend\n")
	want := "local n = 2\n" +
		"local TOKEN = 32\n" +
		"do -- p\n  local a = KEYS[(n) + 1] -- K.p\nend\n" +
		"if ARGV[(3) + 1] then\n  do -- p\n    local a = KEYS[(n) + 1] -- K.p\n  end\n" +
		"  do -- q\n    f((2 * n), (4), (2), (0), x.K.q, KK.q, 'k'..(2 * n))\n  end\nend\n"
	if got != want {
		t.Errorf("Assemble:\n%s\nwant:\n%s", got, want)
	}
}

// TestAssembleAbsentPart: a part that is not in the script reads nil,
// as a missing table entry did, so that a fragment may test for it;
// so does the refusal index of a part that does not refuse.
func TestAssembleAbsentPart(t *testing.T) {
	l := New([]string{"check"}, 1, 0,
		Part{Name: "p", Args: 1, Hooks: map[string]string{"check": "x"}},
		Part{Name: "gone", Args: 1, Hooks: map[string]string{"released": "y"}})
	got := l.Assemble("if A.gone or K.nope or I.p then f(A.p) end\n")
	if want := "if nil or nil or nil then f((1)) end\n"; got != want {
		t.Errorf("Assemble = %q, want %q", got, want)
	}
}
