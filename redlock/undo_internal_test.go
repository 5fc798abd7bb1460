package redlock

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// TestSecondUndoNeverLowersTheMark: on one node the mark is 9 (a run of
// C), A raised it to 10, B to 11, and both failed. B's undo puts 10 back;
// A's undo then found no mark before its own (B's undo had cleared it) and
// deleted the mark, below the 9 that ran. It now leaves the mark at 10: a
// scheduled time lost rather than one run twice.
func TestSecondUndoNeverLowersTheMark(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	value := func(owner string) string { return ownerToken(owner) + "-" + owner }
	a, b := value("a"), value("b")
	rdb.HSet(ctx, "mark", "m", "11", "v", b, "pm", "10", "pv", a)
	// The undo of a lock of one resource "run" with the mark "mark".
	lay := script.New(templates[kindUndo].hooks, templates[kindUndo].args, 0, highWaterPart)
	undoSrc := lay.Assemble(releaseSrc)
	undo := func(v string) {
		t.Helper()
		if err := rdb.Eval(ctx, undoSrc, []string{"run", "mark"}, v, 1, "10", 1000).Err(); err != nil {
			t.Fatal(err)
		}
	}
	undo(b)
	if got := rdb.HGet(ctx, "mark", "m").Val(); got != "10" {
		t.Fatalf("mark after B's undo = %q, want 10", got)
	}
	undo(a)
	if got := rdb.HGet(ctx, "mark", "m").Val(); got != "10" {
		t.Errorf("mark after A's undo = %q, want 10 (left as it is, never below C's 9)", got)
	}
}

// TestHolderUnknown: a round that no holder won on a quorum leaves the
// holder unknown when its failed nodes, counted as the most-named
// holder's, would complete a quorum.
func TestHolderUnknown(t *testing.T) {
	held := func(v string) NodeResult { return NodeResult{Outcome: OutcomeHeld, Holder: "h", value: v} }
	for _, tc := range []struct {
		name  string
		nodes []NodeResult
		want  bool
	}{
		{"one holder, one failed", []NodeResult{held("x"), {Outcome: OutcomeTimeout}, {Outcome: OutcomeOK}}, true},
		{"one holder, one gated", []NodeResult{held("x"), {Outcome: OutcomeGated}, {Outcome: OutcomeOK}}, true},
		{"split, nothing failed", []NodeResult{held("x"), held("y"), {Outcome: OutcomeOK}}, false},
		{"two holders with one metadata, one failed of five", []NodeResult{held("x"), held("y"), {Outcome: OutcomeError},
			{Outcome: OutcomeOK}, {Outcome: OutcomeOK}}, false},
		{"nobody held", []NodeResult{{Outcome: OutcomeTimeout}, {Outcome: OutcomeTimeout}, {Outcome: OutcomeOK}}, false},
	} {
		q := &QuorumError{Op: "acquire", Quorum: len(tc.nodes)/2 + 1, Nodes: tc.nodes}
		if got := q.HolderUnknown(); got != tc.want {
			t.Errorf("%s: HolderUnknown = %v, want %v", tc.name, got, tc.want)
		}
	}
}
