package redlock

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/schedlock/schedlock/redlock/internal/node"
)

// Sentinel errors. Match them with errors.Is; the errors returned by this
// package wrap them, often together with a *QuorumError (errors.As) and, when
// a context ended, the context's cause.
var (
	// ErrNotAcquired matches every failed Acquire, TryAcquire and Do
	// acquisition: the resources are held by another owner, too few nodes
	// answered, the grant left too little validity, or ctx ended (then the
	// error also matches ctx's cause, e.g. context.Canceled).
	ErrNotAcquired = errors.New("redlock: not acquired")

	// ErrLockLost matches Extend and Release of a lock that is no longer
	// held: its validity (Lock.Until) has passed, too many nodes report that
	// the key no longer holds this lock for a quorum to remain, or (Extend)
	// the lock was already released. It is also the cause of the context that Do
	// and Keep cancel when the lock is lost.
	ErrLockLost = errors.New("redlock: lock lost")

	// ErrUnavailable matches a round in which so many nodes failed (an
	// error, no answer within the node timeout, or a restart gate) that
	// the outcome on a quorum is unknown: "Redis is down" rather than
	// "someone else holds the lock". Calls that the caller's own ctx cut
	// short are not failures of their nodes, and nodes that answered that
	// they are misconfigured count for ErrMisconfigured instead: a round
	// that failed only through those does not match ErrUnavailable. A
	// failed acquisition can match both ErrNotAcquired and
	// ErrUnavailable. An Extend that fails this way leaves the lock valid
	// until its unchanged Until().
	ErrUnavailable = errors.New("redlock: quorum unavailable")

	// ErrMisconfigured matches a round that failed because nodes answered
	// with an error an operator must fix on the node or in its go-redis
	// client, not an outage: authentication (WRONGPASS, NOAUTH), ACL
	// permissions (NOPERM), a Redis Cluster node given keys of several
	// slots or of another node's slot (CROSSSLOT, MOVED, ASK), a read-only
	// replica (READONLY), memory full under maxmemory-policy noeviction
	// (OOM), failing snapshots (MISCONF), a disabled command. It matches
	// with ErrUnavailable when other nodes failed too. The node's own
	// NodeResult.Err matches it as well, and its text says what to fix.
	// A node that keeps answering so is also logged (WithLogger).
	ErrMisconfigured = errors.New("redlock: nodes misconfigured")

	// ErrGated matches, with ErrUnavailable, a round that failed while
	// nodes were inside their restart gate (WithRestartGating): they have
	// no gate marker, because they are new or lost their data, and vote
	// again once the gate's maxTTL has passed. A node cannot tell the two
	// apart. A new fleet with gating meets it for its first maxTTL, and a
	// fleet meets it for maxTTL after a node restarted without its data:
	// test it before ErrUnavailable, and alert only when it lasts longer
	// than maxTTL (docs/operations.md).
	ErrGated = errors.New("redlock: nodes inside their restart gate")

	// ErrInvalidArgument matches errors about bad configuration or input,
	// reported before any I/O: no nodes, a nil or repeated node, an option
	// out of range, a TTL too short or above the restart gate, an empty,
	// repeated, reserved or NUL-containing resource name, a nil *Lock.
	ErrInvalidArgument = errors.New("redlock: invalid argument")

	// ErrClosed matches calls made on a Client after Close.
	ErrClosed = errors.New("redlock: client closed")
)

// invalidf returns an error matching ErrInvalidArgument that reads
// "redlock: invalid argument: <message>".
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// textError is an error with a text of its own that matches errs
// (errors.Is, errors.As): a wrapper whose text does not repeat the package
// prefix or the sentinel texts of the errors it wraps.
type textError struct {
	msg  string
	errs []error
}

func (e *textError) Error() string   { return e.msg }
func (e *textError) Unwrap() []error { return e.errs }

// wrapf returns an error that reads "redlock: <message>" and matches errs.
func wrapf(errs []error, format string, args ...any) error {
	return &textError{msg: "redlock: " + fmt.Sprintf(format, args...), errs: errs}
}

// detail returns the text of an error of this package without its
// "redlock: " prefix, and for a *QuorumError only what its round found
// (QuorumError.body), to be quoted in the text of an error that wraps it.
func detail(err error) string {
	if q, ok := err.(*QuorumError); ok {
		return q.body()
	}
	return ErrorText(err)
}

// ErrorText returns the text of err without the "redlock: " prefix that
// this package's errors begin with, for a caller that quotes err after a
// prefix of its own (one package prefix per text); the text of any other
// error is returned whole. A nil err gives "". Safe for concurrent use.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	return strings.TrimPrefix(err.Error(), "redlock: ")
}

