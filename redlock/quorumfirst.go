package redlock

import (
	"time"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// Quorum-first asking (WithQuorumFirst): an asking order of the Lock's
// acquire rounds (round.go, askingOrder), given by a layer that is in no
// script. A round asks a quorum of the nodes first and holds the others
// back. It asks them as soon as a node asked first answers anything but
// a refusal (a grant needs more grants, a failure another node), once
// every node asked first answered and a quorum is still possible, or at
// half the node timeout when one of those is still silent (the hedge);
// never when the first answers already make a quorum impossible: then
// they are given up (forgoLocked: OutcomePending, unsent), their results
// say so ("not asked", errors.go), and no undo goes to them (the undo
// skips unsent nodes, acquire.go). Everything below runs with
// roundState.mu held, except first (before any call is sent), sent and
// hedged (the timer's), which take it through whileUndecided.
//
// The later calls are queued before the round is decided, so they too
// precede on their nodes whatever the caller sends after the round (an
// undo, a Release).
//
// Why exclusion does not depend on it: a lock is held when a quorum
// granted within the validity, counted the same way; a node asked late is
// a node whose request was delayed, which every round must survive
// anyway (docs/safety.md, "A quorum first").

// WithQuorumFirst makes each acquire round of the call ask a quorum of
// the nodes first and the others only when those answers leave a quorum
// possible: a round lost to a holder costs a quorum of commands instead
// of one per node. The quorum asked first starts at a node chosen by the
// lock's first key, by its place in the nodes given to New, so every
// caller of the same resources that gives New the nodes in the same order
// asks the same nodes first. The other nodes are asked as soon as
// a node asked first grants (a grant wins on every node it can, also on
// those asked last) or fails (an error, a restart gate), or at half the
// node timeout while one of them is still silent after the others
// refused; they are never asked when the first answers make a quorum
// impossible. A node never asked is OutcomePending,
// gets no undo, and its error text says so.
//
// A winner's round takes the same one round trip (it returns once the
// quorum granted, with the other nodes' calls already queued ahead of
// anything it sends next, like any round decided at a quorum) when the
// nodes asked first grant, and two when one of them refused: contenders
// that split the first nodes meet again on the others in the same round.
// Exclusion is unchanged: whether a lock is held is decided by the same
// quorum of grants, and a node asked later is a node whose request was
// delayed (docs/safety.md, "A quorum first"). It suits callers whose
// rounds usually lose to a holder that already holds (package elector's
// followers), not contenders that start at the same instant: those split
// the nodes asked first and pay more rounds than the quorum saves.
// A SharedOption: given to New, every call's rounds; given to a call
// (Acquire, TryAcquire, Do), that call's; a call with WithHighWaterFirst
// asks in that option's order instead. Default off: every node is asked
// at once (redis.io distlock spec, step 2, as multiplexed there).
func WithQuorumFirst() SharedOption {
	return sharedOption(func(l *lockConfig) { l.quorumFirst = true })
}

// quorumFirstLayer is the layer of a Lock with WithQuorumFirst: it adds
// nothing to the scripts, only the asking order of its acquire rounds.
type quorumFirstLayer struct{ baseLayer }

func newQuorumFirst(_ *Client, cfg *lockConfig, _ []string, _ bool) (layer, error) {
	if !cfg.quorumFirst {
		return nil, nil
	}
	return quorumFirstLayer{}, nil
}

// part has no hooks: the layer is in no script.
func (quorumFirstLayer) part() script.Part { return script.Part{Name: "quorumfirst"} }

// order returns a new quorum-first order for one acquire round.
func (quorumFirstLayer) order() askingOrder { return &quorumFirst{} }

// quorumFirst is one round's quorum-first order: what it has not asked
// yet. With ask > 0 it asks that many nodes first instead of a quorum,
// with allIfFirstDown every node at once when one chosen first is known
// down, and a refusal by a node asked first for which final holds ends
// the round (highwater.go's one node first).
type quorumFirst struct {
	ask            int                   // nodes to ask first; 0: a quorum
	allIfFirstDown bool                  // a node chosen first is down: ask every node
	final          func(NodeResult) bool // a refusal that ends the round; nil: none
	firsts         []bool                // the nodes asked first (never changes once set)
	back           []bool                // the nodes held back, not asked yet
	n              int                   // how many are held back
	left           int                   // nodes asked first that have not answered
	hedge          *time.Timer           // asks the rest at half the node timeout
}

// first chooses the nodes asked first: a quorum (or ask), in the ring
// order of the nodes from the one that the round's first key names; nil
// when that is every node called. It is the same for every caller of the
// same resources, whatever each knows of the nodes, so that contenders
// meet on the same nodes: a node asked first that is down costs a winner
// nothing (its first grant asks the others) and a loser the hedge, while
// passing over it would let callers that disagree on whether it is down
// ask different nodes first and split them. With allIfFirstDown (one
// node asked first, whose winner asks the others only on its grant) a
// node chosen first that is known down (it has not answered since a call
// timed out) makes the round ask every node at once: the hedge would
// only delay it.
func (h *quorumFirst) first(rs *roundState) []bool {
	n, q := len(rs.c.peers), rs.c.quorum
	if h.ask > 0 {
		q = h.ask
	}
	first, back := make([]bool, n), make([]bool, n)
	start := 0
	if len(rs.b.keys) > 0 {
		start = int(fnv1a(rs.b.keys[0]) % uint32(n))
	}
	left, held := 0, 0
	for j := range n {
		i := (start + j) % n
		switch {
		case rs.b.skipped(i): // not called
		case left < q:
			if h.allIfFirstDown && rs.c.peers[i].down.Load() {
				return nil
			}
			first[i] = true
			left++
		default:
			back[i] = true
			held++
		}
	}
	if held == 0 {
		return nil
	}
	h.firsts, h.back, h.n, h.left = first, back, held, left
	return first
}

// sent starts the hedge, once the nodes asked first have their calls,
// unless the rest was asked or given up already.
func (h *quorumFirst) sent(rs *roundState) {
	rs.whileUndecided(func() {
		if h.n > 0 {
			h.hedge = time.AfterFunc(rs.nodeTimeout()/2, func() { h.hedged(rs) })
		}
	})
}

// answered goes on after node i answered r: it asks the nodes held back,
// or gives them up, when the answers of the nodes asked first say so.
func (h *quorumFirst) answered(rs *roundState, i int, r NodeResult) {
	if h.n == 0 || !h.firsts[i] {
		return
	}
	h.left--
	switch {
	case h.final != nil && r.Outcome == OutcomeHeld && h.final(r):
		h.giveUpRest(rs)
		rs.refusedForGoodLocked(i)
	case rs.t.bad > rs.t.nodes-rs.t.quorum:
		h.giveUpRest(rs)
	case r.Outcome != OutcomeHeld || h.left == 0:
		h.askRest(rs) // a grant needs more grants; a failure, another node
	}
}

// hedged asks the nodes held back when a node asked first is still
// silent at half the node timeout.
func (h *quorumFirst) hedged(rs *roundState) {
	rs.whileUndecided(func() {
		if h.n > 0 {
			h.askRest(rs)
		}
	})
}

// waiting reports whether node i is held back, not asked yet.
func (h *quorumFirst) waiting(i int) bool { return h.n > 0 && h.back[i] }

// stop stops the hedge.
func (h *quorumFirst) stop() {
	if h.hedge != nil {
		h.hedge.Stop()
	}
}

// askRest sends the round's call to the nodes held back.
func (h *quorumFirst) askRest(rs *roundState) {
	h.stop()
	for i, back := range h.back {
		if !back {
			continue
		}
		h.back[i], h.n = false, h.n-1
		rs.askLocked(i)
	}
}

// giveUpRest gives up the nodes held back: the answers of the nodes
// asked first make a quorum impossible.
func (h *quorumFirst) giveUpRest(rs *roundState) {
	h.stop()
	for i, back := range h.back {
		if !back {
			continue
		}
		h.back[i], h.n = false, h.n-1
		rs.forgoLocked(i)
	}
}

// fnv1a is the 32-bit FNV-1a hash of s: the same in every process.
func fnv1a(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}
