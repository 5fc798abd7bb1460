package model

// Quorum-first acquire rounds (redlock/quorumfirst.go, WithQuorumFirst):
// the acquire goes to a quorum of the nodes first, nodes 0..Quorum-1 for
// every client (the code picks the same nodes for every client of a
// key), and to the others (Round.Held) when a node asked first answers
// anything but held, once every node asked first answered and a quorum
// is still possible, or at half the node timeout while one is still held
// back (the hedge). When the first answers make a quorum impossible the
// others are never asked: their answer is 'U' (unasked), which counts as
// an answer, and no undo goes to them. What is still held back when the
// round ends is unasked too.

//
// One node first (redlock/highwater.go, WithHighWaterFirst) is the same
// order with node 0 alone asked first; with FinalRefusal a refusal by
// node 0 in an acquisition's first attempt gives the others up (the
// mark's final refusal), and a retry asks them after any answer.

// quorumFirst reports whether a round of client i of this kind holds
// nodes back: its acquire rounds, under ClientSpec.QuorumFirst or
// OneFirst.
func (mm *m) quorumFirst(i int, kind byte) bool {
	spec := mm.cfg.Clients[i]
	return kind == 'a' && (spec.QuorumFirst || spec.OneFirst)
}

// holdBack returns the nodes a quorum-first round does not ask at first:
// all but node 0 for one node first.
func holdBack(oneFirst bool) [Nodes]bool {
	from := Quorum
	if oneFirst {
		from = 1
	}
	var held [Nodes]bool
	for n := from; n < Nodes; n++ {
		held[n] = true
	}
	return held
}

// holding reports whether r still holds nodes back.
func holding(r *Round) bool { return r.Held != [Nodes]bool{} }

// answered is redlock's quorumFirst.answered: after node n answered
// client i's round, it asks the nodes held back, or gives them up, when
// the answers of the nodes asked first say so. It runs before the round
// is decided.
func (mm *m) answered(s *State, i, n int) {
	r := &s.Client[i].Round
	if !holding(r) || r.Held[n] {
		return
	}
	left := 0 // nodes asked first without an answer
	for k := range Nodes {
		if !r.Held[k] && r.Res[k].Out == 0 {
			left++
		}
	}
	switch {
	case mm.cfg.Clients[i].FinalRefusal && s.Client[i].Attempts == 1 && r.Res[n].Out == 'H': // a first attempt's
		if s.event == "" {
			s.event = ofFinal
		}
		mm.giveUpRest(s, i)
	case r.Answer-count(r, 'O') > Nodes-Quorum:
		mm.giveUpRest(s, i)
	case r.Res[n].Out != 'H' || left == 0:
		mm.askRest(s, i, "quorum first: the rest asked after a first answer")
	}
}

// ofFinal is the event of a one-node-first round that its first node's
// refusal ended.
const ofFinal = "one first: a refusal there is final"

// hedge asks the nodes held back at half the node timeout.
func (mm *m) hedge(s *State, i int) {
	c := &s.Client[i]
	if holding(&c.Round) && s.clock(i) >= c.T1+mm.cfg.NodeTimeout/2 {
		mm.askRest(s, i, "quorum first: the rest asked by the hedge")
	}
}

// askRest sends the round's acquire to the nodes held back.
func (mm *m) askRest(s *State, i int, event string) {
	c := &s.Client[i]
	r := &c.Round
	for n := range Nodes {
		if r.Held[n] {
			r.Held[n] = false
			s.send(i, n, Msg{Seq: r.Seq, Kind: r.Kind, TTL: c.TTL, Value: c.Value, Aid: c.Aid})
		}
	}
	if s.event == "" {
		s.event = event
	}
}

// giveUpRest marks the nodes held back as never asked.
func (mm *m) giveUpRest(s *State, i int) {
	r := &s.Client[i].Round
	for n := range Nodes {
		if r.Held[n] {
			r.Held[n] = false
			r.Res[n] = Reply{Out: 'U'}
			r.Answer++
		}
	}
	if s.event == "" {
		s.event = "quorum first: the rest given up"
	}
}
