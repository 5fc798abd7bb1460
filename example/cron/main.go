// Command cron shows that each tick of each job runs on exactly one instance
// of a fleet of schedulers that share the same Redis nodes.
//
//	go run ./example/cron
//
// It starts three embedded Redis nodes (miniredis, on loopback ports) and
// three scheduler instances. Each instance is what one replica of a service
// would have: its own gocron scheduler (scheduler.New), its own go-redis
// clients and redlock.Client, and its own clock, set a little off from the
// others (-300ms, 0, +250ms by default) as real machines are. Every instance
// registers the same two jobs:
//
//	report  cron "* * * * * *": every second
//	sync    a duration job: every 2 s
//
// All instances fire their timers for every tick; the scheduler's Locker lets
// exactly one of them run it, and the others skip it with
// scheduler.ErrHeldElsewhere. The program prints one line per run as it
// happens, e.g.
//
//	15:04:05.750  report  tick 15:04:06  ran on instance 2 (clock +250ms)
//
// and, at the end, a summary: for each job, the ticks it judged, the runs,
// the ticks that ran twice (duplicates) or never (missed), and the runs of
// each instance; for each instance, its skips. Only the ticks from 2 s after
// the start to 1 s before the end are judged: at the edges not every
// instance is running. The exit status is 1 when a tick ran twice or was
// missed. Last, a table reads the same scheduled times back from the run
// record on the nodes (scheduler.History). A run record keeps the newest
// 100 entries per job by default; the demo sizes its schedulers' records
// for -duration (scheduler.WithHistoryLength, at most 10,000 entries:
// runs of more than about 80 minutes show only their last ones).
//
// Flags:
//
//	-redis host:port,...  use these Redis nodes instead of embedded miniredis
//	-instances N          number of scheduler instances (default 3)
//	-skew list            clock offsets, cycled over the instances
//	                      (default -300ms,0,250ms)
//	-duration d           how long to run (default 10s, at least 5s)
//	-job-time d           how long each run works (default 1ms, below 500ms)
//	-ttl d                lock TTL of a running job (default: the
//	                      scheduler's, 10s)
//	-mode inproc|process  inproc (default): all instances in this process;
//	                      process: one child process per instance
//	-kill-one             process mode: SIGKILL one instance half-way
//	                      through; the others must still run its ticks
//	-status host:port     serve the fleet's status page there while it
//	                      runs (scheduler.Handler, controls on), and
//	                      print its URL; -duration keeps it up longer
//
// With -status, the page shows every job, who ran each scheduled time,
// the instances' clock offsets; its Pause, Resume and Run now buttons act
// on the fleet, and the summary counts the ticks skipped while paused
// and the manual runs apart from misses and off-grid runs:
//
//	go run ./example/cron -status 127.0.0.1:8080 -duration 10m
//
// In process mode the program starts the Redis nodes itself (unless -redis is
// given), then runs its own binary once per instance with hidden flags. Each
// child runs one instance and writes one JSON line per run to its standard
// output; the parent prints them as they come and judges them as above. A
// child stops at the end of its -duration, on SIGTERM or SIGINT, and when its
// standard output is gone (the parent died).
//
// When OTEL_EXPORTER_OTLP_ENDPOINT (or another OTEL_EXPORTER_OTLP_*_ENDPOINT)
// is set, the program exports its traces and metrics over OTLP, configured
// by the standard OTEL_* variables (package tracing/otlp), with service name
// schedlock-example-cron; in process mode each child exports as
// schedlock-example-cron-<instance>. With Jaeger (docs/observability.md):
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_METRICS_EXPORTER=none go run ./example/cron
//
// The instance whose clock is furthest ahead fires first and so usually wins
// every tick: that is expected. What matters is that no tick runs twice and
// none is lost, even when that instance is killed (-kill-one). Clock offsets
// that differ by more than the scheduler's clock tolerance (1 s by default)
// only add clock_skew warnings: each tick still runs at most once, and the
// instances whose clocks lag skip their runs as late (scheduler.ErrLate).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	exnodes "github.com/schedlock/schedlock/example/internal/nodes"
	"github.com/schedlock/schedlock/example/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cron:", err)
		os.Exit(1)
	}
}

// Limits of the flags. The window judged by the summary starts judgeFrom
// after the start and ends judgeUntil before the end.
const (
	judgeFrom    = 2 * time.Second
	judgeUntil   = time.Second
	minDuration  = 5 * time.Second
	maxJobTime   = 500 * time.Millisecond
	minTTL       = 10 * time.Millisecond
	maxInstances = 64
	maxSkew      = time.Hour
)

// config is the parsed command line.
type config struct {
	redis     []string        // -redis; empty: embedded miniredis nodes
	instances int             // -instances
	skews     []time.Duration // -skew
	duration  time.Duration   // -duration
	jobTime   time.Duration   // -job-time
	ttl       time.Duration   // -ttl; 0: the scheduler's default
	mode      string          // -mode: "inproc" or "process"
	killOne   bool            // -kill-one
	status    string          // -status: serve the status page here; "" none
	childID   int             // hidden -child-id: >= 0 in a child process
}

// offset returns the clock offset of instance i: the skews cycled.
func (c config) offset(i int) time.Duration { return c.skews[i%len(c.skews)] }

// hiddenFlags are the flags a parent passes to its children; the usage text
// leaves them out.
var hiddenFlags = map[string]bool{"child-id": true}

