package redlock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/node"
)

// Script is a Lua script for Client.Eval. Its SHA1 is computed once, by
// NewScript; it goes to a node as EVALSHA, and as EVAL where the node does
// not know it yet. Safe for concurrent use.
type Script struct {
	s       *node.Script
	timeout time.Duration // WithScriptTimeout; 0: the Client's node timeout
}

// ScriptOption configures NewScript.
type ScriptOption func(*Script)

// WithScriptTimeout makes Client.Eval wait up to d for each node's answer
// to this script, instead of the Client's node timeout (WithNodeTimeout):
// for a script whose reply is large (a status page reading the records of
// a thousand jobs), which a node timeout made for lock rounds would cut
// short. Eval still returns as soon as a quorum answered; ctx still
// bounds it. Default: the Client's node timeout; d <= 0 means the
// default.
func WithScriptTimeout(d time.Duration) ScriptOption {
	return func(s *Script) { s.timeout = max(d, 0) }
}

// NewScript returns the script of Lua source src (redis.io "Scripting
// with Lua").
func NewScript(src string, opts ...ScriptOption) *Script {
	s := &Script{s: node.NewScript(src)}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	return s
}

// NodeReply is one node's answer to Client.Eval.
type NodeReply struct {
	// Node is the node's index in the slice given to New.
	Node int
	// Addr is the node's address ("host:port") when the client exposes
	// one, else "node<i>".
	Addr string
	// Val is the script's reply as go-redis reads it (nil for a Lua nil or
	// false) when Err is nil.
	Val any
	// Err is the node's error, or the reason it has none (no answer within
	// the node timeout, the caller's ctx ended); nil when it answered.
	Err error
}

// Eval runs s on every node in one parallel round, with keys (each
// prefixed with the Client's key prefix, WithKeyPrefix) and args, and
// returns every node's reply in node order as soon as a quorum of nodes
// answered (the others' calls still go out; their NodeReply says they
// were not waited for), or when a quorum can no longer answer, or at the
// node timeout (the script's own, WithScriptTimeout). It is the way to
// keep data of one's own beside the locks, on the same nodes and through
// the same connections (the scheduler's run record): a write reaches each
// node that answers; a read merges what a quorum of nodes says. The script
// must follow the rules of Redis scripts (every key it touches in keys).
//
// Errors: ErrInvalidArgument for a nil script or a key with a NUL byte (no
// I/O then); ErrClosed after Close; otherwise, when fewer than a quorum of
// nodes answered without an error, a *QuorumError (op "eval"), returned
// with the replies, matching ErrUnavailable when nodes failed (no answer,
// a connection error), ErrMisconfigured when nodes answered with an error
// an operator must fix (NOPERM for an ACL user without EVAL, say), or both.
// The script's own error replies (redis.error_reply, a runtime error) are
// their nodes' NodeReply.Err and count as failures.
// Safe for concurrent use.
func (c *Client) Eval(ctx context.Context, s *Script, keys []string, args ...any) ([]NodeReply, error) {
	if s == nil {
		return nil, invalidf("the script (Eval) is nil")
	}
	if c.closed.Load() {
		return nil, wrapf([]error{ErrClosed}, "script not run: the client is closed")
	}
	prefixed := make([]string, len(keys))
	for i, k := range keys {
		if hasNUL(k) {
			return nil, invalidf("key %q (Eval) contains a NUL byte", k)
		}
		prefixed[i] = c.cfg.keyPrefix + k
	}
	return c.eval(ctx, s, keys, prefixed, args...)
}

// eval runs s on the prefixed keys (named keys in errors) on every node:
// Eval without its checks.
func (c *Client) eval(ctx context.Context, s *Script, keys, prefixed []string, args ...any) ([]NodeReply, error) {
	rs := c.vote(ctx, call{op: "eval", timeout: s.timeout, script: s.s, keys: prefixed, args: args, parse: parseEval})
	out := make([]NodeReply, len(rs))
	for i, r := range rs {
		out[i] = NodeReply{Node: r.Node, Addr: r.Addr, Val: r.val, Err: r.Err}
		if r.Outcome != OutcomeOK && r.Err == nil {
			out[i].Err = errNotWaited // decided at a quorum before it answered
		}
	}
	if count(rs, OutcomeOK) < c.quorum {
		return out, newQuorumError("eval", keys, c.quorum, rs, true)
	}
	return out, nil
}

// errNotWaited is the Err of a node that Eval did not wait for: a quorum
// had answered first.
var errNotWaited = wrapf(nil, "not waited for: a quorum had answered first")

// parseEval reads any reply of an Eval script.
func parseEval(cmd *redis.Cmd) NodeResult {
	return NodeResult{Outcome: OutcomeOK, val: cmd.Val()}
}

// ReleaseAbandoned deletes the key of resource on every node where it
// holds a lock whose metadata is exactly metadata, unless the lock is
// reentrant (WithOwner: its holds are left alone), and, when mark is not
// "", puts back the high-water mark (WithHighWater) under mark that an
// acquisition with that metadata raised (as the undo of a failed attempt
// does); it returns on how many nodes it did either. It leaves a
// WithRecord record and a fencing counter in place, and publishes no
// release notice (a waiting Acquire finds the lock free at its next
// attempt). It is for a caller that
// knows it abandoned an acquisition, one whose undo may have reached a
// node before the grant it was to delete (go-redis sent the grant again
// on a new connection), and that wrote metadata unique to that
// acquisition: the scheduler's run locks carry the instance, its clock
// reading and a per-process nonce. Anyone who knows a lock's metadata can
// delete it this way, so never use it on metadata that two holders can
// share. One round, returning once a quorum answered (Eval).
//
// Errors: ErrInvalidArgument for a bad resource name or empty metadata (no
// I/O then); ErrClosed after Close; a *QuorumError (op "eval") when fewer
// than a quorum of nodes answered, matching ErrUnavailable or
// ErrMisconfigured as Eval's does. Safe for concurrent use.
func (c *Client) ReleaseAbandoned(ctx context.Context, resource, metadata, mark string) (int, error) {
	keys := []string{resource}
	if mark != "" {
		keys = append(keys, mark)
	}
	if err := c.checkResources(keys); err != nil {
		return 0, err
	}
	if metadata == "" {
		return 0, invalidf("the metadata (ReleaseAbandoned) is empty: it would match every lock without metadata")
	}
	if c.closed.Load() {
		return 0, wrapf([]error{ErrClosed}, "script not run: the client is closed")
	}
	// The reentrant holds beside the lock key: a key with holds is not a
	// plain lock, and stays.
	prefixed := []string{c.cfg.keyPrefix + resource, c.cfg.keyPrefix + resource + holdsSuffix}
	if mark != "" {
		prefixed = append(prefixed, c.cfg.keyPrefix+mark)
	}
	replies, err := c.eval(ctx, &Script{s: abandonScript}, keys, prefixed, metadata)
	n := 0
	for _, r := range replies {
		if v, ok := r.Val.(int64); ok && r.Err == nil && v == 1 {
			n++
		}
	}
	return n, err
}
