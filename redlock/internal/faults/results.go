package faults

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// Result is one row of the suite's table: one scenario over all its seeds.
type Result struct {
	Order      int    // position in the table (the catalogue order)
	Scenario   string // what was run
	Tier       string // "sim" (in-memory nodes, fake time), "redis" (real redis-server), "soak"
	Control    bool   // a negative control: it passes when it detects its violation
	Seeds      int
	Iterations int // lock acquisitions, repetitions or ticks, as the scenario counts them
	Faults     int // faults injected
	Overlaps   int // overlapping ownership windows (or duplicate runs, leaders) found
	Metrics    []string
	Pass       bool
	Elapsed    time.Duration
}

var results struct {
	mu   sync.Mutex
	rows []Result
}

// Record adds a row to the table.
func Record(r Result) {
	results.mu.Lock()
	defer results.mu.Unlock()
	results.rows = append(results.rows, r)
}

// WriteTable writes the recorded rows as a Markdown table, in catalogue
// order, and returns how many rows it wrote.
func WriteTable(w io.Writer) int {
	results.mu.Lock()
	rows := append([]Result(nil), results.rows...)
	results.mu.Unlock()
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Order < rows[j].Order })
	if len(rows) == 0 {
		return 0
	}
	fmt.Fprintln(w, "| scenario | tier | seeds | iterations | faults | overlaps | other metrics | result |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---|---|")
	for _, r := range rows {
		verdict := "pass"
		switch {
		case r.Control && r.Pass:
			verdict = "pass (violation detected)"
		case r.Control:
			verdict = "**FAIL** (violation not detected)"
		case !r.Pass:
			verdict = "**FAIL**"
		}
		name := r.Scenario
		if r.Control {
			name += " *(negative control)*"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %s | %s |\n", name, r.Tier, r.Seeds, r.Iterations,
			r.Faults, r.Overlaps, strings.Join(r.Metrics, "; "), verdict)
	}
	return len(rows)
}
