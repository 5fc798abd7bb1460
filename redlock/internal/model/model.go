package model

import (
	"fmt"
	"slices"
)

// State is one state of the system: real time, the nodes' key spaces and
// clocks, the clients, the messages in flight, the faults left, and ghost
// variables that only the properties read.
type State struct {
	T       int64 // real time, ticks
	Stage   int   // the stage of the tick (explore.go)
	Cursor  int   // the client or node the stage is at
	Node    [Nodes]Store
	Client  [MaxClients]Client
	Net     []Msg // in flight, in the order sent
	Left    Faults
	Ghost   Ghost
	Broken  string // a property a transition broke ("" while none)
	clients int
	event   string // what the last transition did that the explorer tallies (not state)
}

// Client is one client process: the redlock Client and the one Lock it
// acquires, holds and releases, with Keep when its spec says so.
type Client struct {
	Lag    int64 // real time - the client's monotonic clock (DriftEvery)
	Phase  Phase
	Paused bool

	Holds, Attempts, Extends int // used
	Seq                      int // attempts made: each has its own value or acquisition ID
	Value, Aid               string

	// The lock (lock.go): T1 of the attempt, the TTL and Until once held,
	// the fencing token.
	T1, TTL, Until, Token int64
	Lost                  bool // held, known lost (Keep or an Extend found it)

	// The round the client waits for: one at a time (Extend and Release
	// of a Lock are serialised; an attempt's rounds follow each other).
	Round                Round
	AcqOK, AcqSkip       [Nodes]bool // the attempt's acquire round: granted; answered held or gated, or never asked (undo skips)
	Tok, Largest, Kept   int64       // the attempt's fencing figures (fencing.go)
	ExtStart, ExtTTL     int64       // the Extend in its round
	ExtByKeep            bool
	KeepDue              bool  // Keep's extension waits behind the holder's Extend
	KeepFailed           bool  // Keep's last extension failed (nodes)
	KeepRetry            int64 // ... and retries then
	KeepUntil, KeepTTL   int64 // KeepStale: what Keep read after its own last extension
	InCS                 bool  // checked its validity, the write not done yet: paused in between (Writes)
	Wrote                bool  // wrote in this hold (one write per hold)
	Ended                byte  // how its last hold ended: 'r' released within its validity, 'x' after it
	G                    int   // ghost: which grant this hold is (1, 2, ...)
	SeenTok              int64 // ghost: largest token granted before this attempt started
	SeenOwner, OwnerName string
}

// Phase is where a client is.
type Phase byte

const (
	Idle    Phase = 'i' // no lock; may acquire
	Waiting Phase = 'w' // an attempt's round is out
	Backoff Phase = 'b' // between attempts
	Held    Phase = 'h' // holds the lock (Until may have passed)
	Done    Phase = 'd' // stopped: all holds made, or the process died
)

// Round is the round a client waits for.
type Round struct {
	Kind   byte  // 'a' acquire, 'c' check, 'f' fence, 'n' note, 'x' extend; 0 for none
	Seq    int   // replies of older rounds are ignored
	End    int64 // the client's clock at which the round stops waiting
	Res    [Nodes]Reply
	Answer int         // answers so far (with the unasked nodes)
	Held   [Nodes]bool // nodes held back, not asked yet (quorumfirst.go)
}

// Reply is one node's answer in a round.
type Reply struct {
	Out             byte // 'O' ok, 'H' held (another owner, or not ours), 'R' regained (extend), 'G' gated, 'U' never asked (quorum first); 0 none yet
	R1, R2, R3      int64
	From, Delivered bool
}

// Msg is a request to a node or its reply.
type Msg struct {
	C, N  int
	Reply bool
	Held  bool  // delayed: may arrive at any later time
	Sent  int64 // real time it was sent
	Seq   int   // the round; 0 for cleanups nobody waits for
	Kind  byte  // 'a', 'x', 'r' release, 'u' undo, 'f', 'c', 'n'
	TTL   int64
	Value string
	Aid   string
	Tok   int64
	Ans   Reply // a reply's answer
}

