package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

const (
	// childGrace is how long after the end of the run a child may take to
	// stop before the parent sends it SIGTERM (then SIGKILL after
	// childWaitDelay): gocron waits up to 10 s for running jobs.
	childGrace     = 20 * time.Second
	childWaitDelay = 5 * time.Second
)

// child is one instance running in a child process.
type child struct {
	id     int
	cmd    *exec.Cmd
	stdout io.ReadCloser
	stderr bytes.Buffer // read after Wait
	stats  *instanceStats

	mu       sync.Mutex
	killedAt time.Time // when -kill-one killed it; zero if not
}

func (c *child) killed() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killedAt
}

// runProcesses runs each instance in a child process (this program again,
// with -child-id) until start + duration, and collects their runs into rec.
// With -kill-one it kills one child half-way through. It returns after every
// child has exited.
func runProcesses(ctx context.Context, cfg config, addrs []string, rec *recorder, start time.Time) ([]instanceStats, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this program to run its instances: %w", err)
	}
	deadline := start.Add(cfg.duration)

	g, gctx := errgroup.WithContext(ctx)
	// The children stop by themselves at the deadline (their -duration).
	// They get SIGTERM when ctx ends, when another child failed, or when
	// they are far too late.
	childCtx, cancel := context.WithDeadline(gctx, deadline.Add(childGrace))
	defer cancel()
	children := make([]*child, cfg.instances)
	for i := range children {
		c, err := startChild(childCtx, exe, i, cfg, addrs, deadline)
		if err != nil {
			cancel()
			_ = g.Wait()
			return nil, err
		}
		children[i] = c
		g.Go(func() error { return c.collect(ctx, rec) })
	}
	if cfg.killOne {
		victim := children[fastest(cfg, len(children))]
		killAt := midTick(start.Add(cfg.duration/2), cfg.offset(victim.id))
		g.Go(func() error { return victim.killAt(gctx, killAt, deadline, cfg, rec) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	stats := make([]instanceStats, len(children))
	for i, c := range children {
		if c.stats != nil {
			stats[i] = *c.stats
		} else {
			stats[i] = instanceStats{Unreported: true}
		}
		stats[i].Instance = i
		stats[i].KilledAt = c.killed()
	}
	return stats, nil
}

// startChild starts instance i as a child process that runs until deadline.
func startChild(ctx context.Context, exe string, i int, cfg config, addrs []string, deadline time.Time) (*child, error) {
	args := []string{
		"-child-id=" + strconv.Itoa(i),
		"-redis=" + strings.Join(addrs, ","),
		"-skew=" + cfg.offset(i).String(),
		"-duration=" + time.Until(deadline).Round(time.Millisecond).String(),
		"-job-time=" + cfg.jobTime.String(),
		"-ttl=" + cfg.ttl.String(),
	}
	c := &child{id: i}
	c.cmd = exec.CommandContext(ctx, exe, args...)
	c.cmd.Cancel = func() error { return c.cmd.Process.Signal(syscall.SIGTERM) }
	c.cmd.WaitDelay = childWaitDelay
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdout, err = c.cmd.StdoutPipe(); err != nil {
		return nil, fmt.Errorf("instance %d: %w", i, err)
	}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("instance %d: start %s: %w", i, exe, err)
	}
	return c, nil
}

// collect reads the child's JSON lines into rec until the child exits, then
// waits for it. A child that was killed on purpose, or stopped because ctx
// ended, is not an error.
func (c *child) collect(ctx context.Context, rec *recorder) error {
	var lineErr error
	sc := bufio.NewScanner(c.stdout)
	for sc.Scan() {
		var r jobRun
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			lineErr = fmt.Errorf("instance %d wrote %q: %w", c.id, sc.Text(), err)
			break
		}
		if r.Job != "" {
			rec.add(r)
			continue
		}
		var s instanceStats // the last line: the child's skip counts
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			lineErr = fmt.Errorf("instance %d wrote %q: %w", c.id, sc.Text(), err)
			break
		}
		c.stats = &s
	}
	if lineErr != nil {
		_, _ = io.Copy(io.Discard, c.stdout) // let the child finish writing
	}
	err := c.cmd.Wait()
	switch {
	case !c.killed().IsZero() || ctx.Err() != nil:
		return nil
	case err != nil:
		return fmt.Errorf("instance %d (pid %d): %w%s", c.id, c.cmd.Process.Pid, err, indent(c.stderr.String()))
	case lineErr != nil:
		return lineErr
	case c.stats == nil:
		return fmt.Errorf("instance %d exited without reporting its skips%s", c.id, indent(c.stderr.String()))
	}
	return nil
}

// killAt sends SIGKILL to the child at the instant at, unless the run ends
// first (ctx done or deadline).
func (c *child) killAt(ctx context.Context, at, deadline time.Time, cfg config, rec *recorder) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil
	}
	now := time.Now()
	c.mu.Lock()
	c.killedAt = now // before Kill: collect must see it once Wait returns
	c.mu.Unlock()
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill instance %d: %w", c.id, err)
	}
	rec.printf("%s  SIGKILL instance %d (clock %s, the first to fire): the others must run its scheduled times from now on\n",
		now.Format("15:04:05.000"), c.id, formatOffset(cfg.offset(c.id)))
	return nil
}

// fastest returns the instance whose clock is furthest ahead: it fires
// first and so runs most ticks, which makes it the interesting one to kill.
func fastest(cfg config, n int) int {
	best := 0
	for i := range n {
		if cfg.offset(i) > cfg.offset(best) {
			best = i
		}
	}
	return best
}

// midTick returns the first real instant at or after t at which a clock
// offset by offset reads half a second past a whole second: the instance is
// then between ticks (its runs last less than maxJobTime), so it holds no
// job's run lock when killed. A kill during a run would block that job on
// the other instances until the lock's TTL runs out.
func midTick(t time.Time, offset time.Duration) time.Time {
	local := t.Add(offset)
	mid := local.Truncate(time.Second).Add(500 * time.Millisecond)
	if mid.Before(local) {
		mid = mid.Add(time.Second)
	}
	return mid.Add(-offset)
}

// indent formats a child's standard error for an error message.
func indent(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	return "\n\t" + strings.ReplaceAll(s, "\n", "\n\t")
}

// runChild runs one instance (the child side of -mode process) until the
// end of -duration or until ctx ends (SIGTERM, SIGINT), writing one JSON
// line per run to stdout and, last, one with its skip counts.
func runChild(ctx context.Context, cfg config, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	var mu sync.Mutex
	enc := json.NewEncoder(stdout)
	write := func(v any) error {
		mu.Lock()
		defer mu.Unlock()
		return enc.Encode(v)
	}
	in, err := newInstance(cfg.childID, cfg.skews[0], cfg.redis, cfg, func(r jobRun) {
		// A failed write means the parent is gone; writing to a closed
		// pipe on stdout kills this process with SIGPIPE.
		_ = write(r)
	})
	if err != nil {
		return err
	}
	err = in.run(ctx) // scheduler first,
	if cerr := in.close(); err == nil {
		err = cerr // then the clients
	}
	if werr := write(in.stats()); err == nil {
		err = werr
	}
	return err
}
