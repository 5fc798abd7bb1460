package model

import "testing"

// The properties (docs/safety.md, "The model"): under the documented
// assumptions no two owners believe they hold the lock at the same real
// time; fencing tokens strictly increase across successive holders, and
// no two owners get the same one; without faults a released or expired
// lock is taken again. Each test explores one configuration completely.

// TestNoFaults: contention, Keep and the holder's own Extends
// (shortening or not), releases and expiry, without faults. Both ways a
// lock becomes free lead to another owner's grant.
func TestNoFaults(t *testing.T) {
	cfg := base("no faults", pick[int64](9, 12),
		ClientSpec{Holds: pick(1, 2), Attempts: 2, Extends: 1},
		ClientSpec{Holds: 1, Attempts: 2, Extends: pick(0, 1), Keep: true})
	r := holds(t, cfg)
	for _, e := range []string{"taken after another owner released", "taken after another owner's lock expired"} {
		if r.Events[e] == 0 {
			t.Errorf("no transition %s: liveness not shown", e)
		}
	}
}

// TestNetworkFaults: requests and answers lost or delayed past the node
// timeout (a late grant, a late extension), a request overtaking an
// earlier one of its client on a new connection.
func TestNetworkFaults(t *testing.T) {
	cfg := base("network faults", pick[int64](8, 10),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true},
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, Start: 1})
	cfg.Faults = Faults{Loss: 1, Delay: 1, Reorder: pick(0, 1)}
	holds(t, cfg)
}

// gated is a configuration whose nodes restart without their data,
// behind restart gating: maxTTL = the longest TTL.
func gated(name string, horizon int64, clients ...ClientSpec) Config {
	cfg := base(name, horizon, clients...)
	cfg.LongTTL, cfg.Gate = cfg.TTL, cfg.TTL
	cfg.Faults.Restart = 2
	return cfg
}

// TestRestartsWithGating: two nodes restart empty (a majority), any
// time; the restart gate keeps them out of quorums for maxTTL. Exclusion
// and fencing order hold (fencing.md: the nodes' clocks agree within
// maxTTL).
func TestRestartsWithGating(t *testing.T) {
	holds(t, gated("restarts, gating", pick[int64](13, 16),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true},
		ClientSpec{Holds: 1, Attempts: pick(3, 8), Eager: !long(), Start: 2}))
}

// TestRestartsWithoutGating is the negative control of the restart
// gate: without it one restarted node (of the majority that granted)
// grants the lock again while its holder still believes it holds it.
func TestRestartsWithoutGating(t *testing.T) {
	cfg := gated("restarts, no gating", 12, ClientSpec{Holds: 1, Attempts: 1, Eager: true}, ClientSpec{Holds: 1, Attempts: 2, Start: 2})
	cfg.Gate = 0
	finds(t, cfg, "two holders at once")
}

// drifting lets the clocks drift at the rate the drift allowance
// covers: every 7 ticks the nodes 0 and 1 gain a tick and every client
// loses one (TTL 8, drift 2).
func drifting(name string, horizon int64, clients ...ClientSpec) Config {
	cfg := base(name, horizon, clients...)
	cfg.LongTTL = cfg.TTL
	cfg.Faults.DriftEvery = 7
	cfg.Faults.FastNodes = [Nodes]bool{true, true, false}
	cfg.Faults.SlowClients = [MaxClients]bool{true, true, true}
	return cfg
}

// TestClockDrift: node clocks fast and client clocks slow at the rate
// the drift allowance covers.
func TestClockDrift(t *testing.T) {
	holds(t, drifting("clock drift", pick[int64](12, 15),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: !long()},
		ClientSpec{Holds: 1, Attempts: pick(4, 8), Start: 1}))
}

// TestClockDriftBeyondTheAllowance is the control of the clock model:
// clocks that drift a tick every 2 ticks (node and client 8 apart
// within a TTL of 8, where the allowance and the model's discrete slack
// cover 4) let a holder's validity outlive its keys.
func TestClockDriftBeyondTheAllowance(t *testing.T) {
	cfg := drifting("clock drift beyond the allowance", 12, ClientSpec{Holds: 1, Attempts: 1, Eager: true}, ClientSpec{Holds: 1, Attempts: 3, Start: 5})
	cfg.Faults.DriftEvery = 2
	finds(t, cfg, "two holders at once")
}

// TestReentrantOwners: two clients of one owner (WithOwner: reentrant
// holds sharing the owner's token, their own acquisition IDs, the check
// and note rounds) and a client of another owner, with a lost or delayed
// message.
func TestReentrantOwners(t *testing.T) {
	cfg := base("reentrant owners", pick[int64](9, 11),
		ClientSpec{Owner: "o", Holds: 1, Attempts: 1, Eager: true},
		ClientSpec{Owner: "o", Holds: 1, Attempts: 2, Eager: !long(), Start: 1},
		ClientSpec{Holds: 1, Attempts: 2, Eager: !long(), Start: 1})
	cfg.Faults = Faults{Loss: pick(0, 1), Delay: 1}
	holds(t, cfg)
}

// TestPausesWithFencing: a holder pauses between its validity check and
// its write (docs/safety.md, assumption 3 broken): exclusion of beliefs
// is lost, but the fenced resource never accepts a stale write.
func TestPausesWithFencing(t *testing.T) {
	cfg := base("pauses, fenced resource", pick[int64](12, 14),
		ClientSpec{Holds: 1, Attempts: 1, Writes: true, Eager: !long()},
		ClientSpec{Holds: 1, Attempts: 2, Writes: true})
	cfg.Faults.Pause = 1
	holds(t, cfg)
}

// TestKleppmannPause: the same without fencing: the checker finds
// Kleppmann's counterexample, a paused holder's write accepted after the
// next holder's.
func TestKleppmannPause(t *testing.T) {
	cfg := base("pauses, no fencing", 12,
		ClientSpec{Holds: 1, Attempts: 1, Writes: true},
		ClientSpec{Holds: 1, Attempts: 1, Writes: true})
	cfg.Faults.Pause, cfg.Fencing = 1, false
	finds(t, cfg, "stale write accepted")
}

// quorumFirst is base with a node timeout of 4 ticks for configurations
// with quorum-first clients (WithQuorumFirst): the hedge, at half of it,
// comes a tick after the first answers, and the answers of the nodes
// asked later (a second round trip) arrive within the round. With the
// base's 2 the hedge would fire at T1+1, before any answer could come
// (they arrive later in that tick), so every round would ask every node
// at T1+1 and never give the rest up.
func quorumFirst(name string, horizon int64, clients ...ClientSpec) Config {
	cfg := base(name, horizon, clients...)
	cfg.NodeTimeout = 4
	return cfg
}

// sawQuorumFirst fails unless each of events was reached: the paths of
// a quorum-first round the run must cover.
func sawQuorumFirst(t *testing.T, r Result, events ...string) {
	t.Helper()
	for _, e := range events {
		if r.Events[e] == 0 {
			t.Errorf("no transition %s: not covered", e)
		}
	}
}

const (
	qfGivenUp = "quorum first: the rest given up"
	qfAsked   = "quorum first: the rest asked after a first answer"
	qfHedge   = "quorum first: the rest asked by the hedge"
)

// TestQuorumFirstNoFaults is TestNoFaults with quorum-first acquire
// rounds: a quorum-first client against a plain one under Keep, then
// two quorum-first clients. Exclusion and fencing order hold, both
// hand-offs happen, a loser gives the rest up and a winner asks it.
func TestQuorumFirstNoFaults(t *testing.T) {
	for _, cfg := range []Config{
		quorumFirst("quorum first, no faults", pick[int64](9, 12),
			ClientSpec{Holds: pick(1, 2), Attempts: 2, Extends: 1, QuorumFirst: true},
			ClientSpec{Holds: 1, Attempts: 2, Extends: pick(0, 1), Keep: true}),
		quorumFirst("quorum first (both), no faults", pick[int64](9, 12),
			ClientSpec{Holds: pick(1, 2), Attempts: 2, Extends: 1, QuorumFirst: true},
			ClientSpec{Holds: 1, Attempts: 2, Extends: pick(0, 1), Keep: true, QuorumFirst: true}),
	} {
		r := holds(t, cfg)
		for _, e := range []string{"taken after another owner released", "taken after another owner's lock expired"} {
			if r.Events[e] == 0 {
				t.Errorf("%s: no transition %s: liveness not shown", cfg.Name, e)
			}
		}
		sawQuorumFirst(t, r, qfGivenUp, qfAsked)
	}
}

