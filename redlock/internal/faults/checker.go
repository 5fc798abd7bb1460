package faults

import (
	"fmt"

	"github.com/anishathalye/porcupine"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/schedlock/schedlock/redlock"
)

// Window is one believed-ownership interval of one lock: from the moment
// Acquire returned it to the moment its holder stopped believing it held
// it (it began releasing, noticed the loss, or died). All instants are on
// the monotonic clock of the test process; holders in child processes
// report theirs through MonoToTime.
type Window struct {
	Lock     int    // unique per lock (per successful acquisition)
	Resource string // resource name
	Owner    string // holder's name
	Attempt  time.Time
	Start    time.Time
	End      time.Time
	// Until is the lock's validity deadline (Lock.Until) as the holder last
	// knew it. A holder that respects validity does no guarded work after
	// Until, so its window ends at Until at the latest.
	Until time.Time
	// Token is the lock's fencing token (0 without fencing).
	Token uint64
	// IgnoresValidity marks a holder that believes it holds the lock until
	// End even after Until: the negative control of a client that does not
	// check validity.
	IgnoresValidity bool
}

// Effective returns the end of the window as the checker sees it: End, or
// Until if that is earlier and the holder respects validity.
func (w Window) Effective() time.Time {
	if w.IgnoresValidity || w.Until.IsZero() || w.End.Before(w.Until) {
		return w.End
	}
	return w.Until
}

// Work is one guarded action (a write to the protected resource) started
// by a holder.
type Work struct {
	Lock     int
	Resource string
	Owner    string
	At       time.Time // when the action started
	Until    time.Time // the lock's validity deadline as the holder knew it then
	Token    uint64
}

// History records windows and guarded work from many goroutines. Safe for
// concurrent use.
type History struct {
	mu      sync.Mutex
	next    int
	windows []Window
	work    []Work
}

// Hold is one lock being held, as recorded in a History.
type Hold struct {
	h    *History
	w    Window
	l    *redlock.Lock
	once sync.Once
}

// Begin records that l (acquired for resource by owner; Acquire was called
// at attempt) was returned now, and returns the Hold on which the holder
// reports its work and its end.
func (h *History) Begin(resource, owner string, attempt time.Time, l *redlock.Lock) *Hold {
	now := time.Now()
	h.mu.Lock()
	h.next++
	id := h.next
	h.mu.Unlock()
	return &Hold{h: h, l: l, w: Window{Lock: id, Resource: resource, Owner: owner, Attempt: attempt,
		Start: now, Until: l.Until(), Token: l.FencingToken()}}
}

// NewLockID returns a fresh lock id for windows recorded with Add.
func (h *History) NewLockID() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	return h.next
}

// Act is a holder that respects validity about to start a guarded
// action: if the lock's validity deadline has not passed, it records the
// action and returns true; otherwise it records nothing and returns false,
// and the holder must not act.
func (hd *Hold) Act() bool {
	now := time.Now()
	until := hd.l.Until()
	if !now.Before(until) {
		return false
	}
	hd.record(now, until)
	return true
}

// ActBlindly records a guarded action starting now without checking
// validity: the negative control of a holder that ignores it.
func (hd *Hold) ActBlindly() { hd.record(time.Now(), hd.l.Until()) }

func (hd *Hold) record(at, until time.Time) {
	hd.h.AddWork(Work{Lock: hd.w.Lock, Resource: hd.w.Resource, Owner: hd.w.Owner, At: at, Until: until, Token: hd.w.Token})
}

// End closes the window now (the holder begins to release, or noticed the
// loss). Later calls do nothing.
func (hd *Hold) End() { hd.end(time.Now(), false) }

// EndIgnoringValidity closes the window now for a holder that ignored
// validity: the window runs to now even past Until (negative control).
func (hd *Hold) EndIgnoringValidity() { hd.end(time.Now(), true) }

func (hd *Hold) end(at time.Time, ignores bool) {
	hd.once.Do(func() {
		w := hd.w
		w.End, w.IgnoresValidity = at, ignores
		if u := hd.l.Until(); u.After(w.Until) {
			w.Until = u
		}
		hd.h.Add(w)
	})
}

// Start returns when the window began.
func (hd *Hold) Start() time.Time { return hd.w.Start }

// Add records a complete window (holders in child processes).
func (h *History) Add(w Window) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.windows = append(h.windows, w)
}

// AddWork records a guarded action (holders in child processes).
func (h *History) AddWork(x Work) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.work = append(h.work, x)
}

