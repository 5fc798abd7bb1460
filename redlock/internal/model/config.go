package model

import "fmt"

// Config is one configuration to explore: the nodes, the clients and
// what they do, the timing, the faults allowed and the bugs put back.
// Times are in ticks; a tick is a millisecond of the scripts (PX, TIME).
type Config struct {
	Name    string
	Clients []ClientSpec // at most MaxClients

	TTL            int64   // an Acquire's TTL, unless its client has its own
	LongTTL        int64   // a holder's Extend picks TTL or LongTTL (the restart gate, when gated)
	ExtendTTLs     []int64 // ... or one of these, when set
	NodeTimeout    int64   // a round waits this long for each node
	DriftFactorPct int64   // drift = TTL x DriftFactorPct / 100 + DriftConst (redlock: 1% + 2 ms)
	DriftConst     int64
	MinValidityPct int64 // a grant must leave this share of the TTL (redlock: 50)
	Gate           int64 // WithRestartGating(Gate); 0 for off
	Fencing        bool  // WithFencing
	NodeOffsets    [Nodes]int64
	Horizon        int64 // real time explored, in ticks

	Faults Faults
	Bugs   Bugs
}

// Nodes is the number of Redis nodes; Quorum is N/2 + 1.
const (
	Nodes      = 3
	Quorum     = Nodes/2 + 1
	MaxClients = 3
)

// ClientSpec is what one client does: Holds acquisitions, one after the
// other, each with at most Attempts attempts; while it holds, at most
// Extends Extends of its own (to TTL or LongTTL), under Keep (Do) or
// not, and, with Writes, guarded writes to the protected resource (a
// check of its validity, then the write).
type ClientSpec struct {
	Owner    string // WithOwner: clients with one owner share its token (reentrant holds); "" for none
	TTL      int64  // its Acquire's TTL; 0 for the Config's
	Holds    int
	Attempts int
	Extends  int
	Keep     bool
	Writes   bool
	// QuorumFirst: its acquire rounds ask a quorum of the nodes first
	// (WithQuorumFirst; quorumfirst.go).
	QuorumFirst bool
	// OneFirst: its acquire rounds ask node 0 first and the others on
	// its answer (WithHighWaterFirst); with FinalRefusal a refusal there
	// ends a first attempt's round, as a refusal by the high-water mark
	// does (the model has no mark: every refusal stands for one); without
	// it, and in a retry, a refusal there asks the others, as a refusal
	// by a lock key does.
	OneFirst, FinalRefusal bool
	// Start is the first tick at which it may acquire. Eager makes it
	// acquire at Start and retry at the next tick after a failed attempt,
	// rather than at any time: a directed run for the timing of one
	// trace, with every interleaving and fault around it.
	Start int64
	Eager bool
	// ExtendAt, when set, gives the ticks of its Extends (the first at
	// ExtendAt[0], ...), for a directed run.
	ExtendAt []int64
}

// Faults bounds the faults of one run: how many of each may happen.
type Faults struct {
	Loss  int // a message (request or reply) is lost
	Delay int // a message is held back: it arrives at any later time
	// DelayAfter > 0: only requests sent at or after this tick are held
	// back, not answers (a directed run: the slow link starts then).
	DelayAfter int64
	Reorder    int // a request overtakes an earlier one of its client to its node (a new connection)
	Restart    int // a node restarts without its data
	Pause      int // a client process pauses (GC, stopped VM) for any time between its validity check and its write
	// DriftEvery > 0 lets clocks drift: every DriftEvery ticks of real
	// time, the nodes in FastNodes gain a tick and the clients in
	// SlowClients lose one (the directions that hurt safety).
	DriftEvery  int64
	FastNodes   [Nodes]bool
	SlowClients [MaxClients]bool
}

// Bugs puts back historical bugs, each as the code was before its fix.
type Bugs struct {
	// LowerTTL: the extend script sets the key's TTL to the extension's,
	// also lowering it (before d2aa13a, for non-reentrant locks).
	LowerTTL bool
	// UntilBeforeSend: an Extend that shortens the lock moves Until and
	// TTL to its own start + ttl - drift before it sends, and leaves them
	// when no quorum confirms (3fa561e, reverted by d2aa13a).
	UntilBeforeSend bool
	// KeepStale: Keep sleeps on the Until it read after its own last
	// extension and extends by the TTL it was started with, blind to the
	// holder's Extends (before 0a4d888).
	KeepStale bool
	// ExtendPastGate: Extend takes a TTL above the restart gate (before
	// cdb64f8; TestExtendObeysTheRestartGate).
	ExtendPastGate bool
	// NoClockFloor: a fencing token is 1 + the largest counter, without
	// the nodes' clock as a floor (before cdb64f8).
	NoClockFloor bool
}

// drift is the drift allowance of ttl (redlock's Client.drift).
func (c *Config) drift(ttl int64) int64 { return ttl*c.DriftFactorPct/100 + c.DriftConst }

// acquireTTL is client i's Acquire TTL.
func (c *Config) acquireTTL(i int) int64 {
	if t := c.Clients[i].TTL; t > 0 {
		return t
	}
	return c.TTL
}

// extendTTLs are the TTLs a holder's Extend may pick: CheckTTL rejects
// one above the restart gate, unless Bugs.ExtendPastGate.
func (c *Config) extendTTLs() []int64 {
	ttls := c.ExtendTTLs
	if ttls == nil {
		ttls = []int64{c.TTL, c.LongTTL}
		if c.LongTTL == c.TTL {
			ttls = ttls[:1]
		}
	}
	if c.Bugs.ExtendPastGate {
		ttls = append(ttls[:len(ttls):len(ttls)], 2*c.Gate)
	}
	return ttls
}

// validate rejects configurations the model does not cover.
func (c *Config) validate() error {
	switch {
	case len(c.Clients) == 0 || len(c.Clients) > MaxClients:
		return fmt.Errorf("model: %d clients, want 1 to %d", len(c.Clients), MaxClients)
	case c.TTL <= 0 || c.LongTTL < c.TTL || c.NodeTimeout <= 0 || c.Horizon <= 0:
		return fmt.Errorf("model: bad times: TTL %d, LongTTL %d, node timeout %d, horizon %d", c.TTL, c.LongTTL, c.NodeTimeout, c.Horizon)
	case c.Gate > 0 && c.LongTTL > c.Gate:
		return fmt.Errorf("model: LongTTL %d above the restart gate %d (CheckTTL rejects it)", c.LongTTL, c.Gate)
	}
	for i := range c.Clients {
		if ttl := c.acquireTTL(i); (ttl-c.drift(ttl))*100 <= ttl*c.MinValidityPct || c.Gate > 0 && ttl > c.Gate {
			return fmt.Errorf("model: client %d's TTL %d leaves no more than the minimum validity after drift %d, or is above the gate", i, ttl, c.drift(ttl))
		}
	}
	return nil
}
