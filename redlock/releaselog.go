package redlock

import (
	_ "embed"
	"strconv"
	"time"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The release log (WithReleaseLog; the scheduler's run records): a list
// that a Release pushes entries onto in its own script
// (scripts/releaselog.lua), a layer of that one Release's script.

//go:embed scripts/releaselog.lua
var releaseLogSrc string

var releaseLogPart = script.Part{Name: "log", Fixed: 1, Args: -1, Hooks: script.Parse(releaseLogSrc)}

// releaseLog is WithReleaseLog's list and entries, and the layer of the
// Release it is given to.
type releaseLog struct {
	baseLayer
	list    string
	keep    int
	ttl     time.Duration
	entries []string
	key     string // the list's key, set by Release
}

// WithReleaseLog makes a Release also push entries, oldest first, onto the
// list under the resource name list on each node where its script runs,
// in that same script, whether or not that node still held the lock (a
// Release that returns ErrLockLost still logs): the list keeps its newest
// keep entries and lives ttl from the push. It is for data that belongs
// with the release (the scheduler's run record), which it saves a round.
// A node whose release script could not run has no entry either; one
// where another key, not a list, has the list's name refuses the whole
// Release before it deletes anything (ErrMisconfigured, naming the key's
// type), so the lock is kept there. list
// obeys the rules of a resource name and must not be one of the lock's
// resources; keep must be at least 1, ttl at least 1 ms; one Release
// takes one log (Release returns ErrInvalidArgument, with no I/O,
// otherwise). Default: none.
func WithReleaseLog(list string, keep int, ttl time.Duration, entries ...string) ReleaseOption {
	return &releaseLog{list: list, keep: keep, ttl: ttl, entries: entries}
}

// releaseLayer returns the log's layer of a Release of l: one log per
// Release, its list not one of l's resources nor a reserved name, its
// length and TTL in range.
func (r *releaseLog) releaseLayer(l *Lock, before []layer) (layer, error) {
	for _, y := range before {
		if _, ok := y.(*releaseLog); ok {
			return nil, invalidf("more than one release log (WithReleaseLog): one Release takes one")
		}
	}
	if err := checkAddedKey("WithReleaseLog", "release log list", r.list, l.resources, ""); err != nil {
		return nil, err
	}
	switch {
	case r.keep < 1:
		return nil, invalidf("release log length %d (WithReleaseLog) is below 1", r.keep)
	case r.ttl < time.Millisecond:
		return nil, invalidf("release log TTL %v (WithReleaseLog) is below 1ms", r.ttl)
	}
	withKey := *r
	withKey.key = l.c.cfg.keyPrefix + r.list
	return &withKey, nil
}

func (*releaseLog) part() script.Part { return releaseLogPart }

func (r *releaseLog) keys([]string) []string { return []string{r.key} }

// args passes the list's length and TTL, then the entries.
func (r *releaseLog) args(scriptKind, *attempt) []any {
	args := []any{strconv.Itoa(r.keep), r.ttl.Milliseconds()}
	for _, e := range r.entries {
		args = append(args, e)
	}
	return args
}
