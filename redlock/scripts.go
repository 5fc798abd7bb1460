package redlock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one per operation; each file's header states its
// contract (keys, arguments, reply). They go out as EVALSHA, and as EVAL
// when a node answers NOSCRIPT (internal/node). Ownership is the owner
// token, the first 32 bytes of a lock value (keys.go).
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

	acquireScript = redis.NewScript(acquireSrc)
	fenceScript   = redis.NewScript(fenceSrc)
	noteScript    = redis.NewScript(noteSrc)
	checkScript   = redis.NewScript(checkSrc)
	extendScript  = redis.NewScript(extendSrc)
	releaseScript = redis.NewScript(releaseSrc)
)
