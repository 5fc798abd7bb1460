package redlock

import "testing"

// TestDecide: a round's outcome is known exactly when its rule says so,
// from the tally alone (3 nodes, quorum 2; 5 nodes, quorum 3).
func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		t    tally
		w    waitRule
		want bool
	}{
		{"nothing heard", tally{nodes: 3, quorum: 2}, untilKnown, false},
		{"one grant", tally{nodes: 3, quorum: 2, ok: 1}, untilKnown, false},
		{"quorum of grants", tally{nodes: 3, quorum: 2, ok: 2}, untilKnown, true},
		{"one refusal", tally{nodes: 3, quorum: 2, bad: 1}, untilKnown, false},
		{"quorum impossible", tally{nodes: 3, quorum: 2, bad: 2}, untilKnown, true},
		{"split, one due", tally{nodes: 3, quorum: 2, ok: 1, bad: 1}, untilKnown, false},
		{"down node counts as failed", tally{nodes: 3, quorum: 2, bad: 1, down: 1}, untilKnown, true},
		{"down node alone", tally{nodes: 3, quorum: 2, down: 1}, untilKnown, false},
		{"every answer", tally{nodes: 3, quorum: 2, ok: 1, bad: 2}, untilKnown, true},
		{"5 nodes, 2 refusals", tally{nodes: 5, quorum: 3, bad: 2}, untilKnown, false},
		{"5 nodes, 3 refusals", tally{nodes: 5, quorum: 3, bad: 3}, untilKnown, true},
		{"settle: quorum impossible, one due", tally{nodes: 3, quorum: 2, bad: 2}, untilSettled, false},
		{"settle: down nodes ignored", tally{nodes: 3, quorum: 2, bad: 1, down: 2}, untilSettled, false},
		{"settle: every answer", tally{nodes: 3, quorum: 2, ok: 1, bad: 2}, untilSettled, true},
		{"settle: quorum of grants", tally{nodes: 3, quorum: 2, ok: 2}, untilSettled, true},
		{"all: quorum of grants, one due", tally{nodes: 3, quorum: 2, ok: 2}, untilAll, false},
		{"all: quorum impossible, one due", tally{nodes: 3, quorum: 2, bad: 2}, untilAll, false},
		{"all: every answer", tally{nodes: 3, quorum: 2, ok: 2, bad: 1}, untilAll, true},
		{"skipped nodes count as grants", tally{nodes: 1, quorum: 1, ok: 1}, untilAll, true},
		{"settle: refused by the quorum asked first", tally{nodes: 3, quorum: 2, bad: 2, unsent: 1}, untilSettled, true},
		{"settle: split by the quorum asked first", tally{nodes: 3, quorum: 2, ok: 1, bad: 1}, untilSettled, false},
		{"5 nodes: refused by the quorum asked first", tally{nodes: 5, quorum: 3, bad: 3, unsent: 2}, untilSettled, true},
	}
	for _, tt := range tests {
		if got := decide(tt.t, tt.w); got != tt.want {
			t.Errorf("%s: decide(%+v, %d) = %v, want %v", tt.name, tt.t, tt.w, got, tt.want)
		}
	}
}
