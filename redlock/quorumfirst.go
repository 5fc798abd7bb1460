package redlock

import "time"

// A round with WithQuorumFirst asks a quorum of the nodes first and holds
// the others back. It asks them as soon as a node asked first answers
// anything but a refusal (a grant needs more grants, a failure another
// node), once every node asked first answered and a quorum is still
// possible, or at half the node timeout when one of those is still
// silent (the hedge); never when the first answers already make a
// quorum impossible: then
// they are unasked (OutcomePending), their results say so, and no undo
// goes to them. Everything below runs with roundState.mu held, except
// holdBack (before any call is sent), startHedge and hedged (the timer's).
//
// Why exclusion does not depend on it: a lock is held when a quorum
// granted within the validity, counted the same way; a node asked late is
// a node whose request was delayed, which every round must survive
// anyway (docs/safety.md, "A quorum first").

// heldBack is what a round has not asked yet.
type heldBack struct {
	first []bool      // the nodes asked first; nil when none is held back (never changes once set)
	back  []bool      // the nodes held back, not asked yet
	n     int         // how many are held back
	left  int         // nodes asked first that have not answered
	hedge *time.Timer // asks the rest at half the node timeout
}

// later reports whether node i is held back, not asked yet.
func (h *heldBack) later(i int) bool { return h.n > 0 && h.back[i] }

// stop stops the hedge.
func (h *heldBack) stop() {
	if h.hedge != nil {
		h.hedge.Stop()
	}
}

// holdBack chooses the nodes asked first: a quorum, in the ring order of
// the nodes from the one that the round's first key names. It is the
// same for every caller of the same resources, whatever each knows of
// the nodes, so that contenders meet on the same nodes: a node asked
// first that is down costs a winner nothing (its first grant asks the
// others) and a loser the hedge, while passing over it would let
// callers that disagree on whether it is down ask different nodes first
// and split them.
func (rs *roundState) holdBack() {
	n, q := len(rs.c.peers), rs.c.quorum
	h := heldBack{first: make([]bool, n), back: make([]bool, n)}
	start := 0
	if len(rs.b.keys) > 0 {
		start = int(fnv1a(rs.b.keys[0]) % uint32(n))
	}
	for j := range n {
		i := (start + j) % n
		switch {
		case rs.results[i].Outcome >= 0: // not called (broadcast.skip)
		case h.left < q:
			h.first[i] = true
			h.left++
		default:
			h.back[i] = true
			h.n++
		}
	}
	if h.n == 0 {
		return
	}
	rs.calls -= h.n
	rs.held = h
}

// startHedge starts the hedge, once the nodes asked first have their
// calls, unless the rest was asked or given up already.
func (rs *roundState) startHedge() {
	rs.mu.Lock()
	if !rs.decided && rs.held.n > 0 {
		rs.held.hedge = time.AfterFunc(rs.nodeTimeout()/2, rs.hedged)
	}
	rs.mu.Unlock()
}

// answered goes on after node i answered r: it asks the nodes held back,
// or gives them up, when the answers of the nodes asked first say so.
func (h *heldBack) answered(rs *roundState, i int, r NodeResult) {
	if h.n == 0 || !h.first[i] {
		return
	}
	h.left--
	switch {
	case rs.t.bad > rs.t.nodes-rs.t.quorum:
		rs.giveUpRest()
	case r.Outcome != OutcomeHeld || h.left == 0:
		rs.askRest() // a grant needs more grants; a failure, another node
	}
}

// hedged asks the nodes held back when a node asked first is still
// silent at half the node timeout.
func (rs *roundState) hedged() {
	rs.mu.Lock()
	last := false
	if !rs.decided && rs.held.n > 0 {
		rs.askRest()
		last = rs.answered == rs.calls
	}
	rs.mu.Unlock()
	if last {
		rs.ended()
	}
}

// askRest sends the round's call to the nodes held back. Sent before the
// round is decided, each call is queued on its node ahead of anything
// the caller sends after the round (an undo, a Release).
func (rs *roundState) askRest() {
	h := &rs.held
	h.stop()
	for i, back := range h.back {
		if !back {
			continue
		}
		h.back[i], h.n = false, h.n-1
		p := rs.c.peers[i]
		rs.calls++
		if err := rs.send(new(nodeCall), p, rs.b.plain != nil && !p.noSetGet.Load()); err != nil {
			rs.answerLocked(p, NodeResult{Node: i, Addr: p.addr, Outcome: OutcomeError, Err: ErrClosed, canceled: true})
		}
	}
}

// giveUpRest marks the nodes held back as never asked: the answers of
// the nodes asked first make a quorum impossible.
func (rs *roundState) giveUpRest() {
	h := &rs.held
	h.stop()
	for i, back := range h.back {
		if !back {
			continue
		}
		h.back[i], h.n = false, h.n-1
		rs.results[i] = unasked(rs.c.peers[i], time.Since(rs.start))
		if rs.counted != nil && rs.counted[i] {
			rs.counted[i] = false
			rs.t.down--
		}
		rs.t.unasked++
	}
}

// unasked is the result of node p, never asked by a round that waited d.
func unasked(p *peer, d time.Duration) NodeResult {
	return NodeResult{Node: p.idx, Addr: p.addr, Outcome: OutcomePending, Latency: d, unasked: true}
}

// fnv1a is the 32-bit FNV-1a hash of s: the same in every process.
func fnv1a(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}