// Ghost holds what the properties need and no client can see.
type Ghost struct {
	Grants   int     // successful acquisitions so far (kept when clients write)
	MaxTok   int64   // largest fencing token granted
	MaxOwner string  // ... to whom
	Issued   []Issue // every grant's token (no two owners share one)
	StoreG   int     // the protected resource: grant of the newest write accepted
	StoreTok int64   // ... and the largest token it accepted
}

// Issue is a fencing token granted to an owner.
type Issue struct {
	Tok   int64
	Owner string
}

// clock is client i's monotonic clock.
func (s *State) clock(i int) int64 { return s.T - s.Client[i].Lag }

// Clone copies s. The nodes' key spaces are shared until one is written
// (execute clones the store it runs a script on).
func (s *State) Clone() *State {
	c := *s
	c.Net = slices.Clone(s.Net)
	c.Ghost.Issued = slices.Clone(s.Ghost.Issued)
	return &c
}

// m is a model run: a configuration and its lock's key layout.
type m struct {
	cfg    Config
	lock   [MaxClients]LockSpec
	writes bool // some client writes to the protected resource
}

func newM(cfg Config) *m {
	mm := &m{cfg: cfg}
	for i, cs := range cfg.Clients {
		mm.lock[i] = LockSpec{Resources: []string{"r"}, Reentrant: cs.Owner != "", Fencing: cfg.Fencing, Gate: cfg.Gate}
		mm.writes = mm.writes || cs.Writes
	}
	return mm
}

// initial is the state at time 0: empty nodes whose restart gate has
// passed (a running fleet), idle clients.
func (mm *m) initial() *State {
	s := &State{clients: len(mm.cfg.Clients), Left: mm.cfg.Faults}
	for i := range s.Node {
		s.Node[i].Now = 1000 + mm.cfg.NodeOffsets[i]
		if mm.cfg.Gate > 0 {
			s.Node[i].Set(gateName, itoa(s.Node[i].Now-mm.cfg.Gate-1000), 0, false)
		}
	}
	for i, cs := range mm.cfg.Clients {
		c := &s.Client[i]
		c.Phase = Idle
		c.OwnerName = cs.Owner
		if c.OwnerName == "" {
			c.OwnerName = fmt.Sprintf("c%d", i)
		}
	}
	return s
}

// believes reports whether client i believes it holds the lock: a Keep
// holder while its kept context is live, any other holder while its
// clock is before Until, and a holder that checked its validity until it
// has written (a pause may come in between).
func (mm *m) believes(s *State, i int) bool {
	c := &s.Client[i]
	switch {
	case c.InCS:
		return true
	case c.Phase != Held || c.Lost:
		return false
	case mm.cfg.Clients[i].Keep:
		return true // until Keep cancels it (lose)
	}
	return s.clock(i) < c.Until
}

// exclusion is the first property: no two owners believe they hold the
// lock at the same real time. It returns the violation, or "".
func (mm *m) exclusion(s *State) string {
	var who []string
	for i := range s.clients {
		if mm.believes(s, i) {
			if o := s.Client[i].OwnerName; !slices.Contains(who, o) {
				who = append(who, o)
			}
		}
	}
	if len(who) > 1 {
		return fmt.Sprintf("two holders at once: %v", who)
	}
	return ""
}

// send queues a request of client i to node n.
func (s *State) send(i, n int, msg Msg) {
	msg.C, msg.N, msg.Sent = i, n, s.T
	s.Net = append(s.Net, msg)
}

// broadcast sends a request to every node not skipped.
func (s *State) broadcast(i int, skip [Nodes]bool, msg Msg) {
	for n := range Nodes {
		if !skip[n] {
			s.send(i, n, msg)
		}
	}
}

// startRound sends a round's request to every node, or to a quorum of
// them first (quorumfirst.go), and waits for it.
func (mm *m) startRound(s *State, i int, kind byte, end int64, msg Msg) {
	c := &s.Client[i]
	c.Seq++
	c.Round = Round{Kind: kind, Seq: c.Seq, End: end}
	if mm.quorumFirst(i, kind) {
		c.Round.Held = holdBack(mm.cfg.Clients[i].OneFirst)
	}
	msg.Seq, msg.Kind = c.Seq, kind
	s.broadcast(i, c.Round.Held, msg)
}

