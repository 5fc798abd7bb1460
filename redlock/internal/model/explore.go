package model

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strings"
	"time"
)

// Step is one transition: what happened, and the state after it.
type Step struct {
	Label string
	S     *State
}

// Each tick of real time runs in stages, in this order: the clients
// choose what to do (each at most one action: acquire, extend, release,
// write, pause or resume, or nothing), in client order; then each node,
// in node order, runs the requests that reached it (sent in an earlier
// tick), in any order among clients (and faults may lose or delay a
// request or its answer, or let a request overtake an earlier one);
// then each client reads the answers that came back, in any order; then
// time advances. Actions of different clients on different nodes
// commute, and what a client sends goes out at the next tick, so fixing
// the order between nodes and between clients' answers loses no
// behaviour that matters: every order of one node's requests and of one
// client's answers is explored.
const (
	stageChoose = iota
	stageNodes
	stageAnswers
	stageTick
)

// next returns every successor of s, in a fixed order (traces replay by
// index).
func (mm *m) next(s *State) []Step {
	var out []Step
	add := func(label string, f func(*State)) {
		c := s.Clone()
		c.event = ""
		f(c)
		mm.normalize(c)
		out = append(out, Step{label, c})
	}
	switch s.Stage {
	case stageChoose:
		mm.chooseSteps(s, add)
	case stageNodes:
		mm.nodeSteps(s, add)
	case stageAnswers:
		mm.answerSteps(s, add)
	case stageTick:
		if s.T < mm.cfg.Horizon {
			add("tick", mm.tick)
		}
	}
	return out
}

// chooseSteps adds the steps of the client at the cursor.
func (mm *m) chooseSteps(s *State, add func(string, func(*State))) {
	i := s.Cursor
	choose := func(label string, f func(*State)) {
		add(label, func(c *State) { f(c); c.Cursor++ })
	}
	c, spec := &s.Client[i], mm.cfg.Clients[i]
	eager := spec.Eager && !c.Paused && (c.Phase == Idle && s.T >= spec.Start || c.Phase == Backoff)
	if !eager {
		choose(fmt.Sprintf("client %d waits", i), func(*State) {})
	}
	mm.clientSteps(s, i, choose)
}

// nodeSteps adds the steps of the node at the cursor: each request that
// may arrive now, with its faults, and a restart.
func (mm *m) nodeSteps(s *State, add func(string, func(*State))) {
	n := s.Cursor
	only := true // only held messages (or none) are left
	for k, msg := range s.Net {
		if msg.Reply || msg.N != n || msg.Sent >= s.T {
			continue
		}
		if !mm.head(s, k) {
			if s.Left.Reorder > 0 {
				add("deliver out of order "+msgText(msg), func(c *State) { c.Left.Reorder--; mm.deliver(c, k, 0) })
			}
			continue
		}
		only = only && msg.Held
		mm.requestSteps(s, k, msg, add)
	}
	if s.Left.Restart > 0 {
		add(fmt.Sprintf("node %d restarts empty", n), func(c *State) { c.Left.Restart--; c.Node[n].Keys = nil })
	}
	if only {
		add(fmt.Sprintf("node %d: nothing more arrives now", n), func(c *State) { c.Cursor++ })
	}
}

// requestSteps adds the steps of request s.Net[k], first in flight on
// its channel: delivered, lost, delayed.
func (mm *m) requestSteps(s *State, k int, msg Msg, add func(string, func(*State))) {
	what := msgText(msg)
	add("deliver "+what, func(c *State) { mm.deliver(c, k, 0) })
	if s.Left.Loss > 0 {
		add("lose "+what, func(c *State) { c.Left.Loss--; c.Net = del(c.Net, k) })
		if msg.Seq != 0 {
			add("deliver "+what+", lose the answer", func(c *State) { c.Left.Loss--; mm.deliver(c, k, 'l') })
		}
	}
	if s.Left.Delay > 0 && !msg.Held && msg.Sent >= mm.cfg.Faults.DelayAfter {
		add("delay "+what, func(c *State) { c.Left.Delay--; c.Net[k].Held = true })
		if msg.Seq != 0 && mm.cfg.Faults.DelayAfter == 0 {
			add("deliver "+what+", delay the answer", func(c *State) { c.Left.Delay--; mm.deliver(c, k, 'd') })
		}
	}
}

