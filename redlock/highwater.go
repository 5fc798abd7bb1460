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
// the highest mark it replaced (PreviousMark).

//go:embed scripts/highwater.lua
var highWaterSrc string

var highWaterPart = script.Part{Name: "mark", Fixed: 1, Args: 2, Reply: 1, Refuses: true, Hooks: script.Parse(highWaterSrc)}

// highWater is the layer of a Lock acquired with WithHighWater.
type highWater struct {
	baseLayer
	name   string // the mark's resource name
	key    string
	at     string
	ttl    int64 // ms
	prev   int64 // PreviousMark, once held; guarded by the Lock's mu
	first  bool  // WithHighWaterFirst
	rounds int   // acquire rounds ordered so far (order)
}

// maxMark is the largest mark WithHighWater takes: 2^53, above which a
// double (Lua's number, in which the nodes compare marks) skips integers.
const maxMark = 1 << 53

func newHighWater(c *Client, cfg *lockConfig, resources []string, _ bool) (layer, error) {
	switch {
	case cfg.mark == "" && cfg.markAt == 0 && cfg.markTTL == 0:
		return nil, nil
	case cfg.markAt <= 0:
		return nil, invalidf("mark %d (WithHighWater) is not positive", cfg.markAt)
	case cfg.markAt > maxMark:
		return nil, invalidf("mark %d (WithHighWater) is above 2^53: the nodes' Lua compares marks as doubles, which lose such integers", cfg.markAt)
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

// granted gives the Lock the highest mark that the granting nodes
// replaced.
func (h *highWater) granted(_ context.Context, a *attempt, lay *script.Layout, _ call, rs []NodeResult) *QuorumError {
	l := a.l
	at := lay.Reply("mark")
	var m int64
	for _, r := range rs {
		if r.Outcome == OutcomeOK {
			m = max(m, intAt(r.reply, at))
		}
	}
	l.mu.Lock()
	h.prev = m
	l.mu.Unlock()
	return nil
}

// PreviousMark returns, for a Lock acquired with WithHighWater or
// WithHighWaterFirst, the highest mark that its acquisition replaced on
// the nodes that granted it and answered before the round was decided
// (0: none), read once held; 0 for any other Lock. A mark that one of
// them held counts, also one raised by an acquisition that never reached
// a quorum (its caller died between nodes): a round decided at a quorum
// of grants cannot tell that from a node that missed the raise of an
// acquisition that did. Safe for concurrent use.
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
// reports the highest mark it replaced (Lock.PreviousMark). A mark is
// never lowered, extended or deleted by Release; it expires ttl after its
// last raise. The scheduler keys each job's scheduled times on one.
//
// at must be positive and at most 2^53 (the nodes' Lua compares marks as
// doubles: a Unix time in milliseconds fits, one in nanoseconds does
// not); ttl at least 1 ms. ttl is a retention, not a lock
// TTL: it may exceed the restart gate (WithRestartGating), and a node that
// restarts empty forgets its marks, so a mark keeps a later acquisition at
// or below it out only while a quorum of nodes still has it: the caller
// bounds how late such an acquisition may come by the gate's maxTTL. The
// record obeys the rules of a resource name, must not be one of the lock's
// resources or its WithRecord record, and cannot be combined with
// WithOwner; a call that breaks a rule fails with ErrInvalidArgument. A
// LockOption only (Acquire, TryAcquire, Do): it names one acquisition's
// mark, so it does not compile as an option of New. Of WithHighWater and
// WithHighWaterFirst, the last given applies. Default: no mark.
func WithHighWater(record string, at int64, ttl time.Duration) LockOption {
	return callOption(func(l *lockConfig) { l.mark, l.markAt, l.markTTL, l.markFirst = record, at, ttl, false })
}

// WithHighWaterFirst is WithHighWater with one node asked first: each
// acquire round of the call asks the node that the lock's first key
// chooses by its place in the nodes given to New (the same for every
// caller of the same resources that lists the nodes in the same order)
// before the others, a departure from step 2 of the redis.io distlock
// page, which asks the nodes one after the other with the advice to ask
// them all at once (multiplexing), as every other round does. In the
// call's first round a refusal there by the mark ends the round: the
// mark says that another acquisition took this mark or a later one, so
// the other nodes are not asked (OutcomePending, "not asked") and the
// round's *QuorumError matches ErrNotAcquired, not ErrUnavailable, and
// names that node's holder (HolderMetadata) as a quorum's would. On any other answer from
// that node (a grant, a refusal by the lock's keys, an error) the round
// asks the others at once, and at half the node timeout when it is
// still silent (the hedge); when it is known down (it has not answered
// since a call timed out) the round asks every node at once. Acquire's
// and Do's retries ask that node first too but never take its refusal
// as final: it may hold a failed attempt's mark, soon undone. So the
// saving is in the first round: Acquire without WithRetryIf retries
// after a final refusal, asking every node.
//
// Contenders for the same mark that start at the same instant cost one
// command each but the first to reach that node, instead of one per node:
// that node orders them. Exclusion is unchanged: the lock is held when a
// quorum granted within the validity, counted as for every round, and a
// node asked later is one whose request was delayed. What it gives up is
// liveness in one case: an acquisition that raised the mark on the first
// node and then did not reach the others (its process died or lost the
// network, every retry failed before its deadline, or its ctx ended)
// leaves the mark there until its undo (none if the process died), and
// callers refused by it meanwhile do not try the others: the mark's
// acquisition is then made by no one, and a later acquisition that the
// first node grants reads that mark as PreviousMark (package scheduler
// then does not report that scheduled time as missed, as for a winner
// that died between its grant and its run: docs/scheduling.md). A
// winner's round takes two round trips instead of one. Its order
// replaces WithQuorumFirst's. A LockOption only; its arguments and rules
// are WithHighWater's, and of WithHighWater and WithHighWaterFirst the
// last given applies.
func WithHighWaterFirst(record string, at int64, ttl time.Duration) LockOption {
	return callOption(func(l *lockConfig) { l.mark, l.markAt, l.markTTL, l.markFirst = record, at, ttl, true })
}

// order returns, with WithHighWaterFirst, the asking order of one acquire
// round (quorumfirst.go): one node first, every node at once when it is
// known down, and, in the call's first round only, a refusal there by the
// mark final: a retry follows a round that failed, after which that node
// may hold the mark of another caller's failed attempt, not yet undone,
// while that caller, refused on the others by this call's own failed
// attempt, gives up too. A retry still asks that node first, which orders
// the contenders that retry together. nil without WithHighWaterFirst.
// The Lock's attempts, and so its calls of order, follow one another.
func (h *highWater) order() askingOrder {
	if !h.first {
		return nil
	}
	o := &quorumFirst{ask: 1, allIfFirstDown: true}
	if h.rounds == 0 {
		o.final = refusedByMark
	}
	h.rounds++
	return o
}

// refusedByMark reports whether r is a refusal by a high-water mark.
func refusedByMark(r NodeResult) bool { return r.HolderMark != 0 }
