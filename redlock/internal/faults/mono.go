package faults

import (
	"time"

	"golang.org/x/sys/unix"
)

// Holders in child processes report instants as CLOCK_MONOTONIC readings
// (nanoseconds), the clock Go's monotonic time is read from on Linux and
// the same for every process of the machine; MonoToTime places them on
// this process's monotonic clock so that the checker compares them with
// the parent's own instants.

// MonoNow returns the CLOCK_MONOTONIC reading in nanoseconds.
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("faults: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// MonoOf returns the CLOCK_MONOTONIC reading of t, an instant of this
// process with a monotonic reading.
func MonoOf(t time.Time) int64 { return epoch.mono + int64(t.Sub(epoch.t)) }

// MonoToTime returns the instant of this process that corresponds to the
// CLOCK_MONOTONIC reading ns.
func MonoToTime(ns int64) time.Time { return epoch.t.Add(time.Duration(ns - epoch.mono)) }

var epoch = func() (e struct {
	t    time.Time
	mono int64
}) {
	e.t = time.Now()
	e.mono = MonoNow()
	return e
}()