// startAttempt is acquire.go's attempt, up to its round: a new value (or
// acquisition ID), T1, the acquire script on every node.
func (mm *m) startAttempt(s *State, i int) {
	c := &s.Client[i]
	c.Attempts++
	c.Phase = Waiting
	name := fmt.Sprintf("c%d.%d", i, c.Seq+1)
	if mm.cfg.Clients[i].Owner != "" {
		c.Value, c.Aid = Value(mm.cfg.Clients[i].Owner, ""), name
	} else {
		c.Value, c.Aid = Value(name, ""), ""
	}
	c.T1, c.TTL, c.Lost = s.clock(i), mm.cfg.acquireTTL(i), false
	c.AcqOK, c.AcqSkip = [Nodes]bool{}, [Nodes]bool{}
	c.SeenTok, c.SeenOwner = s.Ghost.MaxTok, s.Ghost.MaxOwner
	mm.startRound(s, i, 'a', c.T1+mm.cfg.NodeTimeout, Msg{TTL: c.TTL, Value: c.Value, Aid: c.Aid})
}

// call returns the script call of a request (the client's arguments).
func (mm *m) call(s *State, msg Msg) Call {
	l := mm.lock[msg.C]
	switch msg.Kind {
	case 'a':
		return l.AcquireCall(msg.Value, msg.Aid, msg.TTL)
	case 'x':
		return l.ExtendCall(msg.Value, msg.Aid, msg.TTL)
	case 'r', 'u':
		return l.ReleaseCall(msg.Value, msg.Aid, msg.Kind == 'u', nil)
	case 'f':
		return l.FenceCall(msg.Tok, 7*24*3600*1000)
	case 'c':
		return l.CheckCall(msg.Tok)
	case 'n':
		return l.NoteCall(msg.Tok, msg.Aid)
	}
	panic("model: bad request kind")
}

// execute runs a request on its node and returns the answer, read as
// round.go's parsers read it.
func (mm *m) execute(s *State, msg Msg) Reply {
	s.Node[msg.N] = s.Node[msg.N].Clone()
	st := &s.Node[msg.N]
	c := mm.call(s, msg)
	r := c.Run(st)
	ints := func(v any) []int64 {
		var out []int64
		for _, x := range v.([]any) {
			n, _ := x.(int64)
			out = append(out, n)
		}
		return out
	}
	switch msg.Kind {
	case 'a':
		return mm.acquireReply(c, ints(r))
	case 'x':
		return mm.extendReply(st, c, msg, r)
	case 'c':
		v := ints(r)
		if v[0] == 1 {
			return Reply{Out: 'O', R2: v[1]}
		}
		return Reply{Out: 'H', R2: v[1]}
	case 'f', 'r', 'u':
		if r.(int64) == 1 {
			return Reply{Out: 'O'}
		}
		return Reply{Out: 'H'}
	}
	return Reply{Out: 'O'} // note
}

// acquireReply reads the acquire script's reply v to call c.
func (mm *m) acquireReply(c Call, v []int64) Reply {
	switch v[0] {
	case 1:
		rep := Reply{Out: 'O'}
		if mm.cfg.Fencing {
			at := c.Layout().Reply("fencing")
			rep.R1, rep.R2, rep.R3 = v[at], v[at+1], v[at+2]
			if mm.cfg.Bugs.NoClockFloor {
				rep.R1 = v[at+1] + 1
			}
		}
		return rep
	case 2:
		return Reply{Out: 'G'}
	}
	return Reply{Out: 'H'}
}

