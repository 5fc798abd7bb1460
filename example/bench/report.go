package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// column is one figure of a table.
type column struct {
	key    string
	header string
	format func(float64) string
	ratio  bool // show ours ÷ this library in peer rows
}

func fmtRate(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2fk", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// fmtMs formats a duration given in milliseconds.
func fmtMs(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.0f µs", v*1000)
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 1000:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f s", v/1000)
}

func fmtUs(v float64) string { return fmtMs(v / 1000) }

func fmtInt(v float64) string { return fmt.Sprintf("%.0f", v) }

func fmt1(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func fmt2(v float64) string { return fmt.Sprintf("%.2f", v) }

var tableColumns = map[string][]column{
	wSeq: {
		{mOpsPerSec, "ops/s", fmtRate, true},
		{mP50us, "p50", fmtUs, true},
		{mP99us, "p99", fmtUs, true},
		{mCmdsPerOp, "cmds sent / op", fmt2, true},
		{mErrors, "errors", fmtInt, false},
	},
	wPar: {
		{mOpsPerSec, "ops/s", fmtRate, true},
		{mCmdsPerOp, "cmds sent / op", fmt2, true},
		{mAllocs, "allocs/op", fmtInt, true},
		{mErrors, "errors", fmtInt, false},
	},
	wContended: {
		{mAcqPerSec, "acquisitions/s", fmtRate, true},
		{mHandoffP50ms, "handoff p50", fmtMs, true},
		{mHandoffP99ms, "handoff p99", fmtMs, true},
		{mClientCmds, "cmds sent / acq.", fmt1, true},
		{mServerCmds, "cmds run / acq.", fmt1, true},
		{mErrors, "gave up", fmtInt, false},
		{mOverlaps, "overlaps", fmtInt, false},
	},
	wPaused: {
		{mOps, "ops", fmtInt, false},
		{mAcqP50ms, "acquire p50", fmtMs, true},
		{mAcqP99ms, "acquire p99", fmtMs, true},
		{mRelP50ms, "release p50", fmtMs, true},
		{mRelP99ms, "release p99", fmtMs, true},
		{mErrors, "errors", fmtInt, false},
	},
	wAllocs: {
		{mAllocs, "allocs/op", fmtInt, true},
		{mBytes, "B/op", fmtInt, true},
		{mErrors, "errors", fmtInt, false},
	},
}

var tableTitles = map[string]string{
	wSeq:       "1. Sequential acquire+release, one key",
	wPar:       "2. Parallel acquire+release, %d goroutines on distinct keys",
	wContended: "3. Contended: %d goroutines on one key, each holding %s",
	wPaused:    "4. One node paused (SIGSTOP) for the whole run: sequential acquire, then release",
	wAllocs:    "5. Allocations per acquire+release (sequential, runtime.MemStats deltas)",
	wSched:     "6. Scheduler scale",
}

// writeTables writes one Markdown table per workload.
func writeTables(w io.Writer, out output) {
	m := out.Meta
	fmt.Fprintf(w, "Run: `%s` — %s, %s, Go %s, GOMAXPROCS %d, %s, redis-server %s, lock TTL %s, %d rounds, go-redis ContextTimeoutEnabled %v; library at %s; load average %s before, %s after.\n\n",
		m.Command, m.Started.Format("2006-01-02 15:04"), m.Duration, strings.TrimPrefix(m.GoVersion, "go"), m.GOMAXPROCS, m.CPU, m.Redis, m.TTL, m.Rounds, m.CtxTimeout, m.Library,
		m.LoadBefore, m.LoadAfter)
	fmt.Fprintln(w, "In peer rows, (x) is ours ÷ that library, same column: above 1 means ours is higher —")
	fmt.Fprintln(w, "better for rates, worse for latencies, commands and allocations. \"spread\" is the")
	fmt.Fprintln(w, "lowest and highest round of the main figure.")
	fmt.Fprintln(w)
	cfgTitle := func(wl string) string {
		t := tableTitles[wl]
		switch wl {
		case wPar:
			return fmt.Sprintf(t, m.Goroutines)
		case wContended:
			return fmt.Sprintf(t, m.Contenders, m.Hold)
		}
		return t
	}
	for _, wl := range []string{wSeq, wPar, wContended, wPaused, wAllocs, wSched} {
		var rs []result
		for _, r := range out.Results {
			if r.Workload == wl {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		fmt.Fprintf(w, "#### %s\n\n", cfgTitle(wl))
		if wl == wSched {
			writeSched(w, rs)
			continue
		}
		cols := tableColumns[wl]
		spread := rs[0].Main != "" && wl != wPaused
		hdr := []string{"nodes", "library"}
		for _, c := range cols {
			hdr = append(hdr, c.header)
		}
		if spread {
			hdr = append(hdr, "spread")
		}
		fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))
		for _, r := range rs {
			ours := find(out.Results, wl, r.Nodes, libOurs)
			row := []string{fmt.Sprint(r.Nodes), libLabel(r.Lib)}
			for _, c := range cols {
				v := r.Metrics[c.key]
				cell := c.format(v)
				if c.ratio && r.Lib != libOurs && ours != nil {
					cell += " " + fmtRatio(ours.Metrics[c.key], v)
				}
				if r.Lib == libOurs {
					cell = "**" + cell + "**"
				}
				row = append(row, cell)
			}
			if spread {
				row = append(row, fmtSpread(r))
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
		fmt.Fprintln(w)
		for _, r := range rs {
			if r.Note != "" {
				fmt.Fprintf(w, "- %s, %d nodes: %s\n", r.Lib, r.Nodes, r.Note)
			}
		}
		fmt.Fprintln(w)
	}
}

func libLabel(name string) string {
	if name == libFloor {
		return "floor (go-redis fan-out)"
	}
	return name
}

func fmtRatio(ours, peer float64) string {
	if peer == 0 || math.IsNaN(peer) {
		return "(–)"
	}
	r := ours / peer
	switch {
	case r < 0.1 && r > 0:
		return fmt.Sprintf("(1/%.0f)", 1/r)
	case r >= 100:
		return fmt.Sprintf("(%.0f)", r)
	case r >= 10:
		return fmt.Sprintf("(%.1f)", r)
	}
	return fmt.Sprintf("(%.2f)", r)
}

func fmtSpread(r result) string {
	if len(r.PerRound) < 2 {
		return ""
	}
	lo, hi := slices.Min(r.PerRound), slices.Max(r.PerRound)
	f := fmtRate
	if r.Main == mAcqP99ms {
		f = fmtMs
	}
	return f(lo) + "–" + f(hi)
}

func find(rs []result, wl string, n int, name string) *result {
	for i := range rs {
		if rs[i].Workload == wl && rs[i].Nodes == n && rs[i].Lib == name {
			return &rs[i]
		}
	}
	return nil
}

func writeSched(w io.Writer, rs []result) {
	m0 := rs[0].Metrics
	fmt.Fprintf(w, "Cron jobs `* * * * * *` on each of %.0f scheduler.Scheduler instances in one process (each with its own go-redis clients and redlock.Client), %d nodes, a window of %.0f whole ticks after a warm-up. Ours only: the peers have no gocron adapter.\n\n",
		m0[mInstances], rs[0].Nodes, m0[mWindowSeconds])
	hdr := []string{"figure"}
	for _, r := range rs {
		hdr = append(hdr, fmt.Sprintf("%.0f jobs", r.Metrics[mJobs]))
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))
	rows := []struct {
		name string
		f    func(m map[string]float64) string
	}{
		{"job-ticks in the window", func(m map[string]float64) string { return fmtInt(m[mJobTicks]) }},
		{"runs per job-tick (want 1)", func(m map[string]float64) string { return fmt2(m[mRunsPerTick]) }},
		{"job-ticks missed / run twice", func(m map[string]float64) string { return fmt.Sprintf("%.0f / %.0f", m[mMissed], m[mDup]) }},
		{"Redis commands per job-tick, issued by clients (incl. ones that timed out before sending)", func(m map[string]float64) string { return fmt1(m[mClientCmdsTick]) }},
		{"Redis commands per job-tick, run by servers (incl. inside scripts)", func(m map[string]float64) string { return fmt1(m[mServerCmdsTick]) }},
		{"client CPU, all instances (cores)", func(m map[string]float64) string { return fmt2(m[mCPUCores]) }},
		{"client CPU per job-tick", func(m map[string]float64) string { return fmtUs(m[mCPUPerTickUS]) }},
		{"redis-server CPU, all nodes (cores)", func(m map[string]float64) string { return fmt2(m[mRedisCPUCores]) }},
		{"CPU stolen by the hypervisor, all vCPUs (cores)", func(m map[string]float64) string {
			if v, ok := m[mStolenCores]; ok {
				return fmt2(v)
			}
			return "unknown"
		}},
		{"Lock errors: held elsewhere / other", func(m map[string]float64) string {
			return fmt.Sprintf("%.0f / %.0f", m[mLockErrHeld], m[mLockErrOther])
		}},
	}
	for _, x := range rows {
		row := []string{x.name}
		for _, r := range rs {
			row = append(row, x.f(r.Metrics))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
	for _, r := range rs {
		if r.Note != "" {
			fmt.Fprintf(w, "- %.0f jobs: %s\n", r.Metrics[mJobs], r.Note)
		}
	}
	fmt.Fprintln(w)
}

// summary is a one-line progress report of a result.
func summary(r result) string {
	if r.Workload == wSched {
		m := r.Metrics
		return fmt.Sprintf("runs/tick %.3f missed %.0f dup %.0f cmds/tick %.1f (sent %.1f) cpu %.2f cores redis %.2f cores stolen %.2f cores",
			m[mRunsPerTick], m[mMissed], m[mDup], m[mServerCmdsTick], m[mClientCmdsTick], m[mCPUCores], m[mRedisCPUCores], m[mStolenCores])
	}
	var parts []string
	for _, c := range tableColumns[r.Workload] {
		parts = append(parts, c.header+" "+c.format(r.Metrics[c.key]))
	}
	return strings.Join(parts, ", ")
}