// TestQuorumFirstNetworkFaults is TestNetworkFaults with a
// quorum-first client, the second to ask, against a plain one: lost and
// delayed requests and answers, among them the first nodes' (the hedge
// asks the rest) and those of the nodes asked later (a late grant,
// undone or not). The plain client's Extend only in the long run.
func TestQuorumFirstNetworkFaults(t *testing.T) {
	cfg := quorumFirst("quorum first, network faults", pick[int64](7, 10),
		ClientSpec{Holds: 1, Attempts: 2, Extends: pick(0, 1), Eager: true},
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, Start: 1, QuorumFirst: true})
	cfg.Faults = Faults{Loss: 1, Delay: 1, Reorder: pick(0, 1)}
	sawQuorumFirst(t, holds(t, cfg), qfGivenUp, qfAsked, qfHedge)
}

// TestQuorumFirstContendersNetworkFaults: two quorum-first clients,
// which meet on the nodes asked first, with a lost and a delayed
// message.
func TestQuorumFirstContendersNetworkFaults(t *testing.T) {
	cfg := quorumFirst("quorum first (both), network faults", pick[int64](6, 10),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, QuorumFirst: true},
		ClientSpec{Holds: 1, Attempts: 2, Extends: pick(0, 1), Eager: true, Start: 1, QuorumFirst: true})
	cfg.Faults = Faults{Loss: 1, Delay: 1, Reorder: pick(0, 1)}
	sawQuorumFirst(t, holds(t, cfg), qfGivenUp, qfAsked, qfHedge)
}

// TestQuorumFirstRestartsWithGating is TestRestartsWithGating with a
// quorum-first client against a plain one: two nodes restart empty, and
// a gated answer from a node asked first asks the rest.
func TestQuorumFirstRestartsWithGating(t *testing.T) {
	cfg := gated("quorum first, restarts, gating", pick[int64](13, 16),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, QuorumFirst: true},
		ClientSpec{Holds: 1, Attempts: pick(3, 8), Eager: !long(), Start: 2})
	cfg.NodeTimeout = 4
	sawQuorumFirst(t, holds(t, cfg), qfGivenUp, qfAsked)
}

// TestQuorumFirstContendersRestartsWithGating: the same with two
// quorum-first clients.
func TestQuorumFirstContendersRestartsWithGating(t *testing.T) {
	cfg := gated("quorum first (both), restarts, gating", pick[int64](13, 16),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, QuorumFirst: true},
		ClientSpec{Holds: 1, Attempts: pick(3, 8), Eager: !long(), Start: 2, QuorumFirst: true})
	cfg.NodeTimeout = 4
	sawQuorumFirst(t, holds(t, cfg), qfGivenUp, qfAsked)
}

// TestOneFirstNetworkFaults: two clients whose acquire rounds ask one
// node first (WithHighWaterFirst), the second taking a refusal there in
// its first attempt as final (a refusal by the mark), the first asking
// the rest after it (a refusal by a lock key), with a lost and a delayed
// message. Both paths and the
// hedge are reached, and exclusion holds.
func TestOneFirstNetworkFaults(t *testing.T) {
	cfg := quorumFirst("one first (both), network faults", pick[int64](6, 10),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, OneFirst: true},
		ClientSpec{Holds: 1, Attempts: 2, Extends: pick(0, 1), Eager: true, Start: 1, OneFirst: true, FinalRefusal: true})
	cfg.Faults = Faults{Loss: 1, Delay: 1, Reorder: pick(0, 1)}
	sawQuorumFirst(t, holds(t, cfg), ofFinal, qfAsked, qfHedge)
}

// TestOneFirstRestartsWithGating: the same clients, no network faults,
// and two nodes restarting empty behind the gate.
func TestOneFirstRestartsWithGating(t *testing.T) {
	cfg := gated("one first (both), restarts, gating", pick[int64](13, 16),
		ClientSpec{Holds: 1, Attempts: 2, Extends: 1, Eager: true, OneFirst: true},
		ClientSpec{Holds: 1, Attempts: pick(3, 8), Eager: !long(), Start: 2, OneFirst: true, FinalRefusal: true})
	cfg.NodeTimeout = 4
	sawQuorumFirst(t, holds(t, cfg), ofFinal, qfAsked)
}
