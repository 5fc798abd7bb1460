package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
)

// printRecord reads each job's run record from the nodes at addrs, as any
// instance of the fleet could (scheduler.Locker.History), and prints, for
// the scheduled times from..to, who ran them and how many were missed or
// skipped as late.
func printRecord(ctx context.Context, w io.Writer, addrs []string, from, to time.Time, length int) error {
	nodes := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
	}
	defer func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	}()
	locks, err := redlock.New(nodes)
	if err != nil {
		return err
	}
	defer locks.Close(context.Background())
	reader, err := scheduler.NewLocker(locks, scheduler.WithInstanceID("reader"), scheduler.WithHistoryLength(length))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nFrom the run record on the nodes (scheduler.History: its newest %d entries per job), for the same scheduled times:\n\n",
		length)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "job\tscheduled times run\tran on\tmissed\tlate skips\tfailed\tlatest")
	for _, j := range jobs {
		runs, err := reader.History(ctx, j.name, length)
		if err != nil {
			return fmt.Errorf("reading the run record of %s: %w", j.name, err)
		}
		s := summarizeRecord(runs, from, to)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%s\n", j.name, s.ran, s.byInstance(), s.missed, s.late, s.failed, s.latest)
	}
	return tw.Flush()
}

// readExcuses reads from the run record the ticks that the status page's
// pause skipped and its manual runs, by job and instance (instance-N).
func readExcuses(ctx context.Context, addrs []string, length int) (excuses, error) {
	ex := excuses{paused: map[string]map[int64]bool{}, manual: map[string]map[int]int{}}
	nodes := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
	}
	defer func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	}()
	locks, err := redlock.New(nodes)
	if err != nil {
		return ex, err
	}
	defer locks.Close(context.Background())
	reader, err := scheduler.NewLocker(locks, scheduler.WithInstanceID("reader"), scheduler.WithHistoryLength(length))
	if err != nil {
		return ex, err
	}
	for _, j := range jobs {
		runs, err := reader.History(ctx, j.name, length)
		if err != nil {
			return ex, fmt.Errorf("reading the run record of %s: %w", j.name, err)
		}
		ex.paused[j.name], ex.manual[j.name] = map[int64]bool{}, map[int]int{}
		for _, r := range runs {
			var i int
			switch {
			case r.Outcome == "paused":
				ex.paused[j.name][r.Scheduled.UnixNano()] = true
			case r.Kind == "manual":
				if _, err := fmt.Sscanf(r.Instance, "instance-%d", &i); err == nil {
					ex.manual[j.name][i]++
				}
			}
		}
	}
	return ex, nil
}

// recordSummary counts a job's run record over a window of scheduled
// times.
type recordSummary struct {
	ran, missed, late, failed int
	paused                    int
	instances                 map[string]int
	latest                    string
}

func summarizeRecord(runs []scheduler.Run, from, to time.Time) recordSummary {
	s := recordSummary{instances: map[string]int{}, latest: "-"}
	for _, r := range runs {
		if s.latest == "-" && r.Kind == "scheduled" {
			s.latest = fmt.Sprintf("%s by %s, %s", r.Scheduled.Local().Format("15:04:05"), r.Instance, r.Outcome)
		}
		if r.Scheduled.Before(from) || r.Scheduled.After(to) {
			continue
		}
		switch r.Kind {
		case "scheduled", "catch-up":
			if r.Outcome == "paused" {
				s.paused++
				continue
			}
			s.ran++
			s.instances[r.Instance]++
			if r.Outcome == "failed" || r.Outcome == "lost" {
				s.failed++
			}
		case "missed":
			s.missed += r.Missed
		case "late":
			s.late++
		}
	}
	return s
}

// byInstance reads "instance-0: 3, instance-1: 2".
func (s recordSummary) byInstance() string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(s.instances)) {
		parts = append(parts, fmt.Sprintf("%s: %d", id, s.instances[id]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// recordLength is the length of the run record (scheduler.WithHistoryLength)
// of every scheduler of a demo that runs for d: room for each scheduled
// time of its fastest job (every second) with a late, missed or paused
// entry beside it, so that the checks at the end find the status page's
// pauses and manual runs of the whole run in the record. The default, 100,
// would drop them after about a minute. Capped at the Locker's maximum.
func recordLength(d time.Duration) int {
	return min(max(scheduler.DefaultHistoryLength, 2*int(d/time.Second)+100), 10_000)
}