// extendReply reads the extend script's reply r to call c (msg) on st.
func (mm *m) extendReply(st *Store, c Call, msg Msg, r any) Reply {
	if v, ok := r.([]any); ok && v[0] == int64(2) {
		return Reply{Out: 'G'}
	}
	switch r.(int64) {
	case 1, 3:
		if mm.cfg.Bugs.LowerTTL && !mm.lock[msg.C].Reentrant {
			st.PExpire(c.Keys[0], msg.TTL)
		}
		if r.(int64) == 3 {
			return Reply{Out: 'R'}
		}
		return Reply{Out: 'O'}
	}
	return Reply{Out: 'H'}
}

// count returns how many answers of r are out.
func count(r *Round, out byte) int {
	k := 0
	for _, x := range r.Res {
		if x.Out == out {
			k++
		}
	}
	return k
}

// decided reports whether a round's outcome is known (round.go's decide):
// a quorum of OK answers, so many others that no quorum is possible, or
// every answer.
func decided(r *Round) bool {
	ok := count(r, 'O')
	return ok >= Quorum || r.Answer-ok > Nodes-Quorum || r.Answer == Nodes
}

// answer gives client i a node's answer to its round, and moves it on
// once the round is decided.
func (mm *m) answer(s *State, i int, msg Msg) {
	c := &s.Client[i]
	if c.Round.Kind == 0 || msg.Seq != c.Round.Seq || c.Round.Res[msg.N].Out != 0 {
		return // a late answer to a decided round
	}
	c.Round.Res[msg.N] = msg.Ans
	c.Round.Answer++
	mm.answered(s, i, msg.N) // may ask the nodes held back, or give them up
	if decided(&c.Round) {
		mm.finish(s, i)
	}
}

// timers runs what client i's clock makes due: a round's end, Keep's
// timers. Paused clients run nothing.
func (mm *m) timers(s *State, i int) {
	c := &s.Client[i]
	if c.Paused || c.Phase == Done {
		return
	}
	mm.hedge(s, i)
	if c.Round.Kind != 0 && s.clock(i) >= c.Round.End {
		mm.finish(s, i)
	}
	if c.Phase == Held && !c.Lost && mm.cfg.Clients[i].Keep {
		mm.keep(s, i)
	}
}

// finish ends client i's round with the answers it has and goes on with
// the attempt or the Extend.
func (mm *m) finish(s *State, i int) {
	c := &s.Client[i]
	r := c.Round
	c.Round = Round{}
	switch r.Kind {
	case 'a':
		mm.acquired(s, i, &r)
	case 'c':
		mm.checked(s, i, &r)
	case 'f':
		switch {
		case count(&r, 'O') < Quorum:
			mm.fail(s, i)
		case c.Aid != "":
			mm.startRound(s, i, 'n', s.clock(i)+mm.cfg.NodeTimeout, Msg{Tok: c.Tok, Aid: c.Aid})
		default:
			mm.grant(s, i)
		}
	case 'n':
		mm.grant(s, i)
	case 'x':
		mm.extended(s, i, &r)
	}
}

// acquired goes on after client i's acquire round r: the undo, the
// grant, or fencing's check or fence round.
func (mm *m) acquired(s *State, i int, r *Round) {
	c := &s.Client[i]
	for n, x := range r.Res {
		c.AcqOK[n] = x.Out == 'O'
		c.AcqSkip[n] = x.Out == 'H' || x.Out == 'G' || x.Out == 'U' || r.Held[n] // held back at the end: never asked
	}
	if count(r, 'O') < Quorum {
		mm.fail(s, i)
		return
	}
	if !mm.cfg.Fencing {
		mm.grant(s, i)
		return
	}
	c.Tok, c.Largest, c.Kept = 0, 0, 0
	for _, x := range r.Res {
		if x.Out == 'O' {
			c.Tok, c.Largest, c.Kept = max(c.Tok, x.R1), max(c.Largest, x.R2), max(c.Kept, x.R3)
		}
	}
	if c.Kept > 0 && c.Largest <= c.Kept {
		mm.startRound(s, i, 'c', s.clock(i)+mm.cfg.NodeTimeout, Msg{Tok: c.Kept})
		return
	}
	mm.fence(s, i)
}