// answerSteps adds the answers that may reach the client at the cursor.
func (mm *m) answerSteps(s *State, add func(string, func(*State))) {
	i := s.Cursor
	only := true
	for k, msg := range s.Net {
		if !msg.Reply || msg.C != i {
			continue
		}
		only = only && msg.Held
		add("answer "+msgText(msg), func(c *State) { mm.deliver(c, k, 0) })
	}
	if only {
		add(fmt.Sprintf("client %d: no more answers now", i), func(c *State) { c.Cursor++ })
	}
}

// pending reports whether the current stage has something left to do;
// normalize skips stages and cursors that have not.
func (mm *m) pending(s *State) bool {
	switch s.Stage {
	case stageChoose:
		c := &s.Client[s.Cursor]
		return c.Paused || c.Phase != Done
	case stageNodes:
		if s.Left.Restart > 0 {
			return true
		}
		for _, msg := range s.Net {
			if !msg.Reply && msg.N == s.Cursor && msg.Sent < s.T {
				return true
			}
		}
		return false
	case stageAnswers:
		if s.Client[s.Cursor].Paused {
			return false
		}
		for _, msg := range s.Net {
			if msg.Reply && msg.C == s.Cursor {
				return true
			}
		}
		return false
	}
	return true
}

// advance moves s to the next stage or cursor that has something to do.
func (mm *m) advance(s *State) {
	for {
		limit := s.clients
		if s.Stage == stageNodes {
			limit = Nodes
		}
		if s.Stage != stageTick && s.Cursor >= limit {
			s.Stage, s.Cursor = s.Stage+1, 0
			continue
		}
		if s.Stage == stageTick || mm.pending(s) {
			return
		}
		s.Cursor++
	}
}

// head reports whether s.Net[k] is the first in flight on its channel
// (client to node, or node to client): a connection delivers in order.
func (mm *m) head(s *State, k int) bool {
	msg := s.Net[k]
	for _, x := range s.Net[:k] {
		if x.C == msg.C && x.N == msg.N && x.Reply == msg.Reply {
			return false
		}
	}
	return true
}

func del(net []Msg, k int) []Msg { return append(net[:k:k], net[k+1:]...) }

// deliver delivers s.Net[k]: a request runs its script on the node, and
// its answer goes back (fault 'd' holds it back, 'l' loses it); an
// answer reaches its client.
func (mm *m) deliver(s *State, k int, fault byte) {
	msg := s.Net[k]
	s.Net = del(s.Net, k)
	if msg.Reply {
		mm.answer(s, msg.C, msg)
		return
	}
	msg.Ans = mm.execute(s, msg)
	if msg.Seq != 0 && fault != 'l' { // a cleanup's answer: nobody waits for it
		msg.Reply, msg.Held, msg.Sent = true, fault == 'd', s.T
		s.Net = append(s.Net, msg)
	}
}

// clientSteps adds the steps client i may take now.
func (mm *m) clientSteps(s *State, i int, add func(string, func(*State))) {
	c := &s.Client[i]
	spec := mm.cfg.Clients[i]
	name := fmt.Sprintf("client %d ", i)
	if c.Paused {
		add(name+"resumes", func(c *State) { c.Client[i].Paused = false; mm.timers(c, i) })
		return
	}
	if c.Phase == Done {
		return
	}
	switch c.Phase {
	case Idle:
		if s.T >= spec.Start {
			add(name+"acquires", func(c *State) { mm.startAttempt(c, i) })
		}
	case Backoff:
		add(name+"retries", func(c *State) { mm.startAttempt(c, i) })
	case Held:
		mm.heldSteps(s, i, add)
	}
}

