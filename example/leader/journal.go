package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"
)

// stamp is the format of the time at the start of each event line.
const stamp = "15:04:05.000"

// leadership is one leadership of one candidate. start and end are read
// from time.Now, so they carry the process's monotonic clock reading, and
// Before and Sub compare them on that clock.
type leadership struct {
	who    string
	term   uint64
	start  time.Time // when OnStartedLeading was called
	end    time.Time // when its ctx was done; zero while it lasts
	items  int       // items it processed
	reason string    // how it ended: "crash", "graceful stop", "end of run", ...
}

// killRecord is one kill of a leader and the takeover that followed.
type killRecord struct {
	kind     killKind
	victim   string
	term     uint64
	at       time.Time
	by       string        // the next leader; "" if none before the end
	takeover time.Duration // from at to the next call of OnStartedLeading
	took     chan struct{} // closed when the next leader has started
}

// journal records and prints the leaderships and kills of the demo, one
// line per event as it happens. Safe for concurrent use.
type journal struct {
	mu          sync.Mutex
	out         io.Writer
	leaderships []*leadership
	kills       []*killRecord
	pending     *killRecord // the last kill, until a new leader takes over
	items       int         // items processed by all leaders
}

func newJournal(out io.Writer) *journal { return &journal{out: out} }

// lineLocked prints one event line stamped with now; j.mu is held.
func (j *journal) lineLocked(now time.Time, format string, args ...any) {
	fmt.Fprintf(j.out, "%s  "+format, append([]any{now.Format(stamp)}, args...)...)
}

// printf prints one event line stamped with the current time.
func (j *journal) printf(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lineLocked(time.Now(), format, args...)
}

// started records the start of a leadership, now, and prints it with the
// takeover time when it follows a kill.
func (j *journal) started(who string, term uint64) *leadership {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	l := &leadership{who: who, term: term, start: now}
	j.leaderships = append(j.leaderships, l)
	if k := j.pending; k != nil {
		j.pending = nil
		k.by, k.takeover = who, now.Sub(k.at)
		close(k.took)
		j.lineLocked(now, "%s is leader (term %d): took over %v after the %s of %s\n",
			who, term, k.takeover.Round(time.Millisecond), k.kind, k.victim)
	} else {
		j.lineLocked(now, "%s is leader (term %d)\n", who, term)
	}
	return l
}

// processed records and prints one item processed by the leadership l.
func (j *journal) processed(l *leadership) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.items++
	l.items++
	j.lineLocked(time.Now(), "%s (term %d)  processed item %d\n", l.who, l.term, j.items)
}

// ended records the end of the leadership l, now.
func (j *journal) ended(l *leadership, reason string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	l.end, l.reason = time.Now(), reason
}

// current returns the leadership that has not ended (the latest one, if
// there were several), or nil. Only its who and term may be read without
// the journal's lock.
func (j *journal) current() *leadership {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, l := range slices.Backward(j.leaderships) {
		if l.end.IsZero() {
			return l
		}
	}
	return nil
}

// pendingTakeover returns a channel closed when a leader starts after the
// last kill, or nil when no kill waits for its takeover.
func (j *journal) pendingTakeover() <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.pending == nil {
		return nil
	}
	return j.pending.took
}

// killed records and prints the kill of the leadership l.
func (j *journal) killed(kind killKind, l *leadership, cfg config) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	k := &killRecord{kind: kind, victim: l.who, term: l.term, at: now, took: make(chan struct{})}
	j.kills = append(j.kills, k)
	j.pending = k
	switch kind {
	case crash:
		j.lineLocked(now, "CRASH %s (term %d): its clients are closed, then it stops; it cannot resign,\n"+
			"              so its lease stays on the nodes until it expires (within the TTL, %v)\n", l.who, l.term, cfg.ttl)
	default:
		j.lineLocked(now, "STOP %s (term %d) gracefully: it resigns, deleting its lease\n", l.who, l.term)
	}
}