// checked goes on after client i's check round r (a kept token).
func (mm *m) checked(s *State, i int, r *Round) {
	c := &s.Client[i]
	switch {
	case count(r, 'O') >= Quorum:
		c.Tok = c.Kept
		mm.grant(s, i)
		return
	case count(r, 'H') == 0:
		mm.fail(s, i)
		return
	}
	for _, x := range r.Res {
		if x.Out == 'O' || x.Out == 'H' {
			c.Tok = max(c.Tok, x.R2+1)
		}
	}
	mm.fence(s, i)
}

// fence sends the fence round of the attempt's token.
func (mm *m) fence(s *State, i int) {
	c := &s.Client[i]
	mm.startRound(s, i, 'f', s.clock(i)+mm.cfg.NodeTimeout, Msg{Tok: c.Tok})
}

// grant ends a successful round: the validity check of attempt, then the
// lock is held (or the weak grant is undone).
func (mm *m) grant(s *State, i int) {
	c := &s.Client[i]
	v := c.TTL - (s.clock(i) - c.T1) - mm.cfg.drift(c.TTL)
	if v <= 0 || v*100 < c.TTL*mm.cfg.MinValidityPct {
		mm.fail(s, i)
		return
	}
	c.Phase, c.Until, c.Extends = Held, c.T1+c.TTL-mm.cfg.drift(c.TTL), 0
	c.KeepFailed, c.KeepDue, c.KeepUntil, c.KeepTTL = false, false, c.Until, c.TTL
	if !mm.cfg.Fencing {
		c.Tok = 0
	}
	c.Token = c.Tok
	g := &s.Ghost
	if mm.writes {
		g.Grants++
		c.G = g.Grants
	}
	for j := range s.clients {
		o := &s.Client[j]
		switch {
		case o.OwnerName == c.OwnerName:
		case o.Phase == Held || o.Ended == 'x':
			s.event = "taken after another owner's lock expired"
		case o.Ended == 'r' && s.event == "":
			s.event = "taken after another owner released"
		}
	}
	if mm.cfg.Fencing {
		checkToken(s, c)
	}
	c.Tok, c.Largest, c.Kept = 0, 0, 0
}

// checkToken checks the fencing token of c's grant against every token
// granted before (the ghost state) and records it.
func checkToken(s *State, c *Client) {
	g := &s.Ghost
	if c.Token < c.SeenTok || c.Token == c.SeenTok && c.SeenOwner != c.OwnerName {
		s.Broken = fmt.Sprintf("fencing token %d of %s not above %d, granted to %s before its attempt began", c.Token, c.OwnerName, c.SeenTok, c.SeenOwner)
	}
	for _, x := range g.Issued {
		if x.Tok == c.Token && x.Owner != c.OwnerName {
			s.Broken = fmt.Sprintf("fencing token %d granted to %s and to %s", x.Tok, x.Owner, c.OwnerName)
		}
	}
	g.Issued = append(g.Issued, Issue{c.Token, c.OwnerName})
	if c.Token > g.MaxTok {
		g.MaxTok, g.MaxOwner = c.Token, c.OwnerName
	}
}

// fail undoes a failed attempt on every node that may have granted, and
// backs off (or gives the acquisition up after its last attempt).
func (mm *m) fail(s *State, i int) {
	c := &s.Client[i]
	if c.AcqSkip != [Nodes]bool{true, true, true} {
		s.broadcast(i, c.AcqSkip, Msg{Kind: 'u', Value: c.Value, Aid: c.Aid})
	}
	c.Tok, c.Largest, c.Kept = 0, 0, 0
	if c.Attempts < mm.cfg.Clients[i].Attempts {
		c.Phase = Backoff
		return
	}
	mm.endHold(s, i, 0)
}

// endHold ends an acquisition: given up, released or abandoned.
func (mm *m) endHold(s *State, i int, how byte) {
	c := &s.Client[i]
	if how != 0 {
		c.Ended = how
	}
	c.Phase, c.Attempts, c.Lost, c.InCS, c.Wrote = Idle, 0, false, false, false
	c.Holds++
	if c.Holds >= mm.cfg.Clients[i].Holds {
		c.Phase = Done
	}
}