// lockName names the lock on resources in error texts: `lock "a"`,
// `lock "a", "b"`; at most maxNames names, then how many more.
func lockName(resources []string) string {
	if len(resources) == 0 {
		return "lock"
	}
	return "lock " + quoteNames(resources)
}

// quoteNames returns the names quoted and separated by commas, at most
// maxNames of them.
func quoteNames(names []string) string {
	var b strings.Builder
	for i, n := range names {
		if i == maxNames {
			fmt.Fprintf(&b, " and %d more", len(names)-maxNames)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quoteName(n))
	}
	return b.String()
}

// maxNames bounds the resource names that one error text lists.
const maxNames = 5

// maxQuoted bounds the bytes of one name that an error text quotes.
const maxQuoted = 64

// quoteName quotes a user's name (a resource, a key prefix) for an error
// text: whole when it has at most maxQuoted bytes, else its first bytes
// (whole characters) and its length, `"aaa..."... (1048576 bytes)`, so
// that an error text stays short whatever the input.
func quoteName(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// attemptsText returns " after n attempts" for n > 1, else "".
func attemptsText(n int) string {
	if n > 1 {
		return fmt.Sprintf(" after %d attempts", n)
	}
	return ""
}

// Outcome is what one node answered in one quorum round.
type Outcome int

const (
	// OutcomeOK: the node granted the lock (acquire), confirmed ownership
	// with every key's TTL at least the new one (extend), or deleted every
	// key of the lock (release).
	OutcomeOK Outcome = iota
	// OutcomeHeld: the node answered, and a key is held by another owner
	// (acquire) or no longer holds this lock (extend, release; an extend
	// sets the lock's missing keys again where no other owner holds one,
	// for later rounds, but the node still counts as not holding it).
	OutcomeHeld
	// OutcomeError: the node answered with an error (Err matches
	// ErrMisconfigured when an operator must fix it), or the connection
	// failed.
	OutcomeError
	// OutcomeTimeout: the node did not answer within the node timeout
	// (WithNodeTimeout), or the caller's ctx ended first (then Err is
	// ctx's cause, and the node does not count as failed).
	OutcomeTimeout
	// OutcomeGated: the node refused to vote (acquire), or to set a
	// missing key of the lock again (extend), because it lost its data
	// recently and is within its restart gate (WithRestartGating). It
	// counts as a failure for ErrUnavailable; it votes again once the gate
	// has passed.
	OutcomeGated
	// OutcomePending: the round was decided by the other nodes' answers
	// (a quorum, or so many refusals that a quorum was impossible) before
	// this node answered. Nothing is wrong with the node; a grant it makes
	// of a failed acquisition is deleted by the undo that follows it. A
	// round with WithQuorumFirst may also decide without asking the node
	// at all (its text then says "not asked").
	OutcomePending
)

// String returns "ok", "held", "error", "timeout", "gated" or "pending".
func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

var outcomeNames = [...]string{"ok", "held", "error", "timeout", "gated", "pending"}

// NodeResult is one node's part in a quorum round.
type NodeResult struct {
	// Node is the node's index in the slice given to New.
	Node int
	// Addr is the node's address ("host:port") when the client exposes one,
	// else "node<i>".
	Addr string
	// Outcome is what the node answered.
	Outcome Outcome
	// Err is the node's error for OutcomeError and OutcomeTimeout, else
	// nil. Its text names the cause when it is known: the node's answer
	// and what to fix (matching ErrMisconfigured), or, for a missing
	// answer, the last failure to connect ("cannot connect: ...
	// connection refused") or the node's last failure.
	Err error
	// Latency is the time from the round's start to the node's answer; for
	// OutcomeTimeout and OutcomePending, the time the round waited.
	Latency time.Duration
	// Holder is, for OutcomeHeld in an acquire round, the metadata that the
	// other holder stored with its lock (WithMetadata); "" otherwise. The
	// holder's owner token is never exposed.
	Holder string
	// Resource is, for OutcomeHeld in an acquire round, the resource whose
	// key refused: one of the lock's, its record (WithRecord) or its mark
	// (WithHighWater); "" otherwise.
	Resource string
	// HolderTTL is, for OutcomeHeld in an acquire round, how long the
	// refusing key had left to live (whole milliseconds; 0 when unknown).
	HolderTTL time.Duration
	// HolderMark is, for OutcomeHeld in an acquire round refused by a
	// high-water mark (WithHighWater), the mark on the node; 0 otherwise.
	HolderMark int64

	canceled    bool   // the caller's ctx ended the call: not a node failure
	unsent      bool   // OutcomePending: never asked (round.go, forgoLocked)
	final       bool   // acquire, OutcomeHeld: a refusal that ended the round alone (refusedForGoodLocked)
	regained    bool   // extend, OutcomeHeld: the missing keys are set again
	refused     bool   // acquire: the node refused and set nothing (the undo skips it)
	traceparent string // acquire, OutcomeHeld: the holder's trace context
	reply       []any  // the script's reply, for the layers (fencing)
	value       string // holder round: the key's value (never leaves the package)
	val         any    // Eval: the node's reply
}

// failed reports whether r counts as a failure of its node.
func (r NodeResult) failed() bool {
	switch r.Outcome {
	case OutcomeError, OutcomeTimeout, OutcomeGated:
		return !r.canceled
	}
	return false
}

// QuorumError describes a quorum round that did not succeed, with every
// node's outcome, so that callers can tell "held by another owner" from
// "Redis unavailable". Reach it with errors.As. It unwraps to the sentinels
// that apply: ErrNotAcquired for acquisitions, ErrLockLost when the lock is
// certainly gone, ErrUnavailable when too many nodes failed.
type QuorumError struct {
	// Op is the round: "acquire", "fence" (recording a fencing token),
	// "check" (confirming a reentrant hold's token), "extend", "release",
	// "holder" (Client.HolderMetadata) or "eval" (Client.Eval, whose
	// Resources are the script's keys).
	Op string
	// Resources are the lock's resource names (without key prefix).
	Resources []string
	// Quorum is the number of OK answers needed: N/2+1 of the configured N.
	Quorum int
	// Nodes holds one entry per configured node, in the order given to New.
	Nodes []NodeResult

	// weak: a quorum granted, with validity (possibly <= 0) below minimum.
	weak              bool
	validity, minimum time.Duration
	sentinels         []error
	refusal           func(NodeResult) string // WithRefusalText
}

// newQuorumError builds the error of a failed round: it matches the given
// sentinels, and ErrUnavailable when node failures alone make a quorum
// impossible, or always with unknown (failed nodes left the outcome
// unknown). The results are copied.
func newQuorumError(op string, resources []string, quorum int, rs []NodeResult, unknown bool, sentinels ...error) *QuorumError {
	closed := slices.ContainsFunc(rs, func(r NodeResult) bool { return r.Err == ErrClosed })
	switch {
	case closed: // Close refused the calls: not the nodes' failure
		sentinels = append(sentinels, ErrClosed)
	case unknown || failures(rs) > len(rs)-quorum:
		mis := misconfigs(rs)
		if mis > 0 {
			sentinels = append(sentinels, ErrMisconfigured)
		}
		if failures(rs) > mis || mis == 0 {
			sentinels = append(sentinels, ErrUnavailable)
		}
		if count(rs, OutcomeGated) > 0 {
			sentinels = append(sentinels, ErrGated)
		}
	}
	nodes := slices.Clone(rs)
	for i := range nodes {
		nodes[i].reply, nodes[i].val = nil, nil
	}
	return &QuorumError{Op: op, Resources: resources, Quorum: quorum, Nodes: nodes, sentinels: sentinels}
}

// Count returns how many nodes had outcome o in this round.
func (e *QuorumError) Count(o Outcome) int { return count(e.Nodes, o) }

// HolderMetadata returns the metadata (WithMetadata) of the lock that
// refused this acquire round on a quorum of nodes: the resource is really
// held, by that holder; or, for a round that one node's refusal ended
// (WithHighWaterFirst), the metadata of that node's mark. ok is false
// when no single holder refused on a quorum (the nodes were split between
// contenders, or too few answered), and for rounds other than acquire.
func (e *QuorumError) HolderMetadata() (metadata string, ok bool) {
	if e.Op != "acquire" {
		return "", false
	}
	r, ok := quorumHolder(e)
	return r.Holder, ok
}

// quorumHolder returns the result of a node that refused q for the holder
// that a quorum of q's nodes named, if there is one. Nodes name the same
// holder when they hold the same lock value (the same owner token, trace
// context and metadata), or, in a QuorumError built without values (a
// user's test), the same metadata.
func quorumHolder(q *QuorumError) (NodeResult, bool) {
	votes := map[string]int{}
	for _, r := range q.Nodes {
		if r.Outcome != OutcomeHeld {
			continue
		}
		if r.final {
			return r, true
		}
		v := r.value
		if v == "" {
			v = nul + r.Holder // never a lock value, which starts with the owner token
		}
		if votes[v]++; votes[v] >= q.Quorum {
			return r, true
		}
	}
	return NodeResult{}, false
}

// HolderUnknown reports, for an acquire round that no holder won on a
// quorum (HolderMetadata's ok is false), whether the nodes that failed (an
// error, no answer, a restart gate) leave unknown whether one did: counted
// as held by the holder that most answering nodes named, they would
// complete a quorum. A caller that must not mistake "taken" for "free"
// (the scheduler) treats such a round as unavailable, not as a split vote.
func (e *QuorumError) HolderUnknown() bool {
	failed := e.Count(OutcomeError) + e.Count(OutcomeTimeout) + e.Count(OutcomeGated)
	votes, best := map[string]int{}, 0
	for _, r := range e.Nodes {
		if r.Outcome == OutcomeHeld {
			v := r.value
			if v == "" {
				v = nul + r.Holder
			}
			votes[v]++
			best = max(best, votes[v])
		}
	}
	return e.Op == "acquire" && failed > 0 && best > 0 && best+failed >= e.Quorum
}

// Holder returns HolderMetadata().
//
// Deprecated: use HolderMetadata; Holder will be removed in the next
// release.
func (e *QuorumError) Holder() (metadata string, ok bool) { return e.HolderMetadata() }

// Error names the lock, what the round failed to do, the count of nodes
// against the quorum, and every node's outcome in words, for example
// `redlock: lock "a" not acquired: 1 of 3 nodes granted, quorum is 2:
// 10.0.0.1:6379 granted (released again); 10.0.0.2:6379 held by "worker-2"
// for another 850ms; 10.0.0.3:6379 no answer within the 100ms node
// timeout`.
func (e *QuorumError) Error() string {
	subject := lockName(e.Resources)
	switch e.Op {
	case "holder":
		subject = "holder of " + quoteNames(e.Resources)
	case "eval":
		subject = "script on " + quoteNames(e.Resources)
	}
	return "redlock: " + subject + " " + e.outcome() + ": " + e.body()
}

// outcome says what the round failed to do: "not acquired", "lost", ...
func (e *QuorumError) outcome() string {
	t, ok := opTexts[e.Op]
	switch {
	case !ok:
		return "failed in its " + e.Op + " round"
	case slices.Contains(e.sentinels, ErrLockLost):
		return "lost"
	}
	return t.failed
}

// opTexts says, per round, what a node with OutcomeOK did and what a
// failed round did not do.
var opTexts = map[string]struct{ ok, failed string }{
	"acquire": {"granted", "not acquired"},
	"fence":   {"recorded the fencing token", "not acquired"},
	"check":   {"confirmed the fencing token", "not acquired"},
	"extend":  {"extended", "not extended"},
	"release": {"released", "not released"},
	"holder":  {"answered", "unknown"},
	"eval":    {"answered", "not run on a quorum"},
}

// body is what the round found: the nodes that did their part against the
// quorum, why that was not enough, and every node's outcome.
func (e *QuorumError) body() string {
	var b strings.Builder
	nodes := "nodes"
	if len(e.Nodes) == 1 {
		nodes = "node"
	}
	fmt.Fprintf(&b, "%d of %d %s %s, quorum is %d", e.Count(OutcomeOK), len(e.Nodes), nodes, okVerb(e.Op), e.Quorum)
	switch {
	case slices.Contains(e.sentinels, ErrClosed):
		b.WriteString(", the client was closed")
	case slices.Contains(e.sentinels, ErrUnavailable) && slices.Contains(e.sentinels, ErrMisconfigured):
		b.WriteString(", too many nodes failed, some of them misconfigured")
	case slices.Contains(e.sentinels, ErrUnavailable):
		b.WriteString(", too many nodes failed")
	case slices.Contains(e.sentinels, ErrMisconfigured):
		b.WriteString(", too many nodes are misconfigured")
	}
	if e.weak {
		if e.validity > 0 {
			fmt.Fprintf(&b, ", but only %v of validity remained, below the minimum %v", e.validity.Round(time.Microsecond), e.minimum.Round(time.Microsecond))
		} else {
			fmt.Fprintf(&b, ", but no validity remained, the minimum is %v", e.minimum.Round(time.Microsecond))
		}
		b.WriteString(" (use a longer TTL or a lower WithMinValidity)")
	}
	for i, r := range e.Nodes {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		if r.Addr != "" {
			b.WriteString(r.Addr)
		} else {
			fmt.Fprintf(&b, "node %d", r.Node)
		}
		b.WriteString(" ")
		b.WriteString(describe(e, r))
	}
	return b.String()
}

// okVerb says what a node with OutcomeOK did in a round of op.
func okVerb(op string) string {
	if t, ok := opTexts[op]; ok {
		return t.ok
	}
	return "succeeded"
}

// describe says in words what node result r means in round e.
func describe(e *QuorumError, r NodeResult) string {
	switch r.Outcome {
	case OutcomeOK:
		if e.Op == "acquire" && slices.Contains(e.sentinels, ErrClosed) {
			return "granted (not released again: the client was closed; the key expires with its TTL)"
		}
		if e.Op == "acquire" {
			return "granted (released again)"
		}
		return okVerb(e.Op)
	case OutcomeHeld:
		return heldText(e, r)
	case OutcomeError:
		if errors.Is(r.Err, ErrClosed) || errors.Is(r.Err, node.ErrClosed) {
			return "not sent: the client was closed"
		}
		return fmt.Sprintf("failed: %v", r.Err)
	case OutcomeTimeout:
		return timeoutText(r)
	case OutcomeGated:
		return "not voting yet: it has no restart-gate marker (a new node, or one that lost its data) and waits out its restart gate (WithRestartGating)"
	case OutcomePending:
		if r.unsent {
			return "not asked: the round ended before it asked this node (WithQuorumFirst, WithHighWaterFirst)"
		}
		return "not waited for: the other nodes' answers had decided the outcome"
	}
	return r.Outcome.String()
}

// heldText says in words what OutcomeHeld means in round e.
func heldText(e *QuorumError, r NodeResult) string {
	switch e.Op {
	case "acquire":
		return refusedText(e, r)
	case "fence", "check":
		return "has a larger fencing token from another acquisition"
	}
	if r.regained {
		return "no longer held this lock (its keys are set there again)"
	}
	return "no longer holds this lock"
}

// timeoutText says why a node with OutcomeTimeout gave no answer.
func timeoutText(r NodeResult) string {
	var na *noAnswerError
	switch {
	case r.canceled:
		return fmt.Sprintf("cut short by the caller's context (%v)", r.Err)
	case errors.As(r.Err, &na):
		return na.msg
	case r.Err == nil:
		return "no answer in time"
	}
	return fmt.Sprintf("no answer in time (%v)", r.Err)
}

// refusedText says who holds what on a node that refused an acquisition:
// `held by "worker-2" for another 850ms`, naming the resource when the lock
// has several or the refusing key is its record (WithRecord) or mark
// (WithHighWater: `"m" is at mark 120, set by "worker-2"`).
func refusedText(e *QuorumError, r NodeResult) string {
	if e.refusal != nil {
		return e.refusal(r)
	}
	var b strings.Builder
	if r.Resource != "" && (len(e.Resources) != 1 || r.Resource != e.Resources[0]) {
		b.WriteString(quoteName(r.Resource) + " ")
	}
	if r.HolderMark != 0 { // a high-water mark: its TTL is a retention, not a hold
		fmt.Fprintf(&b, "is at mark %d", r.HolderMark)
		if r.Holder != "" {
			fmt.Fprintf(&b, ", set by %q", r.Holder)
		}
		return b.String()
	}
	if r.Holder != "" {
		fmt.Fprintf(&b, "held by %q", r.Holder)
	} else {
		b.WriteString("held by another owner")
	}
	if r.HolderTTL > 0 {
		fmt.Fprintf(&b, " for another %v", r.HolderTTL)
	}
	return b.String()
}

// Unwrap returns the sentinels this error matches.
func (e *QuorumError) Unwrap() []error { return e.sentinels }

// count returns the number of results with outcome o.
func count(rs []NodeResult, o Outcome) int {
	n := 0
	for _, r := range rs {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// misconfigs returns the number of failures that are answers an operator
// must fix (ErrMisconfigured).
func misconfigs(rs []NodeResult) int {
	n := 0
	for _, r := range rs {
		if r.failed() && errors.Is(r.Err, ErrMisconfigured) {
			n++
		}
	}
	return n
}

// failures returns the number of results that count as failures of their
// nodes.
func failures(rs []NodeResult) int {
	n := 0
	for _, r := range rs {
		if r.failed() {
			n++
		}
	}
	return n
}

// noAnswerError is the Err of a node that gave no answer within the
// round's limit: msg says which limit; err is the call's own error, if any.
type noAnswerError struct {
	msg string
	err error
}

func (e *noAnswerError) Error() string { return e.msg }
func (e *noAnswerError) Unwrap() error { return e.err }
