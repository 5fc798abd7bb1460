// Command contention shows lock contention as a trace backend sees it:
// several workers take turns at one resource with redlock's Acquire, each
// holding it for a while, so that the others wait.
//
//	go run ./example/contention
//
// It starts three embedded Redis nodes (miniredis, on loopback ports) and
// three workers, each with its own go-redis clients and redlock.Client, as
// separate instances of a service would have. Each worker, in a span of its
// own ("worker-N job"), acquires the resource "report" (TTL 5 s), works for
// -hold (200 ms), and releases it, -rounds times. The program prints, per
// acquisition, who got the lock and how long it waited:
//
//	worker-2  got report after waiting 217ms
//
// When OTEL_EXPORTER_OTLP_ENDPOINT (or another OTEL_EXPORTER_OTLP_*_ENDPOINT)
// is set, it exports its traces over OTLP (package tracing/otlp) as service
// schedlock-example-contention. In Jaeger (docs/observability.md) a waiting
// worker's redlock.Acquire shows its refused rounds
// ("redlock.acquire.round contended", linked to the holder's span), the
// waits between them ("redlock.wait release_notice": woken by the holder's
// release) and the granted round:
//
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_METRICS_EXPORTER=none go run ./example/contention
//
// Flags:
//
//	-redis host:port,...  use these Redis nodes instead of embedded miniredis
//	-workers N            number of workers (default 3, at most 16)
//	-rounds N             acquisitions per worker (default 2, at most 100)
//	-hold d               how long a worker holds the lock (default 200ms,
//	                      at most 2s)
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
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"

	exnodes "github.com/schedlock/schedlock/example/internal/nodes"
	"github.com/schedlock/schedlock/example/internal/telemetry"
	"github.com/schedlock/schedlock/redlock"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "contention:", err)
		os.Exit(1)
	}
}

const (
	resource   = "report"
	ttl        = 5 * time.Second
	maxWorkers = 16
	maxRounds  = 100
	maxHold    = 2 * time.Second
)

// config is the parsed command line.
type config struct {
	redis   []string
	workers int
	rounds  int
	hold    time.Duration
}

func parseConfig(args []string, stdout io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("contention", flag.ContinueOnError)
	fs.SetOutput(stdout)
	redisList := fs.String("redis", "", "comma-separated `host:port` list of Redis nodes to use instead of embedded miniredis")
	fs.IntVar(&cfg.workers, "workers", 3, "`number` of workers")
	fs.IntVar(&cfg.rounds, "rounds", 2, "acquisitions per worker")
	fs.DurationVar(&cfg.hold, "hold", 200*time.Millisecond, "how long a worker holds the lock")
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
	case cfg.workers < 1 || cfg.workers > maxWorkers:
		return cfg, fmt.Errorf("-workers %d: must be between 1 and %d", cfg.workers, maxWorkers)
	case cfg.rounds < 1 || cfg.rounds > maxRounds:
		return cfg, fmt.Errorf("-rounds %d: must be between 1 and %d", cfg.rounds, maxRounds)
	case cfg.hold <= 0 || cfg.hold > maxHold:
		return cfg, fmt.Errorf("-hold %v: must be above 0 and at most %v", cfg.hold, maxHold)
	}
	return cfg, nil
}

// run runs the program with the command-line arguments args (without the
// program name). It returns when every worker is done or ctx has ended,
// after everything it started has stopped.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parseConfig(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	stopTelemetry, err := telemetry.Start(ctx, "schedlock-example-contention", "contention", os.Stderr)
	if err != nil {
		return err
	}
	defer stopTelemetry() // last: after every worker has stopped
	nodes, err := exnodes.Start(cfg.redis)
	if err != nil {
		return err
	}
	defer nodes.Close()
	if err := nodes.Ping(ctx); err != nil {
		return err
	}

	var mu sync.Mutex // serializes the output
	errs := make([]error, cfg.workers)
	var wg sync.WaitGroup
	for i := range cfg.workers {
		name := "worker-" + strconv.Itoa(i+1)
		wg.Go(func() {
			errs[i] = work(ctx, name, nodes.Addrs, cfg, func(line string) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintln(stdout, line)
			})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// work is one worker: its own clients, cfg.rounds acquisitions of the
// resource, each in a span of its own.
func work(ctx context.Context, name string, addrs []string, cfg config, say func(string)) error {
	var clients []redis.UniversalClient
	for _, a := range addrs {
		clients = append(clients, redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true}))
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	locks, err := redlock.New(clients)
	if err != nil {
		return err
	}
	defer func() { _ = locks.Close(context.Background()) }() // before the clients close
	tracer := otel.Tracer("github.com/schedlock/schedlock/example/contention")
	for range cfg.rounds {
		jctx, span := tracer.Start(ctx, name+" job")
		span.SetAttributes(attribute.String("worker", name))
		start := time.Now()
		l, err := locks.Acquire(jctx, []string{resource}, ttl, redlock.WithMetadata(name))
		if err != nil {
			span.End()
			return fmt.Errorf("%s: %w", name, err)
		}
		say(fmt.Sprintf("%-9s got %s after waiting %v", name, resource, time.Since(start).Round(time.Millisecond)))
		select { // the work
		case <-time.After(cfg.hold):
		case <-ctx.Done():
		}
		err = l.Release(jctx)
		span.End()
		if err != nil {
			return fmt.Errorf("%s: release: %w", name, err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}