// run runs the program with the command-line arguments args (without the
// program name), writing to stdout. It returns when the run is over or ctx
// is done, after everything it started has stopped.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseConfig(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	// Export telemetry from the processes that run instances: this one in
	// inproc mode, each child in process mode.
	if cfg.childID >= 0 || cfg.mode == "inproc" {
		service := "schedlock-example-cron"
		if cfg.childID >= 0 {
			service += "-" + strconv.Itoa(cfg.childID)
		}
		// Export failures go to stderr, as a child's stdout carries JSON.
		stopTelemetry, err := telemetry.Start(ctx, service, "cron", os.Stderr)
		if err != nil {
			return err
		}
		defer stopTelemetry() // last: after every instance has stopped
	}
	if cfg.childID >= 0 {
		return runChild(ctx, cfg, stdout)
	}
	return runFleet(ctx, cfg, stdout)
}

// parseConfig parses and validates args. On -h it prints the usage to stdout
// and returns flag.ErrHelp. Errors name the flag and the bad value.
func parseConfig(args []string, stdout io.Writer) (config, error) {
	cfg := config{}
	fs := flag.NewFlagSet("cron", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; usage is printed below
	redisList := fs.String("redis", "", "comma-separated `host:port` list of Redis nodes to use instead of embedded miniredis")
	fs.IntVar(&cfg.instances, "instances", 3, "`number` of scheduler instances")
	skewList := fs.String("skew", "-300ms,0,250ms", "comma-separated `offsets` of the instances' clocks, cycled over the instances")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long to run (at least 5s)")
	fs.DurationVar(&cfg.jobTime, "job-time", time.Millisecond, "how long each run of a job works (below 500ms)")
	fs.DurationVar(&cfg.ttl, "ttl", 0, "lock TTL of a running job (0: the scheduler's default, 10s)")
	fs.StringVar(&cfg.mode, "mode", "inproc", "`inproc|process`: all instances in this process, or one child process per instance")
	fs.BoolVar(&cfg.killOne, "kill-one", false, "process mode: SIGKILL one instance half-way through")
	fs.StringVar(&cfg.status, "status", "", "serve the fleet's status page on `host:port` (e.g. 127.0.0.1:8080) while it runs, with its controls on")
	fs.IntVar(&cfg.childID, "child-id", -1, "internal: run as child process for this instance")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs)
		}
		return cfg, fmt.Errorf("%w (run with -h for the flags)", err)
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (run with -h for the flags)", fs.Arg(0))
	}

	var err error
	if cfg.redis, err = exnodes.ParseAddrs(*redisList); err != nil {
		return cfg, err
	}
	if cfg.skews, err = parseSkews(*skewList); err != nil {
		return cfg, err
	}
	if cfg.childID >= 0 {
		return cfg, validateChild(cfg)
	}
	switch {
	case cfg.instances < 1 || cfg.instances > maxInstances:
		return cfg, fmt.Errorf("-instances %d: must be between 1 and %d", cfg.instances, maxInstances)
	case cfg.duration < minDuration:
		return cfg, fmt.Errorf("-duration %v: too short; scheduled times are judged from %v after the start to %v before the end, so use %v or more",
			cfg.duration, judgeFrom, judgeUntil, minDuration)
	case cfg.jobTime < 0 || cfg.jobTime >= maxJobTime:
		return cfg, fmt.Errorf("-job-time %v: must be at least 0 and below %v, so that a run ends well before the next scheduled time of report (every 1s)",
			cfg.jobTime, maxJobTime)
	case cfg.ttl != 0 && cfg.ttl < minTTL:
		return cfg, fmt.Errorf("-ttl %v: must be 0 (the scheduler's default) or at least %v", cfg.ttl, minTTL)
	case cfg.mode != "inproc" && cfg.mode != "process":
		return cfg, fmt.Errorf("-mode %q: must be inproc or process", cfg.mode)
	case cfg.killOne && cfg.mode != "process":
		return cfg, fmt.Errorf("-kill-one needs -mode process (got -mode %s)", cfg.mode)
	case cfg.killOne && cfg.instances < 2:
		return cfg, fmt.Errorf("-kill-one needs at least 2 instances (got -instances %d)", cfg.instances)
	}
	return cfg, nil
}

// validateChild checks the flags a parent passes to a child process.
func validateChild(cfg config) error {
	switch {
	case len(cfg.redis) == 0:
		return fmt.Errorf("-child-id %d: needs -redis", cfg.childID)
	case len(cfg.skews) != 1:
		return fmt.Errorf("-child-id %d: needs exactly one -skew value, got %d", cfg.childID, len(cfg.skews))
	case cfg.duration <= 0:
		return fmt.Errorf("-child-id %d: -duration %v is not positive", cfg.childID, cfg.duration)
	case cfg.jobTime < 0:
		return fmt.Errorf("-child-id %d: -job-time %v is negative", cfg.childID, cfg.jobTime)
	case cfg.ttl != 0 && cfg.ttl < minTTL:
		return fmt.Errorf("-child-id %d: -ttl %v is below %v", cfg.childID, cfg.ttl, minTTL)
	}
	return nil
}

// parseSkews parses the -skew list. "0" needs no unit.
func parseSkews(list string) ([]time.Duration, error) {
	var skews []time.Duration
	for s := range strings.SplitSeq(list, ",") {
		s = strings.TrimSpace(s)
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("-skew %q: %q is not a duration such as -300ms or 1.5s", list, s)
		}
		if d <= -maxSkew || d >= maxSkew {
			return nil, fmt.Errorf("-skew %q: offset %v is not within ±%v", list, d, maxSkew)
		}
		skews = append(skews, d)
	}
	return skews, nil
}

// printUsage writes the usage text, without the hidden flags.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: cron [flags]\n\n"+
		"Runs a fleet of scheduler instances that share Redis nodes and checks\n"+
		"that each scheduled time of each job runs on exactly one instance.\n\nFlags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		if hiddenFlags[f.Name] {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0s" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// formatOffset formats a clock offset with its sign: -300ms, +0s, +250ms.
func formatOffset(d time.Duration) string {
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}
