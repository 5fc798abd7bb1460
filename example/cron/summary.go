package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// recorder collects the runs of the whole fleet and prints each one as it
// arrives. Safe for concurrent use.
type recorder struct {
	mu      sync.Mutex
	out     io.Writer
	offsets []time.Duration // clock offset of each instance
	runs    []jobRun
}

func newRecorder(out io.Writer, offsets []time.Duration) *recorder {
	return &recorder{out: out, offsets: offsets}
}

// add records x and prints it.
func (r *recorder) add(x jobRun) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs = append(r.runs, x)
	tick := "?"
	if !x.Tick.IsZero() {
		tick = x.Tick.Local().Format("15:04:05")
	}
	clock := "?"
	if x.Instance >= 0 && x.Instance < len(r.offsets) {
		clock = formatOffset(r.offsets[x.Instance])
	}
	fmt.Fprintf(r.out, "%s  %-6s  scheduled %s  ran on instance %d (clock %s)\n",
		x.Start.Local().Format("15:04:05.000"), x.Job, tick, x.Instance, clock)
}

// printf prints an event line between the run lines.
func (r *recorder) printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.out, format, args...)
}

// summarize judges the runs of ticks from..to and prints the summary to w.
// It returns an error when a tick ran twice or not at all.
// Ticks paused through the status page and its manual runs (ex) are
// neither missed nor off the grid.
func (r *recorder) summarize(w io.Writer, from, to time.Time, stats []instanceStats, ex excuses) error {
	r.mu.Lock()
	runs := slices.Clone(r.runs)
	r.mu.Unlock()
	verdicts := make([]verdict, len(jobs))
	for i, j := range jobs {
		verdicts[i] = judge(runs, j, len(r.offsets), from, to)
		verdicts[i].excuse(ex)
	}
	return printSummary(w, verdicts, runs, stats, r.offsets, from, to)
}

// verdict is the judgement of one job's ticks.
type verdict struct {
	job         jobSpec
	ticks       int         // expected ticks in the window
	runs        int         // runs of ticks in the window
	duplicates  []tickRuns  // ticks that ran more than once
	missed      []time.Time // expected ticks that never ran
	offGrid     []tickRuns  // runs of ticks that are not on the job's grid
	perInstance []int       // runs in the window, by instance
	paused      int         // ticks the run record has as paused (not missed)
	manual      int         // manual runs (run now), off the grid by design
}

// excuses are what the run record says of runs the status page asked
// for: the ticks skipped while a job was paused, and the manual runs of
// each job and instance.
type excuses struct {
	paused map[string]map[int64]bool // job -> tick (Unix ns)
	manual map[string]map[int]int    // job -> instance -> manual runs
}

// excuse moves the paused ticks out of v's misses and the manual runs
// out of its off-grid runs.
func (v *verdict) excuse(ex excuses) {
	v.missed = slices.DeleteFunc(v.missed, func(t time.Time) bool {
		if ex.paused[v.job.name][t.UnixNano()] {
			v.paused++
			return true
		}
		return false
	})
	manual := map[int]int{}
	for i, n := range ex.manual[v.job.name] {
		manual[i] = n
	}
	v.offGrid = slices.DeleteFunc(v.offGrid, func(o tickRuns) bool {
		if len(o.instances) == 1 && manual[o.instances[0]] > 0 {
			manual[o.instances[0]]--
			v.manual++
			return true
		}
		return false
	})
}

// tickRuns is a tick and the instances that ran it.
type tickRuns struct {
	tick      time.Time
	instances []int
}

// judge checks the runs of job against its grid in [from, to]: every
// multiple of job.every since the zero time must have exactly one run.
// Runs of other jobs, and of ticks outside the window, are ignored.
func judge(runs []jobRun, job jobSpec, instances int, from, to time.Time) verdict {
	v := verdict{job: job, perInstance: make([]int, instances)}
	byTick := make(map[int64][]int) // tick (Unix ns) -> instances that ran it
	ticks := make(map[int64]time.Time)
	for _, x := range runs {
		if x.Job != job.name {
			continue
		}
		if x.Tick.IsZero() { // a run that does not know its tick: a bug
			v.offGrid = append(v.offGrid, tickRuns{tick: x.Tick, instances: []int{x.Instance}})
			continue
		}
		if x.Tick.Before(from) || x.Tick.After(to) {
			continue
		}
		v.runs++
		if x.Instance >= 0 && x.Instance < instances {
			v.perInstance[x.Instance]++
		}
		k := x.Tick.UnixNano()
		byTick[k] = append(byTick[k], x.Instance)
		ticks[k] = x.Tick
	}

	first := from.Truncate(job.every)
	if first.Before(from) {
		first = first.Add(job.every)
	}
	for t := first; !t.After(to); t = t.Add(job.every) {
		v.ticks++
		k := t.UnixNano()
		switch got := byTick[k]; {
		case len(got) == 0:
			v.missed = append(v.missed, t)
		case len(got) > 1:
			v.duplicates = append(v.duplicates, tickRuns{tick: t, instances: got})
		}
		delete(byTick, k)
	}
	for k, got := range byTick { // left over: not on the grid
		v.offGrid = append(v.offGrid, tickRuns{tick: ticks[k], instances: got})
	}
	slices.SortFunc(v.offGrid, func(a, b tickRuns) int { return a.tick.Compare(b.tick) })
	return v
}