// extend is lock.go's extend up to its round; byKeep extends by the
// Lock's TTL as it is then (Keep), or by Keep's own under KeepStale.
func (mm *m) extend(s *State, i int, ttl int64, byKeep bool) {
	c := &s.Client[i]
	now := s.clock(i)
	if now >= c.Until { // checkHeld
		mm.lose(s, i)
		return
	}
	if byKeep {
		ttl = c.TTL
		if mm.cfg.Bugs.KeepStale {
			ttl = mm.cfg.acquireTTL(i)
		}
	}
	if mm.cfg.Bugs.UntilBeforeSend {
		if u := now + ttl - mm.cfg.drift(ttl); u < c.Until {
			c.Until, c.TTL = u, ttl
		}
	}
	c.ExtStart, c.ExtTTL, c.ExtByKeep = now, ttl, byKeep
	mm.startRound(s, i, 'x', min(now+mm.cfg.NodeTimeout, c.Until), Msg{TTL: ttl, Value: c.Value, Aid: c.Aid})
}

// extended is lock.go's extended: the outcome of an extend round.
func (mm *m) extended(s *State, i int, r *Round) {
	c := &s.Client[i]
	ok, notOurs := count(r, 'O'), count(r, 'H')+count(r, 'R')
	lost := false
	switch {
	case c.Lost:
		lost = true
	case ok >= Quorum:
		if c.ExtTTL-(s.clock(i)-c.ExtStart)-mm.cfg.drift(c.ExtTTL) <= 0 {
			lost = true
			break
		}
		c.Until, c.TTL = c.ExtStart+c.ExtTTL-mm.cfg.drift(c.ExtTTL), c.ExtTTL
		if c.ExtByKeep || !mm.cfg.Bugs.KeepStale {
			c.KeepUntil, c.KeepTTL = c.Until, c.TTL
		}
		if c.ExtByKeep {
			c.KeepFailed = false
		}
	case notOurs > Nodes-Quorum:
		lost = true
	case s.clock(i) >= c.Until:
		lost = true
	case c.ExtByKeep:
		c.KeepFailed, c.KeepRetry = true, s.clock(i)+max(c.TTL/10, 1)
	}
	if lost {
		var skip [Nodes]bool
		for n, x := range r.Res {
			skip[n] = x.Out != 'R'
		}
		if skip != [Nodes]bool{true, true, true} {
			s.broadcast(i, skip, Msg{Kind: 'r', Value: c.Value, Aid: c.Aid})
		}
		mm.lose(s, i)
	}
	if c.KeepDue && !c.Lost {
		c.KeepDue = false
		mm.extend(s, i, 0, true)
	}
}

// lose marks the lock lost: a Keep holder's context is cancelled.
func (mm *m) lose(s *State, i int) {
	c := &s.Client[i]
	c.Lost, c.KeepDue = true, false
}

// keep is keepAlive and extendKept: extend every TTL/3, give up at Until
// - TTL/10, retry every TTL/10 after a failure. Under KeepStale it reads
// Until and TTL as they were after its own last extension.
func (mm *m) keep(s *State, i int) {
	c := &s.Client[i]
	until, ttl := c.Until, c.TTL
	if mm.cfg.Bugs.KeepStale {
		until, ttl = c.KeepUntil, c.KeepTTL
	}
	now := s.clock(i)
	if now >= until-ttl/10 {
		mm.lose(s, i)
		return
	}
	if c.KeepDue || c.Round.Kind == 'x' && c.ExtByKeep {
		return // Keep's extension is out, or waits for the holder's
	}
	next := until + ttl/3 - ttl // the last extension's start + TTL/3
	if c.KeepFailed {
		next = c.KeepRetry
	}
	switch {
	case now < next:
	case c.Round.Kind == 'x':
		c.KeepDue = true // waits for the Lock's op mutex: the holder's Extend is out
	default:
		mm.extend(s, i, 0, true)
	}
}
