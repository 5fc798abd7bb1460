// Command leader shows a singleton worker run by several instances with
// package elector: exactly one instance, the leader, does the work, and
// another one takes over when the leader crashes or stops.
//
//	go run ./example/leader
//
// It starts three embedded Redis nodes (miniredis, on loopback ports) and
// three candidate instances, worker-1 to worker-3, all in this process. Each
// instance has what one replica of a service would have: its own go-redis
// clients, its own redlock.Client and its own elector.Elector for the same
// election. Only the leader works: its OnStartedLeading callback processes
// one item every 500 ms until the context of its leadership ends, e.g.
//
//	15:04:05.500  worker-1 (term 1796271825092524)  processed item 3
//
// The term is the leadership's fencing token (elector.TermFromContext):
// every new leadership has a higher one, so the store a real worker writes
// to can reject a stale leader. Terms are large and not consecutive (at
// least the Redis nodes' clock in microseconds: docs/fencing.md). The
// program also prints every leadership change, from the callbacks:
// OnStartedLeading ("worker-2 is leader (term 1796271828301877)"),
// OnStoppedLeading ("worker-1 stopped leading") and, on the other
// instances, OnNewLeader ("worker-3 sees worker-2 as leader").
//
// To show failover it kills the current leader every 3 s, alternating two
// kinds of death. Each time it first starts a replacement instance
// (worker-4, worker-5, ...) and lets it find the leader, so that the
// takeover is done by a follower on its usual retry schedule:
//
//	crash     its Redis clients are closed, then its Run is cancelled: it
//	          can neither renew nor resign, so its lease stays on the nodes
//	          until it expires; another instance leads at most one lease TTL
//	          plus one retry period later (2 s + 200 ms by default).
//	graceful  its Run is cancelled: it resigns (deletes its lease) and
//	          another instance leads within about one retry period (200 ms).
//
// For each kill it prints how long the takeover took: from the kill to the
// next call of OnStartedLeading. When no instance leads at a kill time (a
// takeover is still under way), that kill is skipped. When the time is up
// right after a kill, the program waits for the takeover (at most TTL + 2
// retry periods + 1 s) and lets the new leader process one item.
//
// At the end it stops the instances (the followers first, then the leader,
// which resigns), closes their clients, then stops the nodes, and prints a
// summary: every leadership with its term and how it ended, the kills, the
// longest takeover of each kind, and a check that no two leaderships
// overlapped and that terms strictly increased. A leadership lasts from the
// call of OnStartedLeading to the end of its context, both read from this
// process's monotonic clock; all instances share that clock, so their
// windows can be compared. The exit status is 1 when the check fails.
//
// Flags:
//
//	-redis host:port,...  use these Redis nodes instead of embedded miniredis
//	                      (the election's key is schedlock:elector:example-leader)
//	-instances N          number of candidate instances (default 3)
//	-duration d           how long to run (default 10s, at least 1s)
//	-ttl d                lease TTL (default 2s, at least 200ms); the retry
//	                      period is 200ms or TTL/4, whichever is shorter
//	-kill-every d         kill the leader this often (default 3s; 0: never;
//	                      else at least 100ms)
//
// When OTEL_EXPORTER_OTLP_ENDPOINT (or another OTEL_EXPORTER_OTLP_*_ENDPOINT)
// is set, the program exports its traces and metrics over OTLP, configured
// by the standard OTEL_* variables (package tracing/otlp), with service name
// schedlock-example-leader: each term's start and end, each renewal of the
// lease, every campaign. With Jaeger (docs/observability.md):
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_METRICS_EXPORTER=none go run ./example/leader
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	exnodes "github.com/schedlock/schedlock/example/internal/nodes"
	"github.com/schedlock/schedlock/example/internal/telemetry"
)

func main() {
	// A crash closes an instance's clients while its requests may be in
	// flight, on purpose; go-redis would log that on stderr, in the middle
	// of the demo's output.
	redis.SetLogger(discardLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

// discardLogger drops go-redis's internal log messages.
type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// The demo's fixed settings and the limits of the flags.
const (
	electionName   = "example-leader"
	workEvery      = 500 * time.Millisecond // the leader processes one item this often
	maxRetryPeriod = 200 * time.Millisecond
	minTTL         = 200 * time.Millisecond
	minDuration    = time.Second
	minKillEvery   = 100 * time.Millisecond
	maxInstances   = 64
)

// config is the parsed command line.
type config struct {
	redis     []string      // -redis; empty: embedded miniredis nodes
	instances int           // -instances
	duration  time.Duration // -duration
	ttl       time.Duration // -ttl
	killEvery time.Duration // -kill-every; 0: no kills
}

// retry returns the candidates' retry period: 200ms, or TTL/4 when that is
// shorter (the elector needs it below the TTL).
func (c config) retry() time.Duration { return min(maxRetryPeriod, c.ttl/4) }

// run runs the program with the command-line arguments args (without the
// program name), writing to stdout. It returns when the run is over or ctx
// is done, after everything it started has stopped. The error is non-nil
// for bad flags, unreachable nodes, and a failed check of the leaderships.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseConfig(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	stopTelemetry, err := telemetry.Start(ctx, "schedlock-example-leader", "leader", os.Stderr)
	if err != nil {
		return err
	}
	defer stopTelemetry() // last: after every instance has stopped
	return runDemo(ctx, cfg, stdout)
}

// parseConfig parses and validates args. On -h it prints the usage to stdout
// and returns flag.ErrHelp. Errors name the flag and the bad value.
func parseConfig(args []string, stdout io.Writer) (config, error) {
	cfg := config{}
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: leader [flags]\n\n"+
			"Runs several instances of a singleton worker that elect one leader\n"+
			"through Redis, kills the leader now and then, and checks that no\n"+
			"two leaderships overlapped.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	redisList := fs.String("redis", "", "comma-separated `host:port` list of Redis nodes to use instead of embedded miniredis")
	fs.IntVar(&cfg.instances, "instances", 3, "`number` of candidate instances")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long to run (at least 1s)")
	fs.DurationVar(&cfg.ttl, "ttl", 2*time.Second, "lease TTL: how long a crashed leader blocks the election (at least 200ms)")
	fs.DurationVar(&cfg.killEvery, "kill-every", 3*time.Second, "kill the leader this often, alternating crash and graceful stop (0: never)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
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
	switch {
	case cfg.instances < 1 || cfg.instances > maxInstances:
		return cfg, fmt.Errorf("-instances %d: must be between 1 and %d", cfg.instances, maxInstances)
	case cfg.duration < minDuration:
		return cfg, fmt.Errorf("-duration %v: must be at least %v", cfg.duration, minDuration)
	case cfg.ttl < minTTL:
		return cfg, fmt.Errorf("-ttl %v: must be at least %v", cfg.ttl, minTTL)
	case cfg.killEvery < 0 || (cfg.killEvery > 0 && cfg.killEvery < minKillEvery):
		return cfg, fmt.Errorf("-kill-every %v: must be 0 (no kills) or at least %v", cfg.killEvery, minKillEvery)
	}
	return cfg, nil
}