// summarize prints the summary of the run to w and returns the verdict of
// check: an error when two leaderships overlapped, a term did not
// increase, or no instance led at all.
func (j *journal) summarize(w io.Writer, cfg config, elapsed time.Duration) error {
	j.mu.Lock()
	ls := make([]leadership, len(j.leaderships))
	for i, l := range j.leaderships {
		ls[i] = *l
	}
	ks := make([]killRecord, len(j.kills))
	for i, k := range j.kills {
		ks[i] = *k
	}
	items := j.items
	j.mu.Unlock()

	fmt.Fprintf(w, "\nSummary of %v\n\n", elapsed.Round(10*time.Millisecond))
	fmt.Fprintf(w, "leaderships: %d (items processed: %d)\n", len(ls), items)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  term\tleader\tfrom\tto\tled for\titems\tended by")
	for _, l := range ls {
		to, led := "-", "-"
		if !l.end.IsZero() {
			to, led = l.end.Format(stamp), l.end.Sub(l.start).Round(10*time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%d\t%s\n", l.term, l.who, l.start.Format(stamp), to, led, l.items, l.reason)
	}
	_ = tw.Flush()

	printKills(w, ks, cfg)

	minGap, err := check(ls)
	switch {
	case err != nil:
		fmt.Fprintf(w, "\nFAILED: %v\n", err)
		return err
	case len(ls) == 1:
		fmt.Fprintf(w, "\ncheck: OK: no overlap (there was only one leadership).\n")
	default:
		fmt.Fprintf(w, "\ncheck: OK: no overlap: each leadership ended before the next began (closest: %v apart);\n"+
			"       terms strictly increased.\n", minGap.Round(time.Microsecond))
	}
	return nil
}

// printKills prints the kills, their takeovers and the longest takeover of
// each kind, with the time it should stay below.
func printKills(w io.Writer, ks []killRecord, cfg config) {
	var n, took [3]int
	var longest [3]time.Duration
	for _, k := range ks {
		n[k.kind]++
		if k.by != "" {
			took[k.kind]++
			longest[k.kind] = max(longest[k.kind], k.takeover)
		}
	}
	fmt.Fprintf(w, "\nkills: %d (crash: %d, graceful: %d)\n", len(ks), n[crash], n[graceful])
	for _, k := range ks {
		next := "no new leader before the end"
		if k.by != "" {
			next = fmt.Sprintf("%s led %v later", k.by, k.takeover.Round(time.Millisecond))
		}
		fmt.Fprintf(w, "  %s  %-13s of %s (term %d): %s\n", k.at.Format(stamp), k.kind, k.victim, k.term, next)
	}
	// Expected takeover times: after a crash, the lease expires at most one
	// TTL after its last renewal, and a candidate retries within one retry
	// period (+10% jitter); after a resign, only the retry period is left.
	retry := cfg.retry() + cfg.retry()/10
	bounds := [3]time.Duration{crash: cfg.ttl + retry, graceful: retry}
	const slack = 250 * time.Millisecond // Redis round trips, scheduling
	for _, kind := range []killKind{crash, graceful} {
		if took[kind] == 0 {
			continue
		}
		fmt.Fprintf(w, "longest takeover after a %s: %v (expected: below about %v)\n",
			kind, longest[kind].Round(time.Millisecond), bounds[kind].Round(time.Millisecond))
		if longest[kind] > bounds[kind]+slack {
			fmt.Fprintf(w, "  NOTE: that is more than %v above the expected bound\n", slack)
		}
	}
}

// check verifies the leaderships ls, on the monotonic clock: no two of them
// overlapped, and each began with a greater term than the one that began
// before it. A leadership that has not ended lasts forever. It returns the
// smallest gap between the end of one leadership and the start of the next.
func check(ls []leadership) (minGap time.Duration, err error) {
	if len(ls) == 0 {
		return 0, errors.New("no instance became leader")
	}
	ls = slices.Clone(ls)
	slices.SortStableFunc(ls, func(a, b leadership) int { return a.start.Compare(b.start) })
	var errs []error
	minGap = -1
	last := ls[0] // the leadership that ends last among those checked
	for i, l := range ls[1:] {
		prev := ls[i]
		if l.term <= prev.term {
			errs = append(errs, fmt.Errorf("term %d of %s (from %s) is not greater than term %d of %s, which began before it",
				l.term, l.who, l.start.Format(stamp), prev.term, prev.who))
		}
		switch {
		case last.end.IsZero():
			errs = append(errs, fmt.Errorf("leaderships overlapped: %s (term %d) began at %s while %s (term %d) never ended",
				l.who, l.term, l.start.Format(stamp), last.who, last.term))
		case l.start.Before(last.end):
			errs = append(errs, fmt.Errorf("leaderships overlapped: %s (term %d) began at %s, %v before %s (term %d) ended",
				l.who, l.term, l.start.Format(stamp), last.end.Sub(l.start), last.who, last.term))
		default:
			if gap := l.start.Sub(last.end); minGap < 0 || gap < minGap {
				minGap = gap
			}
		}
		if !last.end.IsZero() && (l.end.IsZero() || l.end.After(last.end)) {
			last = l
		}
	}
	return max(minGap, 0), errors.Join(errs...)
}
