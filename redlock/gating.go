package redlock

import (
	_ "embed"

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
