package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunEmbedded(t *testing.T) {
	t.Parallel()
	out := runOK(t, "-duration", "6s", "-kill-every", "2s")
	checkOutput(t, out)
}

func TestRunRealRedis(t *testing.T) {
	t.Parallel()
	cluster := redlocktest.Start(t, 3)
	out := runOK(t, "-redis", strings.Join(cluster.Addrs(), ","), "-duration", "6s", "-kill-every", "2s")
	if !strings.Contains(out, "Redis nodes given by -redis") {
		t.Errorf("output does not say it uses the -redis nodes:\n%s", out)
	}
	checkOutput(t, out)
}

// runOK runs the program with args and returns its output; it fails the
// test unless run returns nil.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(t.Context(), args, &out); err != nil {
		t.Fatalf("run(%q) = %v, want nil; output:\n%s", args, err, out.String())
	}
	return out.String()
}

var leadershipsLine = regexp.MustCompile(`(?m)^leaderships: (\d+) `)

// checkOutput checks the summary in out: at least two leaderships, at
// least one kill, and the check passed.
func checkOutput(t *testing.T, out string) {
	t.Helper()
	m := leadershipsLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no leaderships line in the output:\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n < 2 {
		t.Errorf("leaderships: %d, want at least 2; output:\n%s", n, out)
	}
	if !strings.Contains(out, "kills: ") || strings.Contains(out, "kills: 0 ") {
		t.Errorf("no kill in the output:\n%s", out)
	}
	if !strings.Contains(out, "check: OK: no overlap") {
		t.Errorf("output lacks the no-overlap verdict:\n%s", out)
	}
	if strings.Contains(out, "NOTE:") {
		t.Logf("a takeover took longer than expected:\n%s", out)
	}
}

// TestCheck is the negative control of the summary's verdict: it must catch
// overlapping leaderships and terms that do not increase.
func TestCheck(t *testing.T) {
	base := time.Now() // with a monotonic clock reading, as in the program
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	win := func(who string, term uint64, from, to int) leadership {
		return leadership{who: who, term: term, start: at(from), end: at(to)}
	}
	open := func(who string, term uint64, from int) leadership {
		return leadership{who: who, term: term, start: at(from)}
	}
	tests := []struct {
		name    string
		ls      []leadership
		wantErr string // "" for no error
		wantGap time.Duration
	}{
		{"disjoint", []leadership{win("a", 1, 0, 100), win("b", 2, 150, 300), open("c", 3, 310)}, "", 10 * time.Millisecond},
		{"unsorted input", []leadership{win("b", 2, 150, 300), win("a", 1, 0, 100)}, "", 50 * time.Millisecond},
		{"back to back", []leadership{win("a", 1, 0, 100), win("b", 2, 100, 200)}, "", 0},
		{"overlap", []leadership{win("a", 1, 0, 100), win("b", 2, 90, 200)}, "overlapped: b (term 2)", 0},
		{"inside an earlier one", []leadership{win("a", 1, 0, 500), win("b", 2, 100, 200), win("c", 3, 300, 400)}, "c (term 3) began", 0},
		{"after one that never ended", []leadership{open("a", 1, 0), win("b", 2, 100, 200)}, "a (term 1) never ended", 0},
		{"same term", []leadership{win("a", 5, 0, 100), win("b", 5, 150, 300)}, "term 5 of b", 0},
		{"lower term", []leadership{win("a", 5, 0, 100), win("b", 4, 150, 300)}, "term 4 of b", 0},
		{"no leadership", nil, "no instance became leader", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gap, err := check(tt.ls)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("check() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("check() = %v, want an error containing %q", err, tt.wantErr)
			case tt.wantErr == "" && gap != tt.wantGap:
				t.Errorf("check() gap = %v, want %v", gap, tt.wantGap)
			}
		})
	}
}

// TestSummaryFails checks that a bad history makes run's verdict an error
// and prints FAILED.
func TestSummaryFails(t *testing.T) {
	var out bytes.Buffer
	j := newJournal(io.Discard)
	a := j.started("worker-1", 2)
	b := j.started("worker-2", 1) // overlaps a, with a lower term
	j.ended(a, "crash")
	j.ended(b, "end of run")
	cfg := config{ttl: 2 * time.Second}
	err := j.summarize(&out, cfg, time.Second)
	if err == nil || !strings.Contains(out.String(), "FAILED") {
		t.Errorf("summarize() = %v with output:\n%s\nwant an error and FAILED", err, out.String())
	}
}

func TestFlagErrorsNameTheValue(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-instances", "0"}, "-instances 0"},
		{[]string{"-instances", "100"}, "-instances 100"},
		{[]string{"-duration", "500ms"}, "-duration 500ms"},
		{[]string{"-ttl", "100ms"}, "-ttl 100ms"},
		{[]string{"-kill-every", "-1s"}, "-kill-every -1s"},
		{[]string{"-kill-every", "10ms"}, "-kill-every 10ms"},
		{[]string{"-redis", "10.0.0.1"}, `node "10.0.0.1"`},
		{[]string{"-redis", "a:1,a:1"}, `node "a:1" is listed twice`},
		{[]string{"-redis", "a:0"}, `port "0"`},
		{[]string{"-duration", "soon"}, `"soon"`},
		{[]string{"stray"}, `"stray"`},
	}
	for _, tt := range tests {
		err := run(t.Context(), tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v; want an error naming %s", tt.args, err, tt.want)
		}
	}
	var out bytes.Buffer
	if err := run(t.Context(), []string{"-h"}, &out); err != nil || !strings.Contains(out.String(), "-kill-every") {
		t.Errorf("run(-h) = %v with output:\n%s\nwant nil and the flags", err, out.String())
	}
	if _, err := parseConfig([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("parseConfig(-h) = %v, want flag.ErrHelp", err)
	}
}

func TestUnreachableNode(t *testing.T) {
	err := run(t.Context(), []string{"-redis", "127.0.0.1:1", "-duration", "1s"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("run(-redis 127.0.0.1:1) = %v, want an error naming the node", err)
	}
}
