package redlock

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// Restart gating (WithRestartGating; redis.io distlock spec, "Performance,
// crash recovery and fsync": delayed restarts). Each node keeps a marker
// without TTL, "<prefix>\x00restart-gate", holding the server time (ms) at
// which the node was first seen without it. A node without the marker has
// lost its data, so it may have granted locks it no longer remembers: the
// acquire script then stores the time and refuses to vote (OutcomeGated)
// until maxTTL has passed since, by which time every such lock has expired;
// so does an extension before it regains a missing key
// (scripts/gate.lua). Every TTL of a gated Client is at most maxTTL
// (CheckTTL), for Extend too. The marker of releases before 0.2
// ("<prefix>redlock:restart-gate") is copied once, so that an upgrade
// does not gate every node again.

//go:embed scripts/gate.lua
var gateSrc string

var gatePart = script.Part{Name: "gate", Fixed: 2, Args: 1, Hooks: script.Parse(gateSrc)}

// gating is the layer of every Lock of a gated Client.
type gating struct {
	baseLayer
	markers []string // the gate marker and the former marker
	gate    int64    // ms
}

func newGating(c *Client, _ *lockConfig, _ []string, _ bool) (layer, error) {
	if c.cfg.gate <= 0 {
		return nil, nil
	}
	return &gating{markers: []string{c.cfg.keyPrefix + gateName, c.cfg.keyPrefix + legacyGateName},
		gate: c.cfg.gate.Milliseconds()}, nil
}

func (*gating) part() script.Part { return gatePart }

func (g *gating) keys([]string) []string { return g.markers }

func (g *gating) args(scriptKind, *attempt) []any { return []any{g.gate} }

// reply reads the gated reply {2, ms left} to acquire or extend: the
// node refuses to vote (it set nothing).
func (*gating) reply(_ *Lock, _ scriptKind, _ *script.Layout, reply any) (NodeResult, bool) {
	v, _ := reply.([]any)
	if len(v) != 2 || !allInts(v) || v[0] != int64(2) {
		return NodeResult{}, false
	}
	return NodeResult{Outcome: OutcomeGated}, true
}

// RestartGate returns the restart gate's maxTTL (WithRestartGating), or 0
// when gating is off.
func (c *Client) RestartGate() time.Duration { return c.cfg.gate }

// WithRestartGating enforces the redis.io page's "delayed restarts": a node
// that has lost its data (restarted without persistence, or flushed) does
// not vote for any acquisition until maxTTL has passed since it was first
// seen empty, so it cannot grant a lock that it had granted to someone else
// before the restart. It applies to every client that uses the same nodes
// with the same key prefix and this option. The gate marker is a key without
// TTL on each node: a node that keeps its data (appendonly yes + appendfsync
// always) keeps its marker and is not gated after a restart. Restarting from
// an RDB snapshot restores a stale marker and defeats the gate: use AOF, or
// no persistence at all.
//
// Every TTL used with this Client, in Acquire, TryAcquire, Do and Extend,
// must be at most maxTTL (longer ones are rejected; CheckTTL): with their
// defaults, package scheduler needs 10 s (its run lock; its misfire
// threshold, 1 min by default, is lowered to maxTTL) and package elector
// 10 s (its lease), which their constructors check. Retentions, such as
// a WithHighWater mark's, may exceed maxTTL. On a brand-new node
// the first acquisitions also wait maxTTL. Gated nodes show OutcomeGated.
// Default 0: off. New rejects negative values and values below 1 ms.
func WithRestartGating(maxTTL time.Duration) Option {
	return clientOption(func(c *config) { c.gate = maxTTL })
}

// checkGateTTL is a gated Client's limit on every TTL (CheckTTL): at most
// the gate's maxTTL, in whole milliseconds as the nodes get it.
func checkGateTTL(cfg *config, ttl time.Duration) string {
	if cfg.gate > 0 && ttl.Truncate(time.Millisecond) > cfg.gate {
		return fmt.Sprintf("TTL %v is above the restart gate's maximum TTL %v (WithRestartGating)", ttl, cfg.gate)
	}
	return ""
}

// checkGate validates WithRestartGating.
func checkGate(cfg *config) error {
	switch {
	case cfg.gate < 0:
		return invalidf("restart gate %v (WithRestartGating) is negative (0 turns gating off)", cfg.gate)
	case cfg.gate > 0 && cfg.gate < time.Millisecond:
		return invalidf("restart gate %v (WithRestartGating) is below the minimum 1ms (0 turns gating off)", cfg.gate)
	}
	return nil
}
