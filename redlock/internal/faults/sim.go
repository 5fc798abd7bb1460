package faults

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// The simulation tier runs redlock against in-memory nodes inside a
// testing/synctest bubble: time is fake, so TTLs of seconds cost nothing,
// and every delay is exact. A node is a miniredis engine (its command
// table and Lua scripting) fed by a serve loop of our own over net.Pipe
// connections, so that node and link faults are applied exactly where a
// real network and process would apply them:
//
//   - link latency, per direction: the request is handed to the engine, or
//     the reply to the client, that much later;
//   - dropped requests or replies (black hole, one-way partition): the
//     connection stays open, the client times out;
//   - a frozen node (SIGSTOP): requests queue and run, in no defined
//     order, when it thaws;
//   - a crashed node (kill -9): every connection is closed and dials fail;
//     Restart brings it back empty, or with its data when persistent.
//
// Key expiry follows the fake clock with 1 ms granularity.

// simExpiryStep is how often the simulation's clock moves the engines'
// TTLs forward between commands; every command also moves them to its own
// instant first (SimCluster.advance), so expiry is exact, not 1 ms early.
const simExpiryStep = time.Millisecond

// simEngines are miniredis engines started outside any bubble (miniredis
// only builds its command table together with a loopback listener, whose
// goroutine must not live in the bubble). They are closed when the test
// ends.
type simEngines []*miniredis.Miniredis

func newSimEngines(t testing.TB, n int) simEngines {
	t.Helper()
	e := make(simEngines, n)
	for i := range e {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			t.Fatalf("faults: miniredis: %v", err)
		}
		t.Cleanup(m.Close)
		e[i] = m
	}
	return e
}

// RunSim runs f inside a new synctest bubble with a SimCluster of n
// empty nodes, and closes the cluster (clients first) when f returns.
// It must not be called from inside a bubble.
func RunSim(t *testing.T, n int, f func(t *testing.T, c *SimCluster)) {
	t.Helper()
	engines := newSimEngines(t, n)
	for _, m := range engines {
		m.FlushAll()
	}
	synctest.Test(t, func(t *testing.T) {
		c := newSimCluster(engines)
		defer c.close()
		f(t, c)
	})
}

// SimCluster is a set of independent simulated nodes. Its methods are safe
// for concurrent use and must be called inside the bubble of RunSim.
type SimCluster struct {
	Nodes []*SimNode

	stop chan struct{}
	wg   sync.WaitGroup // serve loops and the expiry clock

	mu      sync.Mutex
	clients []*redis.Client

	clockMu sync.Mutex
	last    time.Time // the instant the engines' TTLs have been moved to
}

func newSimCluster(engines simEngines) *SimCluster {
	c := &SimCluster{stop: make(chan struct{}), last: time.Now()}
	for i, m := range engines {
		c.Nodes = append(c.Nodes, &SimNode{c: c, idx: i, m: m, conns: map[net.Conn]struct{}{}})
	}
	c.wg.Add(1)
	go c.expire()
	return c
}

// expire advances the engines' TTLs with the fake clock.
func (c *SimCluster) expire() {
	defer c.wg.Done()
	t := time.NewTicker(simExpiryStep)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.advance()
		}
	}
}

// advance moves every engine's TTLs forward to now. A command calls it
// before it runs: otherwise a tick of expire at the command's own instant,
// handled after it, would take from a new key's TTL time it never lived.
func (c *SimCluster) advance() {
	c.clockMu.Lock()
	defer c.clockMu.Unlock()
	now := time.Now()
	if d := now.Sub(c.last); d > 0 {
		for _, n := range c.Nodes {
			n.m.FastForward(d)
		}
		c.last = now
	}
}

// close closes every client, then every connection, and waits for the
// cluster's goroutines.
func (c *SimCluster) close() {
	c.mu.Lock()
	clients := c.clients
	c.clients = nil
	c.mu.Unlock()
	for _, rdb := range clients {
		_ = rdb.Close()
	}
	close(c.stop)
	for _, n := range c.Nodes {
		n.closeConns()
	}
	c.wg.Wait()
}

// Clients returns a new go-redis client per node, with go-redis defaults
// (5 s read and write timeouts), and the link of each, on which faults of
// this client's connections are injected. They are closed with the
// cluster.
func (c *SimCluster) Clients() ([]redis.UniversalClient, []*SimLink) {
	clients := make([]redis.UniversalClient, len(c.Nodes))
	links := make([]*SimLink, len(c.Nodes))
	for i, n := range c.Nodes {
		link := &SimLink{}
		links[i] = link
		rdb := redis.NewClient(&redis.Options{
			Addr:            "sim-node-" + strconv.Itoa(i) + ":6379",
			DisableIdentity: true,
			// "auto" resolves the host name (DNS, outside the bubble).
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
			Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return n.dial(link)
			},
		})
		c.mu.Lock()
		c.clients = append(c.clients, rdb)
		c.mu.Unlock()
		clients[i] = rdb
	}
	return clients, links
}