// printSummary writes the two tables and the verdict, and returns an error
// when a verdict failed.
func printSummary(w io.Writer, verdicts []verdict, runs []jobRun, stats []instanceStats, offsets []time.Duration, from, to time.Time) error {
	fmt.Fprintf(w, "\nJudged: the scheduled times from %s to %s (the first %v and the last %v of the run are left out: not every instance is running there).\n\n",
		from.Local().Format("15:04:05.0"), to.Local().Format("15:04:05.0"), judgeFrom, judgeUntil)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "job\tevery\tscheduled\truns\tduplicates\tmissed")
	for i := range offsets {
		fmt.Fprintf(tw, "\tinst %d", i)
	}
	fmt.Fprintln(tw)
	for _, v := range verdicts {
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\t%d", v.job.name, v.job.every, v.ticks, v.runs, len(v.duplicates), len(v.missed))
		for _, n := range v.perInstance {
			fmt.Fprintf(tw, "\t%d", n)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()

	// Per instance, over the whole run.
	total := make([]int, len(offsets))
	for _, x := range runs {
		if x.Instance >= 0 && x.Instance < len(total) {
			total[x.Instance]++
		}
	}
	fmt.Fprintf(w, "\nPer instance, over the whole run (a skip is a scheduled time that gocron did not run there because Lock failed):\n\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "instance\tclock\truns\tskips: held elsewhere\tskips: lock error")
	for _, s := range stats {
		held, failed := fmt.Sprint(s.HeldElsewhere), fmt.Sprint(s.LockErrors)
		if s.Unreported {
			held, failed = "-", "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s", s.Instance, formatOffset(offsets[s.Instance]), total[s.Instance], held, failed)
		if !s.KilledAt.IsZero() {
			fmt.Fprintf(tw, "\tkilled at %s", s.KilledAt.Local().Format("15:04:05.000"))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	for _, s := range stats {
		if s.FirstError != "" {
			fmt.Fprintf(w, "instance %d, first lock error: %s\n", s.Instance, s.FirstError)
		}
	}
	for _, v := range verdicts {
		if v.paused+v.manual > 0 {
			fmt.Fprintf(w, "%s: %d scheduled time(s) skipped while paused, %d manual run(s), through the status page.\n", v.job.name, v.paused, v.manual)
		}
	}
	fmt.Fprintln(w, "\nThe instance that fires first (its clock furthest ahead) usually takes the scheduled time; the others find it held.")

	// Verdict.
	var dups, missed, stray int
	for _, v := range verdicts {
		dups += len(v.duplicates)
		missed += len(v.missed)
		stray += len(v.offGrid)
		for _, d := range v.duplicates {
			fmt.Fprintf(w, "DUPLICATE: %s at %s ran %d times, on instances %s\n",
				v.job.name, d.tick.Local().Format("15:04:05"), len(d.instances), joinInts(d.instances))
		}
		for _, t := range v.missed {
			fmt.Fprintf(w, "MISSED: %s at %s ran on no instance\n", v.job.name, t.Local().Format("15:04:05"))
		}
		for _, o := range v.offGrid {
			fmt.Fprintf(w, "OFF GRID: %s ran for %s, which is not a scheduled time of the job, on instances %s\n",
				v.job.name, o.tick.Local().Format("15:04:05.000"), joinInts(o.instances))
		}
	}
	judged := 0
	for _, v := range verdicts {
		judged += v.ticks
	}
	switch {
	case dups+missed+stray > 0:
		return fmt.Errorf("%d scheduled time(s) ran more than once, %d never ran, %d run(s) off the grid", dups, missed, stray)
	case judged == 0:
		return fmt.Errorf("no scheduled time to judge: the run was too short")
	}
	fmt.Fprintln(w, "OK: every scheduled time ran exactly once")
	return nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
