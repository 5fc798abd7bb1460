package redlock

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The readers of the nodes' replies to the core's scripts and to SET NX
// GET, and the helpers that features' readers (layer.reply) share: each
// reply outside a command's contract is a faulty node's (badReply), never
// a grant, a confirmation or a refusal (docs/safety.md, "Failure modes").

// parseAcquire returns the reader of the replies to k, l's acquire
// script, for value: {1, ...} granted, with as many integers as k's
// layers add; {0, holder's value, PTTL, i} refused by lock key i; or a
// reply of one of k's layers (layer.reply: a refusal by its keys, or the
// node refusing to vote). A refusal set nothing (NodeResult.refused).
// Any other reply, nil included, is a faulty node's (badReply).
func parseAcquire(l *Lock, k layerCall, value string) func(*redis.Cmd) NodeResult {
	size := k.layout.Replies()
	return func(cmd *redis.Cmd) NodeResult {
		v, _ := cmd.Val().([]any)
		switch {
		case len(v) == 0 || !allInts(v[:1]):
		case v[0] == int64(1) && len(v) == size && allInts(v):
			return NodeResult{Outcome: OutcomeOK, reply: v}
		case v[0] == int64(0) && len(v) == 4 && allInts(v[2:]):
			holder, isString := v[1].(string)
			if i := intAt(v, 3); isString && i >= 1 && int(i) <= l.n {
				return refusal(holder, time.Duration(intAt(v, 2))*time.Millisecond, l.resources[i-1])
			}
		}
		if r, ok := layerReply(l, kindAcquire, k, cmd.Val()); ok {
			r.refused = true
			return r
		}
		return badReply("acquire script", cmd.Val())
	}
}

// parseSetGet returns the reader of l's SET NX GET replies for value: nil
// (the key was set), or the key's value, which is a grant when it has our
// owner token (go-redis sent the command again after a lost reply) and a
// refusal otherwise. Any other reply is a faulty node's (badReply).
func parseSetGet(l *Lock, value string) func(*redis.Cmd) NodeResult {
	return func(cmd *redis.Cmd) NodeResult {
		switch v := cmd.Val().(type) {
		case nil:
			return NodeResult{Outcome: OutcomeOK}
		case string:
			if len(v) >= tokenLen && v[:tokenLen] == value[:tokenLen] {
				return NodeResult{Outcome: OutcomeOK}
			}
			return refusal(v, 0, l.resources[0])
		}
		return badReply("SET NX GET", cmd.Val())
	}
}

// parseExtend returns the reader of the replies to k, l's extend script:
// 1 extended; 0 held by another owner; 3 a key of the lock was missing
// and is set again: the node did not hold the lock, so it counts as
// OutcomeHeld (regained), not as a confirmation, and the keys it holds
// now serve later rounds; or a reply of one of k's layers (layer.reply).
// Any other reply is a faulty node's (badReply).
func parseExtend(l *Lock, k layerCall) func(*redis.Cmd) NodeResult {
	return func(cmd *redis.Cmd) NodeResult {
		if v, ok := cmd.Val().(int64); ok && v == 3 {
			return NodeResult{Outcome: OutcomeHeld, regained: true}
		}
		if _, ok := cmd.Val().([]any); ok {
			if r, ok := layerReply(l, kindExtend, k, cmd.Val()); ok {
				return r
			}
		}
		return parseInt(1)(cmd)
	}
}

// parseInt reads the integer reply of a script that answers 0 to want:
// OK when it equals want, OutcomeHeld below it. Any other reply, nil
// included, is a faulty node's (badReply).
func parseInt(want int64) func(*redis.Cmd) NodeResult {
	return func(cmd *redis.Cmd) NodeResult {
		v, ok := cmd.Val().(int64)
		switch {
		case !ok || cmd.Err() != nil || v < 0 || v > want:
			return badReply("script", cmd.Val())
		case v == want:
			return NodeResult{Outcome: OutcomeOK}
		}
		return NodeResult{Outcome: OutcomeHeld}
	}
}

// layerReply reads v, a reply to kind's script call c that the core does
// not read, by one of c's layers, in order; false when none reads it.
func layerReply(l *Lock, kind scriptKind, c layerCall, v any) (NodeResult, bool) {
	for _, y := range c.in {
		if r, ok := y.reply(l, kind, c.layout, v); ok {
			return r, true
		}
	}
	return NodeResult{}, false
}

// refusal is the result of resource's key held by the lock value v, whose
// TTL left is expires (0: unknown): a refusal, which set nothing.
func refusal(v string, expires time.Duration, resource string) NodeResult {
	tp, md, _ := splitValue(v) // never expose the other owner's token
	return NodeResult{Outcome: OutcomeHeld, Holder: md, Resource: resource, traceparent: tp, HolderTTL: expires,
		value: asWritten(v), refused: true}
}

// badReply is the result of a reply outside the contract of the command
// (what): one that Redis does not send, so a node (or a proxy in front of
// it) that sends it is faulty, and its answer counts for nothing.
func badReply(what string, v any) NodeResult {
	text := fmt.Sprintf("%#v", v)
	if len(text) > 100 {
		text = text[:100] + "..."
	}
	return NodeResult{Outcome: OutcomeError, Err: fmt.Errorf("unexpected reply %s to the %s, which Redis does not send (a proxy in between?)", text, what)}
}

// allInts reports whether every element of v is an integer.
func allInts(v []any) bool {
	for _, x := range v {
		if _, ok := x.(int64); !ok {
			return false
		}
	}
	return true
}

// intAt returns the integer at v[i], or 0.
func intAt(v []any, i int) int64 {
	if i >= len(v) {
		return 0
	}
	n, _ := v[i].(int64)
	return n
}
