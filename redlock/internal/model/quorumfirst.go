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

// quorumFirst reports whether a round of client i of this kind holds
// nodes back: its acquire rounds, under ClientSpec.QuorumFirst.
func (mm *m) quorumFirst(i int, kind byte) bool {
	return kind == 'a' && mm.cfg.Clients[i].QuorumFirst
}

// holdBack returns the nodes a quorum-first round does not ask at first.
func holdBack() [Nodes]bool {
	var held [Nodes]bool
	for n := Quorum; n < Nodes; n++ {
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
	case r.Answer-count(r, 'O') > Nodes-Quorum:
		mm.giveUpRest(s, i)
	case r.Res[n].Out != 'H' || left == 0:
		mm.askRest(s, i, "quorum first: the rest asked after a first answer")
	}
}

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