// Keys returns the number of keys on every node that satisfy match.
func (c *SimCluster) Keys(match func(key string) bool) []int {
	c.advance()
	out := make([]int, len(c.Nodes))
	for i, n := range c.Nodes {
		for _, k := range n.m.Keys() {
			if match(k) {
				out[i]++
			}
		}
	}
	return out
}

// SimNode is one simulated Redis node.
type SimNode struct {
	c   *SimCluster
	idx int
	m   *miniredis.Miniredis

	mu      sync.Mutex
	down    bool
	persist bool
	thaw    chan struct{} // non-nil while frozen; closed by Thaw
	conns   map[net.Conn]struct{}
}

var errRefused = errors.New("sim: connection refused")

func (n *SimNode) dial(link *SimLink) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errRefused}
	}
	client, srv := net.Pipe()
	n.conns[srv] = struct{}{}
	n.c.wg.Add(1)
	go n.serve(srv, link)
	return &tcpLike{Conn: client}, nil
}

// tcpLike makes the client end of a pipe fail as a TCP socket does when
// the node closes the connection (a crash): a write still succeeds and the
// next read returns io.EOF, which go-redis retries on a new connection,
// rather than io.ErrClosedPipe on the write.
type tcpLike struct {
	net.Conn
	closed atomic.Bool
}

func (c *tcpLike) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if errors.Is(err, io.ErrClosedPipe) && !c.closed.Load() {
		return len(b), nil
	}
	return n, err
}

// The deadline setters of a pipe fail once either end is closed; a TCP
// socket's do not.
func (c *tcpLike) SetDeadline(t time.Time) error      { return c.remote(c.Conn.SetDeadline(t)) }
func (c *tcpLike) SetReadDeadline(t time.Time) error  { return c.remote(c.Conn.SetReadDeadline(t)) }
func (c *tcpLike) SetWriteDeadline(t time.Time) error { return c.remote(c.Conn.SetWriteDeadline(t)) }

func (c *tcpLike) remote(err error) error {
	if errors.Is(err, io.ErrClosedPipe) && !c.closed.Load() {
		return nil
	}
	return err
}

func (c *tcpLike) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// SetPersistent makes Restart keep the node's data (appendonly with fsync
// always) or not (the default: the node restarts empty).
func (n *SimNode) SetPersistent(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.persist = on
}

// Freeze stops the node from executing anything, as SIGSTOP does: requests
// queue until Thaw. No-op on a frozen node.
func (n *SimNode) Freeze() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.thaw == nil {
		n.thaw = make(chan struct{})
	}
}

// Thaw resumes a frozen node: the queued requests run, in no defined order
// across connections.
func (n *SimNode) Thaw() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.thaw != nil {
		close(n.thaw)
		n.thaw = nil
	}
}

// Kill crashes the node: every connection is closed, dials are refused
// until Restart. A frozen node is thawed first (its queue is lost).
func (n *SimNode) Kill() {
	n.mu.Lock()
	n.down = true
	if n.thaw != nil {
		close(n.thaw)
		n.thaw = nil
	}
	n.mu.Unlock()
	n.closeConns()
}

// Restart brings a killed node back: empty unless persistent. Restart of a
// running node kills it first.
func (n *SimNode) Restart() {
	n.Kill()
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.persist {
		n.m.FlushAll()
	}
	n.down = false
}

// Keys returns the node's keys.
func (n *SimNode) Keys() []string {
	n.c.advance()
	return n.m.Keys()
}

