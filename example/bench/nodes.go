package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// node is one Redis server used by the benchmark: a redis-server child
// process that this program started (cmd != nil), or an address it was
// given (-redis), which it can neither pause nor measure the CPU of.
type node struct {
	addr string
	cmd  *exec.Cmd
	dir  string
	done chan struct{} // closed once cmd has been reaped

	admin *redis.Client // private connection for INFO, PING, CONFIG

	mu     sync.Mutex
	paused bool
}

// nodeSet is the set of nodes; workloads on k nodes use the first k.
type nodeSet []*node

// startNodes starts n redis-server processes on free loopback ports without
// persistence, in parallel, and returns once all answer PING.
func startNodes(ctx context.Context, n int) (nodeSet, error) {
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (install it, set REDIS_SERVER, or pass -redis): %w", err)
	}
	ns := make(nodeSet, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ns[i], errs[i] = startNode(ctx, path) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		ns.close()
		return nil, err
	}
	return ns, nil
}

// startNode starts one server, retrying with another port when the port
// it picked was taken meanwhile.
func startNode(ctx context.Context, bin string) (*node, error) {
	dir, err := os.MkdirTemp("", "schedlock-bench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		nd := &node{addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir, done: make(chan struct{})}
		nd.cmd = exec.Command(bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no",
			"--dir", dir, "--logfile", "redis.log", "--daemonize", "no")
		nd.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // no terminal signals
		if err := nd.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		go func() { _ = nd.cmd.Wait(); close(nd.done) }()
		nd.admin = redis.NewClient(&redis.Options{Addr: nd.addr, PoolSize: 1, MaxRetries: -1})
		if lastErr = nd.waitPing(ctx, 5*time.Second); lastErr == nil {
			return nd, nil
		}
		nd.kill()
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("redis-server did not start: %w", lastErr)
}

// connectNodes uses servers that someone else runs.
func connectNodes(ctx context.Context, addrs []string) (nodeSet, error) {
	ns := make(nodeSet, 0, len(addrs))
	for _, a := range addrs {
		nd := &node{addr: a, admin: redis.NewClient(&redis.Options{Addr: a, PoolSize: 1})}
		ns = append(ns, nd)
		if err := nd.waitPing(ctx, 5*time.Second); err != nil {
			ns.close()
			return nil, fmt.Errorf("redis %s: %w", a, err)
		}
	}
	return ns, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// waitPing waits until the node answers PING, for at most d.
func (nd *node) waitPing(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := nd.admin.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if nd.done != nil {
			select {
			case <-nd.done:
				return fmt.Errorf("redis-server on %s exited: %w (see %s/redis.log)", nd.addr, err, nd.dir)
			default:
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no PING answer from %s: %w", nd.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// owned reports whether this program runs the node's process.
func (nd *node) owned() bool { return nd.cmd != nil }

// pause stops the process (SIGSTOP): it accepts connections (the kernel
// does) but answers nothing.
func (nd *node) pause() error {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if err := nd.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	nd.paused = true
	return nil
}

// resume continues a paused process and waits until it answers again.
func (nd *node) resume(ctx context.Context) error {
	nd.mu.Lock()
	err := nd.cmd.Process.Signal(syscall.SIGCONT)
	nd.paused = false
	nd.mu.Unlock()
	if err != nil {
		return err
	}
	return nd.waitPing(ctx, 10*time.Second)
}

// kill stops the process at once and removes nothing.
func (nd *node) kill() {
	if nd.cmd == nil || nd.cmd.Process == nil {
		return
	}
	_ = nd.cmd.Process.Signal(syscall.SIGCONT)
	_ = nd.cmd.Process.Kill()
	select {
	case <-nd.done:
	case <-time.After(5 * time.Second):
	}
}

// close kills the nodes this program started and closes admin clients.
func (ns nodeSet) close() {
	for _, nd := range ns {
		if nd == nil {
			continue
		}
		if nd.admin != nil {
			_ = nd.admin.Close()
		}
		if nd.owned() {
			nd.kill()
			_ = os.RemoveAll(nd.dir)
		}
	}
}

func (ns nodeSet) addrs() []string {
	a := make([]string, len(ns))
	for i, nd := range ns {
		a[i] = nd.addr
	}
	return a
}

// commandCalls returns the total number of calls of every command on the
// node since its start (INFO commandstats), excluding INFO itself; calls
// made by Lua scripts (redis.call) are included, as Redis counts them.
func (nd *node) commandCalls(ctx context.Context) (int64, error) {
	s, err := nd.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse %q: %w", line, err)
				}
				total += n
			}
		}
	}
	return total, nil
}

// commandCalls sums commandCalls over the nodes.
func (ns nodeSet) commandCalls(ctx context.Context) (int64, error) {
	var total int64
	for _, nd := range ns {
		n, err := nd.commandCalls(ctx)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats on %s: %w", nd.addr, err)
		}
		total += n
	}
	return total, nil
}

// cpu returns the CPU time (user + system) the node's process has used, or
// 0 when this program does not own the process.
func (nd *node) cpu() time.Duration {
	if !nd.owned() {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(nd.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clockTicks
}

func (ns nodeSet) cpu() time.Duration {
	var d time.Duration
	for _, nd := range ns {
		d += nd.cpu()
	}
	return d
}
