package model

import (
	"fmt"
	"testing"
)

// The historical two-holder bugs, each put back into the model as the
// code was before its fix (Bugs), and each found by the checker. The
// long run also explores each configuration without the bug (and the
// first one with each half of it) to completion: today's code passes.

// withoutIt explores cfg with each of bugs instead of cfg.Bugs, in the
// long run, and fails on a violation.
func withoutIt(t *testing.T, cfg Config, bugs ...Bugs) {
	t.Helper()
	if !long() {
		return
	}
	name := cfg.Name
	for _, b := range bugs {
		cfg.Bugs, cfg.Name = b, fmt.Sprintf("%s, bugs %+v", name, b)
		holds(t, cfg)
	}
}

// TestBugKeepAgainstAShorteningExtend (fixed in 0a4d888): Keep slept on
// the Until it had read, while the holder's Extend shortened the lock;
// the extend script then also lowered the keys' TTL. The keys expired,
// another client took the lock, and the kept context was still live. No
// fault is needed. Each half alone is safe: today's script never lowers
// a TTL, and a Keep that follows Until extends in time.
func TestBugKeepAgainstAShorteningExtend(t *testing.T) {
	cfg := base("Keep against a shortening Extend", 11,
		ClientSpec{TTL: 60, Holds: 1, Attempts: 1, Extends: 1, Keep: true},
		ClientSpec{Holds: 1, Attempts: 3})
	cfg.LongTTL, cfg.ExtendTTLs, cfg.Fencing = 60, []int64{6}, false
	cfg.Bugs = Bugs{LowerTTL: true, KeepStale: true}
	finds(t, cfg, "two holders at once")
	withoutIt(t, cfg, Bugs{LowerTTL: true}, Bugs{KeepStale: true}, Bugs{})
}

// TestBugReorderedExtends (fixed in d2aa13a): an Extend to a shorter TTL
// timed out (delayed), a later, longer Extend succeeded on a new
// connection, and then the shorter one's scripts landed and cut the keys
// short under the longer Until. The code then moved Until down before a
// shortening Extend sent (3fa561e), which covers the failed Extend, not
// the reordering.
func TestBugReorderedExtends(t *testing.T) {
	cfg := base("two Extends reordered on the wire", 12,
		ClientSpec{Holds: 1, Attempts: 1, Extends: 2, Eager: true, ExtendAt: []int64{2, 4}},
		ClientSpec{Holds: 1, Attempts: 2, Start: 11, Eager: true})
	cfg.Fencing, cfg.ExtendTTLs = false, []int64{6, 16}
	// Links to two nodes slow from the first Extend on, then new
	// connections.
	cfg.Faults = Faults{Delay: 2, Reorder: 2, DelayAfter: 2}
	cfg.Bugs = Bugs{LowerTTL: true, UntilBeforeSend: true}
	finds(t, cfg, "two holders at once")
	withoutIt(t, cfg, Bugs{})
}

// TestBugExtendPastTheRestartGate (fixed in cdb64f8, test 0ce53dd): an
// Extend took a TTL above the restart gate; two nodes restarted empty,
// their gate passed while the extended lock was still valid, and another
// client got their votes.
func TestBugExtendPastTheRestartGate(t *testing.T) {
	cfg := gated("Extend past the restart gate", 13,
		ClientSpec{Holds: 1, Attempts: 1, Extends: 1, Eager: true, ExtendAt: []int64{2}},
		ClientSpec{Holds: 1, Attempts: 10, Eager: true, Start: 2})
	cfg.Fencing = false
	cfg.Bugs.ExtendPastGate = true
	finds(t, cfg, "two holders at once")
	withoutIt(t, cfg, Bugs{})
}

// TestBugFencingTokensBackwardsUnderGating (fixed in cdb64f8): a token
// was 1 + the largest counter of the granting nodes. A node missed a
// record (its message lost), another restarted empty behind the gate,
// and a later quorum of those two proposed a token already granted,
// while docs/fencing.md said restart gating kept the argument.
func TestBugFencingTokensBackwardsUnderGating(t *testing.T) {
	cfg := gated("fencing tokens under gating without the clock floor", 13,
		ClientSpec{Holds: 1, Attempts: 1, Extends: 1, Eager: true, ExtendAt: []int64{3}},
		ClientSpec{Holds: 1, Attempts: 1, Start: 11, Eager: true})
	cfg.Faults = Faults{Loss: 1, Restart: 1}
	cfg.Bugs.NoClockFloor = true
	finds(t, cfg, "fencing token")
	withoutIt(t, cfg, Bugs{})
}