// heldSteps adds the steps of client i while it holds its lock: writes,
// extensions, the release.
func (mm *m) heldSteps(s *State, i int, add func(string, func(*State))) {
	c := &s.Client[i]
	spec := mm.cfg.Clients[i]
	name := fmt.Sprintf("client %d ", i)
	switch {
	case c.InCS:
		add(name+"writes", func(c *State) { mm.write(c, i) })
		return // it writes right after its check unless paused (assumption 3)
	case spec.Writes && !c.Wrote && mm.believes(s, i):
		add(name+"checks its lock and writes", func(c *State) { mm.write(c, i) })
		if s.Left.Pause > 0 {
			add(name+"checks its lock, then pauses before its write", func(c *State) {
				c.Left.Pause--
				c.Client[i].InCS, c.Client[i].Paused = true, true
			})
		}
	}
	if c.Round.Kind != 0 || c.KeepDue {
		return // Release and Extend wait for the Lock's op mutex
	}
	timed := len(spec.ExtendAt) == 0 || c.Extends < len(spec.ExtendAt) && spec.ExtendAt[c.Extends] == s.T
	if c.Extends < spec.Extends && !c.Lost && s.clock(i) < c.Until && timed {
		for _, ttl := range mm.cfg.extendTTLs() {
			add(fmt.Sprintf("%sextends to %d", name, ttl), func(c *State) { c.Client[i].Extends++; mm.extend(c, i, ttl, false) })
		}
	}
	add(name+"releases", func(c *State) { mm.release(c, i) })
}

// release is lock.go's Release: the holder stops believing, and the
// release script goes to every node (cleanups are never dropped).
func (mm *m) release(s *State, i int) {
	c := &s.Client[i]
	how := byte('r')
	if c.Lost || s.clock(i) >= c.Until {
		how = 'x'
	}
	s.broadcast(i, [Nodes]bool{}, Msg{Kind: 'r', Value: c.Value, Aid: c.Aid})
	mm.endHold(s, i, how)
}

// write is a guarded write of client i to the protected resource, which
// rejects a fencing token below the largest it accepted when fencing is
// on. A write accepted after a write of a later holder is stale.
func (mm *m) write(s *State, i int) {
	c := &s.Client[i]
	c.InCS, c.Wrote = false, true
	g := &s.Ghost
	if mm.cfg.Fencing && c.Token < g.StoreTok {
		return // rejected
	}
	if c.G < g.StoreG {
		s.Broken = fmt.Sprintf("stale write accepted: %s (grant %d, token %d) wrote after a later holder's write (grant %d)", c.OwnerName, c.G, c.Token, g.StoreG)
	}
	g.StoreG, g.StoreTok = max(g.StoreG, c.G), max(g.StoreTok, c.Token)
}

// tick advances real time by one tick: every clock moves (the fast nodes
// and slow clients drift every DriftEvery ticks), expired keys go, and
// each client runs what its clock made due.
func (mm *m) tick(s *State) {
	s.T++
	s.Stage, s.Cursor = stageChoose, 0
	d := mm.cfg.Faults.DriftEvery
	drift := d > 0 && s.T%d == 0
	for n := range Nodes {
		s.Node[n].Now++
		if drift && mm.cfg.Faults.FastNodes[n] {
			s.Node[n].Now++
		}
	}
	for i := range s.clients {
		if drift && mm.cfg.Faults.SlowClients[i] {
			s.Client[i].Lag++
		}
		mm.timers(s, i)
	}
}

// normalize drops what can no longer matter, so that equal situations
// are one state: expired keys, and answers no round waits for.
func (mm *m) normalize(s *State) {
	for n := range Nodes {
		s.Node[n].Purge()
	}
	keep := s.Net[:0]
	for _, msg := range s.Net {
		r := &s.Client[msg.C].Round
		if msg.Reply && (r.Kind == 0 || msg.Seq != r.Seq || r.Res[msg.N].Out != 0) {
			continue
		}
		keep = append(keep, msg)
	}
	s.Net = keep
	mm.advance(s)
}

