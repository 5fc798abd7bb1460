// Package model is an executable model of redlock's protocol as
// implemented, explored exhaustively for small configurations by a small
// explicit-state explorer of its own (explore.go), and tied to the code:
// its scripts (scripts.go) mirror redlock/scripts/*.lua line for line, and
// TestScriptsMatchRedis runs the same calls on a real redis-server and on
// the model and compares replies and key spaces. docs/safety.md ("The
// model") gives its scope, assumptions, findings and commands.
package model
