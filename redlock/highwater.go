package redlock

import (
	"context"
	_ "embed"
	"slices"
	"strconv"
	"time"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The high-water mark (WithHighWater; the scheduler keys each job's
// scheduled times on one): a hash beside the lock's keys, raised by the
// acquire script all or nothing with them (scripts/highwater.lua). A mark
// at or above the acquisition's that another acquisition raised refuses
// the round; otherwise the mark is raised, keeping the one before for the
// undo of a failed attempt, which puts it back. The granted Lock reports
// the highest mark a quorum of its granting nodes replaced (PreviousMark).

//go:embed scripts/highwater.lua
var highWaterSrc string

var highWaterPart = script.Part{Name: "mark", Fixed: 1, Args: 2, Reply: 1, Refuses: true, Hooks: script.Parse(highWaterSrc)}

// highWater is the layer of a Lock acquired with WithHighWater.
type highWater struct {
	baseLayer
	name  string // the mark's resource name
	key   string
	at    string
	ttl   int64 // ms
	prev  int64 // PreviousMark, once held; guarded by the Lock's mu
	first bool  // WithHighWaterFirst
}

func newHighWater(c *Client, cfg *lockConfig, resources []string, _ bool) (layer, error) {
	switch {
	case cfg.mark == "" && cfg.markAt == 0 && cfg.markTTL == 0:
		return nil, nil
	case cfg.markAt <= 0:
		return nil, invalidf("mark %d (WithHighWater) is not positive", cfg.markAt)
	case cfg.markTTL < time.Millisecond:
		return nil, invalidf("mark TTL %v (WithHighWater) is below 1ms", cfg.markTTL)
	}
	taken := resources
	if cfg.record != "" {
		taken = append(slices.Clip(resources), cfg.record)
	}
	if err := checkAddedKey("WithHighWater", "mark", cfg.mark, taken, cfg.owner); err != nil {
		return nil, err
	}
	return &highWater{name: cfg.mark, key: c.cfg.keyPrefix + cfg.mark, at: strconv.FormatInt(cfg.markAt, 10),
		ttl: cfg.markTTL.Milliseconds(), first: cfg.markFirst}, nil
}

func (*highWater) part() script.Part { return highWaterPart }

func (h *highWater) keys([]string) []string { return []string{h.key} }

// args passes the mark and its TTL.
func (h *highWater) args(scriptKind, *attempt) []any { return []any{h.at, h.ttl} }

// reply reads the acquire reply {0, value, PTTL, I.mark, mark}: refused
// by the mark.
func (h *highWater) reply(_ *Lock, k scriptKind, lay *script.Layout, reply any) (NodeResult, bool) {
	v, _ := reply.([]any)
	i, ok := lay.Refusal("mark")
	if k != kindAcquire || !ok || len(v) != 5 || !allInts(v[2:]) || intAt(v, 3) != int64(i) {
		return NodeResult{}, false
	}
	holder, isString := v[1].(string)
	r := refusal(holder, time.Duration(intAt(v, 2))*time.Millisecond, h.name)
	r.HolderMark = intAt(v, 4)
	return r, isString
}

// granted gives the Lock the highest mark that a quorum of the granting
// nodes replaced (see PreviousMark).
func (h *highWater) granted(_ context.Context, a *attempt, lay *script.Layout, _ call, rs []NodeResult) *QuorumError {
	l := a.l
	at := lay.Reply("mark")
	var marks []int64
	for _, r := range rs {
		if r.Outcome == OutcomeOK {
			marks = append(marks, intAt(r.reply, at))
		}
	}
	slices.Sort(marks)
	var m int64
	if q := l.c.quorum; len(marks) >= q {
		m = marks[len(marks)-q] // the quorum-th highest
	}
	l.mu.Lock()
	h.prev = m
	l.mu.Unlock()
	return nil
}

// PreviousMark returns, for a Lock acquired with WithHighWater or
// WithHighWaterFirst, the highest mark that its acquisition replaced on a
// quorum of the nodes that granted it (0: none), read once held; 0 for
// any other Lock. A mark that fewer nodes held was raised by an
// acquisition that did not reach a quorum (its caller died between
// nodes, say), so it does not count: the mark's acquisition may never
// have been made, and a caller that reports the marks between
// PreviousMark and its own as unserved (package scheduler's misses)
// reports it too. Safe for concurrent use.
func (l *Lock) PreviousMark() int64 {
	h := layerOf[*highWater](l)
	if h == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return h.prev
}

// WithHighWater makes the acquisition also raise a high-water mark kept
// under the resource name record: on each node, in the same script and
// all or nothing with the lock's keys, a mark at or above at that another
// acquisition raised refuses the round (checked after a WithRecord record
// and before the lock's keys; the refused NodeResult's Resource names the
// record and its HolderMark gives the mark), and otherwise the mark is set
// to at, with this acquisition's value (its metadata is what a refused
// round's Holder shows), for ttl from now. The mark before is kept for an
// undo: a failed attempt puts it back where it raised it. A granted Lock
// reports the highest mark that a quorum of its granting nodes replaced
// (Lock.PreviousMark). A mark is
// never lowered, extended or deleted by Release; it expires ttl after its
// last raise. The scheduler keys each job's scheduled times on one.
//
// at must be positive; ttl at least 1 ms. ttl is a retention, not a lock
// TTL: it may exceed the restart gate (WithRestartGating), and a node that
// restarts empty forgets its marks, so a mark keeps a later acquisition at
// or below it out only while a quorum of nodes still has it: the caller
// bounds how late such an acquisition may come by the gate's maxTTL. The
// record obeys the rules of a resource name, must not be one of the lock's
// resources or its WithRecord record, and cannot be combined with
// WithOwner; a call that breaks a rule fails with ErrInvalidArgument. A
// LockOption only (Acquire, TryAcquire, Do): it names one acquisition's
// mark, so it does not compile as an option of New. Default: no mark.
func WithHighWater(record string, at int64, ttl time.Duration) LockOption {
	return callOption(func(l *lockConfig) { l.mark, l.markAt, l.markTTL, l.markFirst = record, at, ttl, false })
}

// WithHighWaterFirst is WithHighWater with one node asked first: each
// acquire round of the call asks the node that the lock's first key
// chooses by its place in the nodes given to New (the same for every
// caller of the same resources that lists the nodes in the same order),
// and a refusal there by the mark ends the round: the mark says that another
// acquisition took this mark or a later one, so the other nodes are not
// asked (OutcomePending, "not asked") and the round's QuorumError names
// that node's holder (HolderMetadata) as a quorum's would. On any other
// answer from that node (a grant, a refusal by the lock's keys, an
// error) the round asks the others at once, and at half the node timeout
// when it is still silent (the hedge); when it is known down (it has not
// answered since a call timed out) the round asks every node at once.
// Only a call's first attempt takes that refusal as final: Acquire's and
// Do's retries ask the others after any answer of the node asked first,
// since that node may hold a failed attempt's mark, soon undone.
//
// Contenders for the same mark that start at the same instant cost one
// command each but the first to reach that node, instead of one per node:
// that node orders them. Exclusion is unchanged: the lock is held when a
// quorum granted within the validity, counted as for every round, and a
// node asked later is one whose request was delayed. What it gives up is
// liveness in one case: an acquisition that raised the mark on the first
// node and then failed on the others (its process died, or every retry
// failed before its deadline) leaves the mark there, and callers refused
// by it do not try the others; the mark's acquisition is then made by
// no one. An acquisition that fails on the others undoes the first node,
// putting its mark back, and retries as any round does; a process that
// died sends no undo, and the next acquisition that node grants reads
// its mark there as PreviousMark (package scheduler reports such a
// scheduled time as missed only when the undo put the mark back). Its order replaces
// WithQuorumFirst's. A winner's round takes two round trips instead of
// one. A LockOption only; its arguments and rules are WithHighWater's,
// and the last of the two given applies.
func WithHighWaterFirst(record string, at int64, ttl time.Duration) LockOption {
	return callOption(func(l *lockConfig) { l.mark, l.markAt, l.markTTL, l.markFirst = record, at, ttl, true })
}

// order returns, with WithHighWaterFirst, the asking order of one acquire
// round: one node first, and a refusal there by the mark is final
// (quorumfirst.go); nil otherwise.
func (h *highWater) order() askingOrder {
	if !h.first {
		return nil
	}
	return &quorumFirst{ask: 1, final: refusedByMark}
}

// refusedByMark reports whether r is a refusal by a high-water mark.
func refusedByMark(r NodeResult) bool { return r.HolderMark != 0 }