// Windows returns a copy of the recorded windows, by start.
func (h *History) Windows() []Window {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Clone(h.windows)
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Check runs the checker over everything recorded, and porcupine beside
// it (Verdict.Linearizable).
func (h *History) Check() Verdict {
	h.mu.Lock()
	w, x := slices.Clone(h.windows), slices.Clone(h.work)
	h.mu.Unlock()
	v := Check(w, x)
	v.Linearizable = linearizable(w, x)
	return v
}

// Agree reports whether porcupine agrees with the checker: a history is
// linearizable exactly when the checker finds nothing (a verdict that
// timed out agrees with anything).
func (v Verdict) Agree() bool {
	return v.Linearizable == porcupine.Unknown || (v.Linearizable == porcupine.Ok) == v.OK()
}

// Verdict is what the checker found.
type Verdict struct {
	Windows int
	// Overlaps counts pairs of windows of one resource, of different
	// locks, that overlap in time (effective ends).
	Overlaps int
	// TokenViolations counts windows (with a fencing token) whose token is
	// not above every token of the windows that started before them.
	TokenViolations int
	// LateWork counts guarded actions started at or after the validity
	// deadline the holder knew.
	LateWork int
	// Linearizable is porcupine's verdict on the same history
	// (linearizable.go): Ok, Illegal, or Unknown when its search timed
	// out; "" when not run (Check alone).
	Linearizable porcupine.CheckResult
	// Examples describes the first few violations.
	Examples []string
}

// OK reports whether nothing was violated.
func (v Verdict) OK() bool { return v.Overlaps == 0 && v.TokenViolations == 0 && v.LateWork == 0 }

func (v Verdict) String() string {
	return fmt.Sprintf("%d windows: %d overlaps, %d token violations, %d late actions, linearizable: %s %q",
		v.Windows, v.Overlaps, v.TokenViolations, v.LateWork, v.Linearizable, v.Examples)
}

const maxExamples = 5

// Check finds overlapping windows, non-monotonic fencing tokens and late
// guarded work.
func Check(windows []Window, work []Work) Verdict {
	v := Verdict{Windows: len(windows)}
	example := func(format string, args ...any) {
		if len(v.Examples) < maxExamples {
			v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
		}
	}
	byRes := map[string][]Window{}
	for _, w := range windows {
		byRes[w.Resource] = append(byRes[w.Resource], w)
	}
	res := make([]string, 0, len(byRes))
	for r := range byRes {
		res = append(res, r)
	}
	sort.Strings(res)
	for _, r := range res {
		ws := byRes[r]
		sort.Slice(ws, func(i, j int) bool { return ws[i].Start.Before(ws[j].Start) })
		var origin time.Time
		if len(ws) > 0 {
			origin = ws[0].Start
		}
		// Overlaps: every earlier window still open when this one starts.
		for j := range ws {
			for i := j - 1; i >= 0; i-- {
				if ws[i].Lock != ws[j].Lock && ws[j].Start.Before(ws[i].Effective()) {
					v.Overlaps++
					example("%s: %s (lock %d, +%v..+%v) overlaps %s (lock %d, +%v..+%v)", r,
						ws[j].Owner, ws[j].Lock, ws[j].Start.Sub(origin), ws[j].Effective().Sub(origin),
						ws[i].Owner, ws[i].Lock, ws[i].Start.Sub(origin), ws[i].Effective().Sub(origin))
				}
			}
		}
		// Tokens: strictly increasing in the order of the windows.
		var top uint64
		for _, w := range ws {
			if w.Token == 0 {
				continue
			}
			if w.Token <= top {
				v.TokenViolations++
				example("%s: %s got token %d at +%v after token %d", r, w.Owner, w.Token, w.Start.Sub(origin), top)
			}
			top = max(top, w.Token)
		}
	}
	for _, x := range work {
		if !x.At.Before(x.Until) {
			v.LateWork++
			example("%s: %s acted %v after its deadline", x.Resource, x.Owner, x.At.Sub(x.Until))
		}
	}
	return v
}

// FirstStartAfter returns the first window of resource that started at or
// after t.
func FirstStartAfter(windows []Window, resource string, t time.Time) (Window, bool) {
	var best Window
	found := false
	for _, w := range windows {
		if w.Resource == resource && !w.Start.Before(t) && (!found || w.Start.Before(best.Start)) {
			best, found = w, true
		}
	}
	return best, found
}

// Run is one execution of a scheduled job, for the per-tick check.
type Run struct {
	Tick       time.Time // the tick the run served (scheduler.TickFromContext)
	Instance   int
	Start, End time.Time
}

// TickTally counts, for runs of one job with ticks on a grid of step, the
// ticks in (from, to) that never ran and the ticks that ran more than once
// (anywhere).
type TickTally struct{ Judged, Duplicates, Missed int }

// Tally computes a TickTally.
func Tally(runs []Run, step time.Duration, from, to time.Time) TickTally {
	byTick := map[time.Time]int{}
	for _, r := range runs {
		byTick[r.Tick]++
	}
	var v TickTally
	for _, n := range byTick {
		if n > 1 {
			v.Duplicates++
		}
	}
	for tick := from.Truncate(step).Add(step); tick.Before(to); tick = tick.Add(step) {
		v.Judged++
		if byTick[tick] == 0 {
			v.Missed++
		}
	}
	return v
}

// Percentile returns the p-th percentile (0 < p <= 100, nearest rank) of
// ds, or 0 for none.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// PercentileInt is Percentile for counts.
func PercentileInt(xs []int, p float64) int {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	k := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(k, 0), len(s)-1)]
}
