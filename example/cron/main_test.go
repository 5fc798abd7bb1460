package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInProcessDefault(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-duration", "6s"}, &out); err != nil {
		t.Fatalf("run() = %v, want nil; output:\n%s", err, out.String())
	}
	checkExactlyOnce(t, out.String(), 3)
}

func TestProcessModeRealRedis(t *testing.T) {
	t.Parallel()
	cluster := redlocktest.Start(t, 3)
	bin := buildExample(t)
	out := runExample(t, bin, "-mode", "process", "-redis", strings.Join(cluster.Addrs(), ","), "-duration", "8s")
	checkExactlyOnce(t, out, 3)
}

func TestProcessModeKillOne(t *testing.T) {
	t.Parallel()
	cluster := redlocktest.Start(t, 3)
	bin := buildExample(t)
	// 10s, not 8s: the kill lands 5-6s in (mid-tick of instance 2) and the
	// judged window ends 8.7s in, so at least 2.7s of it follow the kill and
	// hold a tick of the 2s job. With 8s that stretch was 1.7-2.7s and, on
	// an unlucky phase, held no sync tick at all (a CI run failed so).
	out := runExample(t, bin, "-mode", "process", "-kill-one", "-redis", strings.Join(cluster.Addrs(), ","), "-duration", "10s")
	rows := checkExactlyOnce(t, out, 3)
	// Instance 2 (+250ms) fires first and is the one killed; the others
	// must have run the judged ticks after the kill.
	if !strings.Contains(out, "SIGKILL instance 2") || !strings.Contains(out, "killed at") {
		t.Errorf("output does not report the kill of instance 2:\n%s", out)
	}
	for _, r := range rows {
		if r.perInstance[0]+r.perInstance[1] == 0 {
			t.Errorf("job %s: instances 0 and 1 ran no judged tick after instance 2 was killed:\n%s", r.job, out)
		}
	}
}

// TestJudge is the negative control: the summary must catch a tick that ran
// twice, a tick that never ran and a run off the grid.
func TestJudge(t *testing.T) {
	from := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	to := from.Add(4 * time.Second) // report ticks 12:00:00 .. 12:00:04
	at := func(s float64) time.Time { return from.Add(time.Duration(s * float64(time.Second))) }
	once := []jobRun{ // every report tick once, plus runs the judge ignores
		{Job: "report", Tick: at(-1), Instance: 0}, // before the window
		{Job: "report", Tick: at(0), Instance: 0},
		{Job: "report", Tick: at(1), Instance: 1},
		{Job: "report", Tick: at(2), Instance: 2},
		{Job: "report", Tick: at(3), Instance: 2},
		{Job: "report", Tick: at(4), Instance: 2},
		{Job: "report", Tick: at(5), Instance: 1}, // after the window
		{Job: "sync", Tick: at(0), Instance: 0},   // another job: its
		{Job: "sync", Tick: at(2), Instance: 1},   // ticks are even seconds
		{Job: "sync", Tick: at(4), Instance: 2},
	}
	without := func(i int) []jobRun { return append(append([]jobRun(nil), once[:i]...), once[i+1:]...) }
	tests := []struct {
		name                  string
		runs                  []jobRun
		dups, missed, offGrid int
		wantRuns              int
		inst0, inst2          int
	}{
		{"exactly once", once, 0, 0, 0, 5, 1, 3},
		{"duplicate", append(once, jobRun{Job: "report", Tick: at(3), Instance: 0}), 1, 0, 0, 6, 2, 3},
		{"missed", without(2), 0, 1, 0, 4, 1, 3},
		{"off grid", append(once, jobRun{Job: "report", Tick: at(1.5), Instance: 0}), 0, 0, 1, 6, 2, 3},
		{"no tick", append(once, jobRun{Job: "report", Instance: 0}), 0, 0, 1, 5, 1, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(tt.runs, jobs[0], 3, from, to)
			if v.ticks != 5 || v.runs != tt.wantRuns {
				t.Errorf("ticks, runs = %d, %d; want 5, %d", v.ticks, v.runs, tt.wantRuns)
			}
			if len(v.duplicates) != tt.dups || len(v.missed) != tt.missed || len(v.offGrid) != tt.offGrid {
				t.Errorf("duplicates, missed, off grid = %d, %d, %d; want %d, %d, %d",
					len(v.duplicates), len(v.missed), len(v.offGrid), tt.dups, tt.missed, tt.offGrid)
			}
			if v.perInstance[0] != tt.inst0 || v.perInstance[2] != tt.inst2 {
				t.Errorf("runs of instances 0 and 2 = %d, %d; want %d, %d",
					v.perInstance[0], v.perInstance[2], tt.inst0, tt.inst2)
			}

			var out bytes.Buffer
			verdicts := []verdict{v, judge(tt.runs, jobs[1], 3, from, to)}
			stats := []instanceStats{{Instance: 0}, {Instance: 1}, {Instance: 2}}
			err := printSummary(&out, verdicts, tt.runs, stats, []time.Duration{0, 0, 0}, from, to)
			wantOK := tt.dups+tt.missed+tt.offGrid == 0
			if (err == nil) != wantOK {
				t.Errorf("printSummary() = %v; want ok=%v; output:\n%s", err, wantOK, out.String())
			}
			rows, perr := parseSummary(out.String(), 3)
			if perr != nil {
				t.Fatalf("parseSummary: %v", perr)
			}
			if r := rows[0]; r.job != "report" || r.duplicates != tt.dups || r.missed != tt.missed {
				t.Errorf("table row %+v; want report with %d duplicates, %d missed", r, tt.dups, tt.missed)
			}
		})
	}
}

