package redlock

import (
	_ "embed"

	"github.com/schedlock/schedlock/redlock/internal/node"
	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The Lua scripts; each file's header states its contract (keys,
// arguments, reply). acquire.lua, extend.lua and release.lua are the
// core's templates, which the layers' fragments complete (layer.go); the
// others are whole scripts. They go out as EVALSHA once a node knows
// them, else as EVAL (internal/node). Ownership is the owner token, the
// first TOKEN (script.TokenLen) bytes of a lock value (keys.go).
var (
	//go:embed scripts/acquire.lua
	acquireSrc string
	//go:embed scripts/fence.lua
	fenceSrc string
	//go:embed scripts/note.lua
	noteSrc string
	//go:embed scripts/check.lua
	checkSrc string
	//go:embed scripts/extend.lua
	extendSrc string
	//go:embed scripts/release.lua
	releaseSrc string
	//go:embed scripts/abandon.lua
	abandonSrc string
	//go:embed scripts/holders.lua
	holdersSrc string

	fenceScript   = node.NewScript(fenceSrc)
	noteScript    = node.NewScript(noteSrc)
	checkScript   = node.NewScript(checkSrc)
	abandonScript = node.NewScript(script.New(nil, 0, 0).Assemble(abandonSrc)) // TOKEN
	holdersScript = node.NewScript(holdersSrc)
)
