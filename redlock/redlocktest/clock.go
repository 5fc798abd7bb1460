package redlocktest

import (
	"time"

	"github.com/jonboulle/clockwork"
)

// OffsetClock returns a real clock whose Now, Since and Until read offset
// ahead of the system clock (behind for a negative offset), to stand for an
// instance whose clock is skewed: pass it to gocron.WithClock and
// scheduler.WithClock. Timers and sleeps take relative durations and are
// unchanged. Safe for concurrent use.
func OffsetClock(offset time.Duration) clockwork.Clock {
	return offsetClock{Clock: clockwork.NewRealClock(), offset: offset}
}

type offsetClock struct {
	clockwork.Clock
	offset time.Duration
}

func (c offsetClock) Now() time.Time                  { return c.Clock.Now().Add(c.offset) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c offsetClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }
