// Command bench compares package redlock with go-redsync/redsync,
// bsm/redislock and rueidis/rueidislock, and with a plain parallel go-redis
// fan-out (the floor of a quorum lock), on the same redis-server nodes in
// one run. Every workload runs each library in turn, in several rounds whose
// order rotates, so that ratios hold on a noisy machine.
//
// It lives in its own module so that the peer libraries and the plotting
// library never enter the main go.mod. docs/benchmarks.md gives the command
// and the results.
//
// Usage:
//
//	go run . [-quick] [-w seq,par,contended,paused,allocs,sched]
//	         [-json out.json] [-png ../../docs/bench.png] [-md table.md]
//	         [-redis host:port,...] [-cpuprofile dir]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Workload names.
const (
	wSeq       = "seq"
	wPar       = "par"
	wContended = "contended"
	wPaused    = "paused"
	wAllocs    = "allocs"
	wSched     = "sched"
)

var allWorkloads = []string{wSeq, wPar, wAllocs, wContended, wPaused, wSched}

type config struct {
	workloads []string
	nodes     []int
	libs      []string
	redis     []string

	rounds       int
	seg          time.Duration // per library per round: seq, par
	warmup       time.Duration
	goroutines   int
	contenders   int
	hold         time.Duration
	contSeg      time.Duration
	pausedSeg    time.Duration
	pausedRounds int
	pausedNodes  []int
	allocOps     int

	schedJobs      []int
	schedInstances int
	schedNodes     int
	schedDur       time.Duration
	schedWarmup    time.Duration
	schedExplain   bool

	jsonOut string
	pngOut  string
	mdOut   string
	profile string
	profDur time.Duration
	quick   bool
	cmdline string
	libVer  string
	profLib string
	from    string
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg config
	var w, nodes, libs, redisAddrs, pausedNodes, schedJobs string
	fs.StringVar(&w, "w", strings.Join(allWorkloads, ","), "workloads: comma-separated of "+strings.Join(allWorkloads, ",")+`, or "none"`)
	fs.StringVar(&nodes, "nodes", "1,3,5", "node counts")
	fs.StringVar(&libs, "libs", strings.Join(allLibs, ","), "libraries (ours is always included)")
	fs.StringVar(&redisAddrs, "redis", "", "comma-separated addresses of existing Redis servers (default: start redis-server processes; the paused workload needs those)")
	fs.BoolVar(&cfg.quick, "quick", false, "short run (under a minute): fewer rounds, shorter segments")
	fs.BoolVar(&clientCtxTimeout, "ctx-timeout", true, "ContextTimeoutEnabled on every library's go-redis clients (as our examples configure them); false: go-redis defaults")
	fs.IntVar(&cfg.rounds, "rounds", 4, "rounds per workload (each library once per round, order rotated)")
	fs.DurationVar(&cfg.seg, "d", time.Second, "time per library per round: seq and par")
	fs.DurationVar(&cfg.warmup, "warmup", 200*time.Millisecond, "warm-up per library before the rounds")
	fs.IntVar(&cfg.goroutines, "goroutines", 64, "par: goroutines, one key each")
	fs.IntVar(&cfg.contenders, "contenders", 32, "contended: goroutines on one key")
	fs.DurationVar(&cfg.hold, "hold", time.Millisecond, "contended: time each holder keeps the lock")
	fs.DurationVar(&cfg.contSeg, "contended-d", 2*time.Second, "contended: time per library per round")
	fs.DurationVar(&cfg.pausedSeg, "paused-d", 2*time.Second, "paused: time per library per round (at least one acquire+release)")
	fs.IntVar(&cfg.pausedRounds, "paused-rounds", 2, "paused: rounds")
	fs.StringVar(&pausedNodes, "paused-nodes", "3,5", "paused: node counts (at least 3 each)")
	fs.IntVar(&cfg.allocOps, "allocs-n", 2000, "allocs: acquire+release cycles per library per round")
	fs.StringVar(&schedJobs, "sched-jobs", "100,1000", "sched: jobs per instance (a run per count)")
	fs.IntVar(&cfg.schedInstances, "sched-instances", 5, "sched: scheduler instances")
	fs.IntVar(&cfg.schedNodes, "sched-nodes", 3, "sched: Redis nodes")
	fs.DurationVar(&cfg.schedDur, "sched-d", 10*time.Second, "sched: measured window (whole seconds)")
	fs.DurationVar(&cfg.schedWarmup, "sched-warmup", 2*time.Second, "sched: time before the window")
	fs.BoolVar(&cfg.schedExplain, "sched-explain", false, "sched: print, for each job-tick missed or run twice, the instances that ran it and the Lock errors that name it")
	fs.StringVar(&cfg.jsonOut, "json", "", "write raw results as JSON to this file")
	fs.StringVar(&cfg.pngOut, "png", "", "write a chart (PNG) to this file")
	fs.StringVar(&cfg.mdOut, "md", "", "also write the Markdown tables to this file")
	fs.StringVar(&cfg.profile, "cpuprofile", "", "after the workloads, profile ours alone (sequential and parallel, 1 and 3 nodes) into this directory; the sched workload profiles its window there too")
	fs.DurationVar(&cfg.profDur, "cpuprofile-d", 5*time.Second, "duration of each profile")
	fs.StringVar(&cfg.profLib, "cpuprofile-lib", libOurs, "library to profile (floor and redsync work on 3 nodes too)")
	fs.StringVar(&cfg.from, "from", "", "run nothing: read results from this JSON file (-json of an earlier run) and write the tables, -md and -png")
	fs.StringVar(&cfg.libVer, "lib-version", "", "how to name the library build in the report (default: git commit of ../..)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.quick {
		quick := map[string]func(){
			"rounds":        func() { cfg.rounds = 2 },
			"d":             func() { cfg.seg = 300 * time.Millisecond },
			"warmup":        func() { cfg.warmup = 100 * time.Millisecond },
			"contended-d":   func() { cfg.contSeg = 600 * time.Millisecond },
			"paused-d":      func() { cfg.pausedSeg = 300 * time.Millisecond },
			"paused-rounds": func() { cfg.pausedRounds = 1 },
			"paused-nodes":  func() { pausedNodes = "3" },
			"sched-jobs":    func() { schedJobs = "1000" },
			"allocs-n":      func() { cfg.allocOps = 500 },
			"sched-d":       func() { cfg.schedDur = 3 * time.Second },
			"sched-warmup":  func() { cfg.schedWarmup = time.Second },
		}
		for name, f := range quick {
			if !set[name] {
				f()
			}
		}
	}
	if w != "none" {
		for _, x := range splitList(w) {
			if !slices.Contains(allWorkloads, x) {
				return cfg, fmt.Errorf("unknown workload %q", x)
			}
			cfg.workloads = append(cfg.workloads, x)
		}
	}
	var err error
	if cfg.nodes, err = intList(nodes, 1); err != nil {
		return cfg, fmt.Errorf("-nodes: %w", err)
	}
	if cfg.pausedNodes, err = intList(pausedNodes, 3); err != nil {
		return cfg, fmt.Errorf("-paused-nodes: %w", err)
	}
	if cfg.schedJobs, err = intList(schedJobs, 1); err != nil {
		return cfg, fmt.Errorf("-sched-jobs: %w", err)
	}
	sel := splitList(libs)
	for _, x := range sel {
		if !slices.Contains(allLibs, x) {
			return cfg, fmt.Errorf("unknown library %q", x)
		}
	}
	for _, x := range allLibs { // table order, ours first
		if x == libOurs || slices.Contains(sel, x) {
			cfg.libs = append(cfg.libs, x)
		}
	}
	cfg.redis = splitList(redisAddrs)
	switch {
	case cfg.rounds < 1 || cfg.pausedRounds < 1:
		return cfg, errors.New("rounds must be at least 1")
	case cfg.goroutines < 1 || cfg.allocOps < 1:
		return cfg, errors.New("goroutines and allocs-n must be positive")
	case cfg.contenders < 2:
		return cfg, errors.New("contenders must be at least 2")
	case cfg.schedInstances < 1 || cfg.schedNodes < 1:
		return cfg, errors.New("sched-instances and sched-nodes must be positive")
	}
	cfg.cmdline = "go run . " + strings.Join(args, " ")
	return cfg, nil
}

// intList parses a comma-separated list of integers of at least lo.
func intList(s string, lo int) ([]int, error) {
	var out []int
	for _, x := range splitList(s) {
		n, err := strconv.Atoi(x)
		if err != nil || n < lo {
			return nil, fmt.Errorf("bad number %q (want an integer >= %d)", x, lo)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// bench holds the nodes, the libraries built on them and the results.
type bench struct {
	cfg     config
	nodes   nodeSet
	log     io.Writer
	mu      sync.Mutex
	libs    map[string]lib // by name/nodes
	results []result
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func (b *bench) add(r result) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.results = append(b.results, r)
	b.logf("%-9s n=%d %-11s %s", r.Workload, r.Nodes, r.Lib, summary(r))
}

// lib returns library name on the first n nodes, built once.
func (b *bench) lib(name string, n int) (lib, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := name + "/" + strconv.Itoa(n)
	if l, ok := b.libs[id]; ok {
		return l, nil
	}
	l, err := newLib(name, b.nodes[:n].addrs())
	if err != nil {
		return nil, fmt.Errorf("%s on %d nodes: %w", name, n, err)
	}
	b.libs[id] = l
	return l, nil
}

func (b *bench) closeLibs() {
	for _, l := range b.libs {
		l.close()
	}
	b.libs = map[string]lib{}
}

// meta describes the run, for the JSON file and the report.
type meta struct {
	Command    string    `json:"command"`
	Started    time.Time `json:"started"`
	Duration   string    `json:"duration"`
	GoVersion  string    `json:"go_version"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	CPU        string    `json:"cpu"`
	Redis      string    `json:"redis_version"`
	Nodes      string    `json:"nodes"`
	Rounds     int       `json:"rounds"`
	Segment    string    `json:"segment"`
	TTL        string    `json:"ttl"`
	Goroutines int       `json:"goroutines"`
	Contenders int       `json:"contenders"`
	Hold       string    `json:"hold"`
	Library    string    `json:"library"`
	CtxTimeout bool      `json:"client_context_timeout_enabled"`
	LoadBefore string    `json:"loadavg_before"`
	LoadAfter  string    `json:"loadavg_after"`
}

type output struct {
	Meta    meta     `json:"meta"`
	Results []result `json:"results"`
}

func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	if cfg.from != "" {
		j, err := os.ReadFile(cfg.from)
		if err != nil {
			return err
		}
		var out output
		if err := json.Unmarshal(j, &out); err != nil {
			return fmt.Errorf("%s: %w", cfg.from, err)
		}
		return report(cfg, out, stdout)
	}
	maxNodes := slices.Max(cfg.nodes)
	if slices.Contains(cfg.workloads, wSched) {
		maxNodes = max(maxNodes, cfg.schedNodes)
	}
	if slices.Contains(cfg.workloads, wPaused) {
		maxNodes = max(maxNodes, slices.Max(cfg.pausedNodes))
	}
	b := &bench{cfg: cfg, log: stderr, libs: map[string]lib{}}
	var err error
	if len(cfg.redis) > 0 {
		b.nodes, err = connectNodes(ctx, cfg.redis)
		if err == nil && len(b.nodes) < maxNodes {
			b.nodes.close()
			err = fmt.Errorf("-redis gives %d addresses; the selected workloads need %d", len(b.nodes), maxNodes)
		}
	} else {
		b.nodes, err = startNodes(ctx, maxNodes)
	}
	if err != nil {
		return err
	}
	defer b.nodes.close()
	defer b.closeLibs()
	m := meta{Command: cfg.cmdline, Started: time.Now(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		CPU: cpuModel(), Nodes: strings.Join(b.nodes.addrs(), ","), Rounds: cfg.rounds, Segment: cfg.seg.String(), TTL: ttl.String(),
		Goroutines: cfg.goroutines, Contenders: cfg.contenders, Hold: cfg.hold.String(), Library: cfg.libVer,
		CtxTimeout: clientCtxTimeout}
	if m.Library == "" {
		m.Library = libraryVersion()
	}
	m.LoadBefore = loadAvg()
	if v, err := b.nodes[0].admin.InfoMap(ctx, "server").Result(); err == nil {
		m.Redis = v["Server"]["redis_version"]
	}
	b.logf("nodes: %s (redis %s), libraries: %s", m.Nodes, m.Redis, strings.Join(cfg.libs, ","))

	steps := map[string]func(context.Context) error{
		wSeq: b.runSequential, wPar: b.runParallel, wAllocs: b.runAllocs,
		wContended: b.runContended, wPaused: b.runPaused, wSched: b.runScheduler,
	}
	for _, w := range allWorkloads { // fixed order: paused and sched last
		if !slices.Contains(cfg.workloads, w) {
			continue
		}
		b.logf("workload %s", w)
		if err := steps[w](ctx); err != nil {
			return fmt.Errorf("%s: %w", w, err)
		}
	}
	m.Duration = time.Since(m.Started).Round(time.Second).String()
	m.LoadAfter = loadAvg()
	out := output{Meta: m, Results: b.results}

	if len(b.results) > 0 {
		if cfg.jsonOut != "" {
			j, err := json.MarshalIndent(out, "", "  ")
			if err != nil {
				return err
			}
			if err := os.WriteFile(cfg.jsonOut, append(j, '\n'), 0o644); err != nil {
				return err
			}
		}
		if err := report(cfg, out, stdout); err != nil {
			return err
		}
	}
	if cfg.profile != "" {
		return b.profileOurs(ctx)
	}
	return nil
}

// report writes the tables to stdout (and -md) and the chart (-png).
func report(cfg config, out output, stdout io.Writer) error {
	var md strings.Builder
	writeTables(&md, out)
	fmt.Fprint(stdout, md.String())
	if cfg.mdOut != "" {
		if err := os.WriteFile(cfg.mdOut, []byte(md.String()), 0o644); err != nil {
			return err
		}
	}
	if cfg.pngOut != "" {
		if err := writeChart(cfg.pngOut, out); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	return nil
}

// startProfile starts a CPU profile of the whole process into the file
// name under -cpuprofile's directory; stop ends it and closes the file.
func (b *bench) startProfile(name string) (path string, stop func() error, err error) {
	if err := os.MkdirAll(b.cfg.profile, 0o755); err != nil {
		return "", nil, err
	}
	path = filepath.Join(b.cfg.profile, name)
	f, err := os.Create(path)
	if err != nil {
		return "", nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return "", nil, err
	}
	return path, func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// profileOurs writes CPU profiles of one library alone (ours by default):
// sequential and parallel acquire+release on 1 and 3 nodes.
func (b *bench) profileOurs(ctx context.Context) error {
	for _, n := range []int{1, 3} {
		if n > len(b.nodes) {
			continue
		}
		if singleNode(b.cfg.profLib) && n != 1 {
			continue
		}
		l, err := b.lib(b.cfg.profLib, n)
		if err != nil {
			return err
		}
		for _, w := range []string{wSeq, wPar} {
			var keys []*key
			for i := range b.cfg.goroutines {
				keys = append(keys, newKey(fmt.Sprintf("%sprof:%d:%d", keyPrefix, n, i)))
			}
			if w == wSeq {
				seqSegment(ctx, l, keys[0], b.cfg.warmup, &seqAcc{})
			} else {
				parSegment(ctx, l, keys, b.cfg.warmup)
			}
			path, stop, err := b.startProfile(fmt.Sprintf("%s-%s-%dnodes.pprof", b.cfg.profLib, w, n))
			if err != nil {
				return err
			}
			var ops int64
			var el time.Duration
			var lastErr error
			if w == wSeq {
				a := &seqAcc{}
				seqSegment(ctx, l, keys[0], b.cfg.profDur, a)
				ops, el, lastErr = int64(a.ops), a.elapsed, a.lastErr
			} else {
				ops, _, el, lastErr = parSegment(ctx, l, keys, b.cfg.profDur)
			}
			if err := stop(); err != nil {
				return err
			}
			b.logf("profile %s: %d ops in %v (%.0f ops/s)", path, ops, el.Round(time.Millisecond), float64(ops)/el.Seconds())
			if lastErr != nil {
				b.logf("profile %s: last error: %v", path, lastErr)
			}
		}
	}
	return nil
}

// libraryVersion names the commit of the root module that the replace
// directive builds, and whether its library packages had uncommitted
// changes (the run measures the working tree).
func libraryVersion() string {
	out, err := exec.Command("git", "-C", "../..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	v := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "-C", "../..", "status", "--porcelain", "--", "redlock", "scheduler").Output()
	if err == nil && len(bytes.TrimSpace(st)) > 0 {
		v += " + uncommitted changes in redlock/ or scheduler/"
	}
	return v
}

// loadAvg returns the 1, 5 and 15 minute load averages: other work on the
// machine makes absolute figures lower and noisier (ratios hold better).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