// msgText describes a message for traces.
func msgText(msg Msg) string {
	kinds := map[byte]string{'a': "acquire", 'x': "extend", 'r': "release", 'u': "undo", 'f': "fence", 'c': "check", 'n': "note"}
	arg := ""
	switch msg.Kind {
	case 'a', 'x':
		arg = fmt.Sprintf("(ttl %d)", msg.TTL)
	case 'f', 'c', 'n':
		arg = fmt.Sprintf("(%d)", msg.Tok)
	}
	if msg.Reply {
		return fmt.Sprintf("%s%s answer %c node %d -> client %d", kinds[msg.Kind], arg, msg.Ans.Out, msg.N, msg.C)
	}
	return fmt.Sprintf("%s%s client %d -> node %d", kinds[msg.Kind], arg, msg.C, msg.N)
}

// encode writes every field of s that decides its future (not event).
func encode(b []byte, s *State) []byte {
	i64 := func(v int64) { b = binary.AppendVarint(b, v) }
	str := func(v string) { b = binary.AppendUvarint(b, uint64(len(v))); b = append(b, v...) }
	flag := func(v bool) {
		if v {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	i64(s.T)
	b = append(b, byte(s.Stage), byte(s.Cursor))
	for n := range Nodes {
		st := &s.Node[n]
		i64(st.Now)
		i64(int64(len(st.Keys)))
		for _, e := range st.Keys {
			str(e.Key)
			b = append(b, e.Kind)
			str(e.Str)
			i64(e.Exp)
			for _, f := range e.Hash {
				str(f.Name)
				str(f.Val)
			}
			b = append(b, '|')
			for _, v := range e.List {
				str(v)
			}
			b = append(b, '|')
		}
	}
	for i := range s.clients {
		c := &s.Client[i]
		i64(c.Lag)
		b = append(b, byte(c.Phase), c.Ended, c.Round.Kind)
		flag(c.Paused)
		flag(c.Lost)
		flag(c.InCS)
		flag(c.Wrote)
		flag(c.KeepDue)
		flag(c.KeepFailed)
		flag(c.ExtByKeep)
		for _, v := range []int64{int64(c.Holds), int64(c.Attempts), int64(c.Extends), int64(c.Seq), c.T1, c.TTL, c.Until,
			c.Token, c.Tok, c.Largest, c.Kept, c.ExtStart, c.ExtTTL, c.KeepRetry, c.KeepUntil, c.KeepTTL, int64(c.G), c.SeenTok,
			int64(c.Round.Seq), c.Round.End, int64(c.Round.Answer)} {
			i64(v)
		}
		str(c.Value)
		str(c.Aid)
		str(c.SeenOwner)
		for n := range Nodes {
			flag(c.AcqOK[n])
			flag(c.AcqSkip[n])
			flag(c.Round.Held[n])
			r := c.Round.Res[n]
			b = append(b, r.Out)
			i64(r.R1)
			i64(r.R2)
			i64(r.R3)
		}
	}
	for _, msg := range s.Net {
		b = append(b, byte(msg.C), byte(msg.N), msg.Kind, byte(s.T-msg.Sent))
		flag(msg.Reply)
		flag(msg.Held)
		i64(int64(msg.Seq))
		i64(msg.TTL)
		i64(msg.Tok)
		str(msg.Value)
		str(msg.Aid)
		b = append(b, msg.Ans.Out)
		i64(msg.Ans.R1)
		i64(msg.Ans.R2)
		i64(msg.Ans.R3)
	}
	l := s.Left
	for _, v := range []int{l.Loss, l.Delay, l.Reorder, l.Restart, l.Pause, s.Ghost.Grants, s.Ghost.StoreG} {
		i64(int64(v))
	}
	i64(s.Ghost.MaxTok)
	i64(s.Ghost.StoreTok)
	str(s.Ghost.MaxOwner)
	for _, x := range s.Ghost.Issued {
		i64(x.Tok)
		str(x.Owner)
	}
	str(s.Broken)
	return b
}

// Result is what an exploration found.
type Result struct {
	Config      string
	States      int            // distinct states reached
	Transitions int            // steps taken
	Depth       int            // longest path explored (BFS levels)
	Complete    bool           // every reachable state within the horizon was explored
	Violation   string         // the first property broken, "" for none
	Trace       []string       // the shortest path to it: each step and the time
	Events      map[string]int // transitions that reached notable events (liveness witnesses)
	Elapsed     time.Duration
}

func (r Result) String() string {
	done := "complete"
	switch {
	case r.Violation != "":
		done = "stopped at a violation"
	case !r.Complete:
		done = "cut at the state limit"
	}
	return fmt.Sprintf("%s: %d states, %d transitions, depth %d, %s, %v", r.Config, r.States, r.Transitions, r.Depth, done, r.Elapsed.Round(time.Millisecond))
}

// link is how the explorer reached a state: its parent and which of the
// parent's successors it is.
type link struct {
	parent uint64
	k      int32
}

// Explore explores every state of cfg reachable within its horizon,
// breadth first (so a violation comes with a shortest trace), and stops
// at the first state that breaks a property or after limit states.
// States are told apart by a 64-bit hash of their encoding (maphash): a
// collision would merge two states, with a chance below 1e-6 at ten
// million states.
func Explore(cfg Config, limit int) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	mm := newM(cfg)
	seed := maphash.MakeSeed()
	var buf []byte
	hash := func(s *State) uint64 {
		buf = encode(buf[:0], s)
		return maphash.Bytes(seed, buf)
	}
	res := Result{Config: cfg.Name, Events: map[string]int{}}
	init := mm.initial()
	mm.normalize(init)
	root := hash(init)
	seen := map[uint64]link{root: {parent: root, k: -1}}
	type node struct {
		s *State
		h uint64
	}
	level := []node{{init, root}}
	check := func(s *State) string {
		if s.Broken != "" {
			return s.Broken
		}
		if cfg.Faults.Pause == 0 { // a paused holder believes what it checked: assumption 3
			return mm.exclusion(s)
		}
		return ""
	}
	var bad uint64
	found := false
	for len(level) > 0 && !found {
		res.Depth++
		var nextLevel []node
		for _, x := range level {
			s, h := x.s, x.h
			for k, st := range mm.next(s) {
				res.Transitions++
				if st.S.event != "" {
					res.Events[st.S.event]++
				}
				hs := hash(st.S)
				if _, ok := seen[hs]; ok {
					continue
				}
				seen[hs] = link{parent: h, k: int32(k)}
				if v := check(st.S); v != "" {
					res.Violation, bad, found = v, hs, true
					break
				}
				if len(seen) >= limit {
					res.States, res.Elapsed = len(seen), time.Since(start)
					return res, nil
				}
				nextLevel = append(nextLevel, node{st.S, hs})
			}
			if found {
				break
			}
		}
		level = nextLevel
	}
	res.States, res.Complete, res.Elapsed = len(seen), !found, time.Since(start)
	if found {
		res.Trace = mm.trace(seen, root, bad, hash)
	}
	return res, nil
}

// trace replays the path from the initial state to bad and describes it.
func (mm *m) trace(seen map[uint64]link, root, bad uint64, hash func(*State) uint64) []string {
	var ks []int32
	for h := bad; h != root; h = seen[h].parent {
		ks = append(ks, seen[h].k)
	}
	s := mm.initial()
	mm.normalize(s)
	var out []string
	for j := len(ks) - 1; j >= 0; j-- {
		st := mm.next(s)[ks[j]]
		s = st.S
		if !strings.HasSuffix(st.Label, "waits") && !strings.Contains(st.Label, " now") {
			out = append(out, fmt.Sprintf("t=%d %s", s.T, st.Label))
		}
	}
	out = append(out, "state: "+mm.describe(s))
	return out
}

// describe summarises a state for a trace's end.
func (mm *m) describe(s *State) string {
	var b strings.Builder
	for i := range s.clients {
		c := &s.Client[i]
		fmt.Fprintf(&b, "client %d (%s): phase %c clock %d until %d ttl %d token %d lost %v believes %v; ",
			i, c.OwnerName, c.Phase, s.clock(i), c.Until, c.TTL, c.Token, c.Lost, mm.believes(s, i))
	}
	for n := range Nodes {
		fmt.Fprintf(&b, "node %d: %q; ", n, strings.ReplaceAll(strings.TrimSpace(s.Node[n].String()), "\n", ", "))
	}
	return b.String()
}