func TestMidTick(t *testing.T) {
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		t      time.Duration // after base, real
		offset time.Duration
		want   time.Duration // after base, real
	}{
		{0, 0, 500 * time.Millisecond},
		{900 * time.Millisecond, 0, 1500 * time.Millisecond},
		{900 * time.Millisecond, 250 * time.Millisecond, 1250 * time.Millisecond},
		{100 * time.Millisecond, -300 * time.Millisecond, 800 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := midTick(base.Add(tt.t), tt.offset).Sub(base); got != tt.want {
			t.Errorf("midTick(+%v, %v) = +%v, want +%v", tt.t, tt.offset, got, tt.want)
		}
	}
}

func TestFlagErrorsNameTheValue(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-instances", "0"}, "-instances 0"},
		{[]string{"-skew", "-300ms,soon"}, `"soon"`},
		{[]string{"-duration", "3s"}, "-duration 3s"},
		{[]string{"-job-time", "2s"}, "-job-time 2s"},
		{[]string{"-ttl", "1ms"}, "-ttl 1ms"},
		{[]string{"-mode", "threads"}, `-mode "threads"`},
		{[]string{"-kill-one"}, "-kill-one needs -mode process"},
		{[]string{"-redis", "10.0.0.1"}, `node "10.0.0.1"`},
		{[]string{"-redis", "a:1,a:1"}, `node "a:1" is listed twice`},
		{[]string{"stray"}, `"stray"`},
	}
	for _, tt := range tests {
		err := run(t.Context(), tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v; want an error naming %s", tt.args, err, tt.want)
		}
	}
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-h"}, &out); err != nil || strings.Contains(out.String(), "child-id") {
		t.Errorf("run(-h) = %v with output:\n%s\nwant nil and no hidden flag", err, out.String())
	}
	if _, err := parseConfig([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("parseConfig(-h) = %v, want flag.ErrHelp", err)
	}
}

// buildExample builds this program and returns the path of the binary.
func buildExample(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cron")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runExample runs bin with args and returns its output; it fails the test
// unless the exit status is 0.
func runExample(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v; output:\n%s", bin, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// summaryRow is a row of the job table of the summary.
type summaryRow struct {
	job                string
	ticks, runs        int
	duplicates, missed int
	perInstance        []int
}

// checkExactlyOnce fails the test unless the summary in out says that every
// judged tick of both jobs ran exactly once. It returns the table rows.
func checkExactlyOnce(t *testing.T, out string, instances int) []summaryRow {
	t.Helper()
	rows, err := parseSummary(out, instances)
	if err != nil {
		t.Fatalf("%v; output:\n%s", err, out)
	}
	if len(rows) != len(jobs) {
		t.Fatalf("summary has %d job rows, want %d; output:\n%s", len(rows), len(jobs), out)
	}
	for _, r := range rows {
		if r.ticks == 0 || r.runs != r.ticks || r.duplicates != 0 || r.missed != 0 {
			t.Errorf("job %s: %d ticks, %d runs, %d duplicates, %d missed; want >0 ticks, one run each, 0 duplicates, 0 missed",
				r.job, r.ticks, r.runs, r.duplicates, r.missed)
		}
	}
	if !strings.Contains(out, "OK: every scheduled time ran exactly once") {
		t.Errorf("output lacks the OK line:\n%s", out)
	}
	return rows
}

// parseSummary reads the job table: the header line starting with "job"
// and the rows after it up to a blank line.
func parseSummary(out string, instances int) ([]summaryRow, error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) < 6 || f[0] != "job" || f[4] != "duplicates" {
			continue
		}
		var rows []summaryRow
		for _, l := range lines[i+1:] {
			f := strings.Fields(l)
			if len(f) == 0 {
				break
			}
			if len(f) != 6+instances {
				return nil, errors.New("summary row " + strconv.Quote(l) + " has the wrong number of columns")
			}
			n := make([]int, len(f)-2)
			for k, s := range f[2:] {
				v, err := strconv.Atoi(s)
				if err != nil {
					return nil, errors.New("summary row " + strconv.Quote(l) + ": " + err.Error())
				}
				n[k] = v
			}
			rows = append(rows, summaryRow{job: f[0], ticks: n[0], runs: n[1], duplicates: n[2], missed: n[3], perInstance: n[4:]})
		}
		return rows, nil
	}
	return nil, errors.New("no summary table in the output")
}
