// Command fencing shows why a lease lock needs fencing tokens, and how
// redlock's tokens stop a paused holder's late write.
//
// Two workers update one record in a store that remembers the highest
// fencing token it has accepted and rejects writes that carry a lower one
// (the "fenced resource" of Kleppmann's "How to do distributed locking").
// Worker 1 takes the lock, then pauses (a GC pause, a stopped VM) past the
// lock's TTL. Worker 2 takes the expired lock and writes. Worker 1 wakes up,
// still believing it holds the lock, and writes: the store rejects it.
//
// Usage:
//
//	go run ./example/fencing            # three embedded miniredis nodes
//	go run ./example/fencing -redis host:port,host:port,host:port
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fencing:", err)
		os.Exit(1)
	}
}

// ErrStaleToken is returned by Store.Write for a token below the highest
// one the store has accepted.
var ErrStaleToken = errors.New("stale fencing token")

// Store is the protected resource: it accepts a write only if its fencing
// token is at least the highest it has seen.
type Store struct {
	mu      sync.Mutex
	highest uint64
	value   string
}

// Write stores value if token is not stale.
func (s *Store) Write(token uint64, value string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return fmt.Errorf("%w: %d < %d", ErrStaleToken, token, s.highest)
	}
	s.highest, s.value = token, value
	return nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("fencing", flag.ContinueOnError)
	addrs := fs.String("redis", "", "comma-separated Redis nodes (default: 3 embedded miniredis nodes)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	var nodes []redis.UniversalClient
	if *addrs == "" {
		for range 3 {
			m := miniredis.NewMiniRedis()
			if err := m.Start(); err != nil {
				return err
			}
			defer m.Close()
			// miniredis expires keys on the wall clock only when asked.
			m.ClockTTL(true)
			nodes = append(nodes, redis.NewClient(&redis.Options{Addr: m.Addr()}))
		}
	} else {
		for _, a := range strings.Split(*addrs, ",") {
			nodes = append(nodes, redis.NewClient(&redis.Options{Addr: a}))
		}
	}
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	locks, err := redlock.New(nodes, redlock.WithFencing(true))
	if err != nil {
		return err
	}
	defer locks.Close(context.Background()) // before the nodes close
	store := &Store{}
	const ttl = 300 * time.Millisecond
	res := []string{"example:fencing:record"}

	l1, err := locks.Acquire(ctx, res, ttl)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "worker 1 holds the lock, token %d, valid for %v\n", l1.FencingToken(), time.Until(l1.Until()).Round(time.Millisecond))
	fmt.Fprintf(out, "worker 1 pauses for %v (a GC pause, a stopped VM)...\n", 2*ttl)
	time.Sleep(2 * ttl)

	l2, err := locks.Acquire(ctx, res, ttl)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "worker 2 takes the lock (worker 1's has expired), token %d\n", l2.FencingToken())
	if err := store.Write(l2.FencingToken(), "written by worker 2"); err != nil {
		return fmt.Errorf("worker 2's write: %w", err)
	}
	fmt.Fprintln(out, "worker 2 writes: accepted")

	err = store.Write(l1.FencingToken(), "written by worker 1")
	fmt.Fprintf(out, "worker 1 wakes up and writes with token %d: %v\n", l1.FencingToken(), err)
	if !errors.Is(err, ErrStaleToken) {
		return fmt.Errorf("the stale write was not rejected (store holds %q)", store.value)
	}
	fmt.Fprintf(out, "the store keeps %q: the paused holder's late write was rejected\n", store.value)
	if err := l1.Release(ctx); !errors.Is(err, redlock.ErrLockLost) {
		return fmt.Errorf("worker 1's release = %v, want ErrLockLost", err)
	}
	fmt.Fprintln(out, "worker 1's Release reports the lock lost (redlock.ErrLockLost)")
	return l2.Release(ctx)
}
