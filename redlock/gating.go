package redlock

// Restart gating (WithRestartGating; redis.io distlock spec, "Performance,
// crash recovery and fsync": delayed restarts). Each node keeps a marker
// without TTL, "<prefix>\x00restart-gate", holding the server time (ms) at
// which the node was first seen without it. A node without the marker has
// lost its data, so it may have granted locks it no longer remembers: the
// acquire script then stores the time and refuses to vote (OutcomeGated)
// until maxTTL has passed since, by which time every such lock has expired.
// Every TTL of a gated Client is at most maxTTL (CheckTTL), for Extend too.
// The marker of releases before 0.2 ("<prefix>redlock:restart-gate") is
// copied once, so that an upgrade does not gate every node again.

// gateKeys returns the gate marker and the former marker, the last keys of
// a gated lock.
func (c *Client) gateKeys() []string {
	return []string{c.cfg.keyPrefix + gateName, c.cfg.keyPrefix + legacyGateName}
}