func (n *SimNode) closeConns() {
	n.mu.Lock()
	conns := make([]net.Conn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	n.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// runnable waits while the node is frozen; false when it is down.
func (n *SimNode) runnable() bool {
	for {
		n.mu.Lock()
		down, thaw := n.down, n.thaw
		n.mu.Unlock()
		if down {
			return false
		}
		if thaw == nil {
			return true
		}
		select {
		case <-thaw:
		case <-n.c.stop:
			return false
		}
	}
}

// serve reads commands from one connection and runs them on the engine,
// with the link's faults. Three goroutines per connection, as a network
// and a server would overlap them: the reader stamps each request with its
// arrival time (read time + request latency, or dropped); the executor runs
// requests in order once they have arrived (waiting while the node is
// frozen); the writer delivers each reply at its time (execution +
// reply latency, or drops it). So a pipeline of requests pays the latency
// once, as on a real link.
func (n *SimNode) serve(conn net.Conn, link *SimLink) {
	reqs := make(chan simReq, 256)
	reps := make(chan simRep, 256)
	n.c.wg.Add(2) // the caller added one for the reader
	go func() {
		defer n.c.wg.Done()
		defer close(reqs)
		r := bufio.NewReader(conn)
		for {
			args, err := readCommand(r)
			if err != nil {
				return
			}
			delay, drop := link.state(redlocktest.ClientToNode)
			if drop {
				continue
			}
			select {
			case reqs <- simReq{args: args, at: time.Now().Add(delay)}:
			case <-n.c.stop:
				return
			}
		}
	}()
	go func() {
		defer n.c.wg.Done()
		defer close(reps)
		var buf bytes.Buffer
		peer := server.NewPeer(bufio.NewWriter(&buf))
		for req := range reqs {
			if !n.sleepUntil(req.at) || !n.runnable() {
				_ = conn.Close()
				continue // drain: the node is down
			}
			buf.Reset()
			if len(req.args) > 0 && strings.HasSuffix(strings.ToLower(req.args[0]), "subscribe") {
				// Pushed messages would bypass this loop (and its link
				// faults), and the engine's subscription goroutines
				// would outlive the bubble: waiters poll here.
				peer.WriteError("ERR pub/sub is not simulated")
			} else {
				n.c.advance()
				n.m.Server().Dispatch(peer, req.args)
			}
			peer.Flush()
			delay, drop := link.state(redlocktest.NodeToClient)
			if !drop {
				select {
				case reps <- simRep{b: bytes.Clone(buf.Bytes()), at: time.Now().Add(delay)}:
				case <-n.c.stop:
				}
			}
			if peer.Closed() {
				_ = conn.Close()
			}
		}
	}()
	defer n.c.wg.Done()
	defer func() {
		n.mu.Lock()
		delete(n.conns, conn)
		n.mu.Unlock()
		_ = conn.Close()
	}()
	for rep := range reps {
		if !n.sleepUntil(rep.at) {
			continue
		}
		if _, err := conn.Write(rep.b); err != nil {
			_ = conn.Close()
		}
	}
}

// simReq is a request and the time it reaches the node; simRep a reply and
// the time it reaches the client.
type (
	simReq struct {
		args []string
		at   time.Time
	}
	simRep struct {
		b  []byte
		at time.Time
	}
)

// sleepUntil waits until t; false when the cluster closes first.
func (n *SimNode) sleepUntil(t time.Time) bool {
	return n.sleep(time.Until(t))
}

func (n *SimNode) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.c.stop:
		return false
	}
}

// readCommand reads one RESP array of bulk strings (what go-redis sends).
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if len(line) < 2 || line[0] != '*' {
		return nil, fmt.Errorf("sim: unexpected request line %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 1 {
		return nil, fmt.Errorf("sim: bad array length %q", line)
	}
	args := make([]string, n)
	for i := range args {
		h, err := readLine(r)
		if err != nil {
			return nil, err
		}
		if len(h) < 2 || h[0] != '$' {
			return nil, fmt.Errorf("sim: unexpected bulk header %q", h)
		}
		size, err := strconv.Atoi(h[1:])
		if err != nil || size < 0 {
			return nil, fmt.Errorf("sim: bad bulk length %q", h)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

func readLine(r *bufio.Reader) (string, error) {
	s, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(s) < 2 || s[len(s)-2] != '\r' {
		return "", fmt.Errorf("sim: malformed line %q", s)
	}
	return s[:len(s)-2], nil
}

// SimLink is the path of one client to one node. Its faults apply to
// requests and replies processed after the call. Safe for concurrent use.
type SimLink struct {
	mu      sync.Mutex
	latency [2]time.Duration
	drop    redlocktest.Direction
}

func simDir(d redlocktest.Direction) int {
	if d == redlocktest.NodeToClient {
		return 1
	}
	return 0
}

// SetLatency delays each request and each reply by d.
func (l *SimLink) SetLatency(d time.Duration) {
	l.SetLatencyIn(redlocktest.BothDirections, d)
}

// SetLatencyIn delays traffic in the directions dir by d.
func (l *SimLink) SetLatencyIn(dir redlocktest.Direction, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, one := range []redlocktest.Direction{redlocktest.ClientToNode, redlocktest.NodeToClient} {
		if dir&one != 0 {
			l.latency[simDir(one)] = max(d, 0)
		}
	}
}

// Partition drops traffic in the directions dir (0: none), keeping the
// connections open.
func (l *SimLink) Partition(dir redlocktest.Direction) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop = dir
}

// Heal removes the link's faults.
func (l *SimLink) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.latency = [2]time.Duration{}
	l.drop = 0
}

func (l *SimLink) state(dir redlocktest.Direction) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latency[simDir(dir)], l.drop&dir != 0
}
