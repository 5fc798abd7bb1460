package redlocktest

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Direction names one or both directions of the connections through a
// Proxy. Values combine with |.
type Direction uint8

const (
	// ClientToNode is the direction of requests, from the client to the node.
	ClientToNode Direction = 1 << iota
	// NodeToClient is the direction of replies, from the node to the client.
	NodeToClient
	// BothDirections is ClientToNode | NodeToClient.
	BothDirections = ClientToNode | NodeToClient
)

// String returns "none", "client->node", "node->client" or "both".
func (d Direction) String() string {
	switch d & BothDirections {
	case ClientToNode:
		return "client->node"
	case NodeToClient:
		return "node->client"
	case BothDirections:
		return "both"
	}
	return "none"
}

// proxyDialTimeout bounds the proxy's connection to its target.
const proxyDialTimeout = 5 * time.Second

// Proxy is a TCP proxy on 127.0.0.1 between clients and one node, for fault
// injection without tc or network namespaces: it delays traffic
// (SetLatency, SetLatencyIn), drops it while keeping connections open
// (Blackhole, Partition), and holds replies to deliver them later (Hold,
// Unhold). Point a client at Addr instead of the node.
//
// Traffic is forwarded in chunks as they are read from a socket, in order,
// each direction of each connection on its own. A fault applies to the
// chunks read after the call, except Hold, which also keeps back replies
// that were read but not yet delivered. Dropped bytes are gone for good: a
// command whose request or reply was dropped never completes, so its client
// times out (go-redis then closes the connection). When either side closes
// a connection, the proxy closes the other side once the data queued
// before the close has been delivered.
//
// A Proxy is safe for concurrent use; its methods never block (Close
// waits for its goroutines). It is closed, and every goroutine it started
// has ended, by the time the cleanup of the test that created it has run.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close: ends dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	latency [2]time.Duration // by dirIndex
	drop    Direction
	held    bool
	unheld  chan struct{} // closed while not held
	conns   map[*proxyConn]struct{}
	closed  bool
}

// NewProxy starts a proxy to target ("host:port") listening on a free port
// of 127.0.0.1, initially without faults. Each accepted connection is
// forwarded to a new connection to target; if target cannot be reached the
// accepted connection is closed. The proxy is closed when the test ends
// (see Close). NewProxy fails the test with t.Fatalf if it cannot listen.
// It must be called from the test's goroutine.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redlocktest: NewProxy(%s): %v", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	unheld := make(chan struct{})
	close(unheld)
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, unheld: unheld, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's address, "127.0.0.1:port". Never blocks.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// SetLatency delays every chunk by d in each direction, so a request and
// its reply take 2d longer. Zero or negative d removes the delay.
func (p *Proxy) SetLatency(d time.Duration) { p.SetLatencyIn(BothDirections, d) }

// SetLatencyIn delays every chunk sent in the directions dir by d (zero or
// negative: no delay), leaving the other direction as it is.
func (p *Proxy) SetLatencyIn(dir Direction, d time.Duration) {
	d = max(d, 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, one := range []Direction{ClientToNode, NodeToClient} {
		if dir&one != 0 {
			p.latency[dirIndex(one)] = d
		}
	}
}

// Blackhole drops all traffic in both directions while on is true, keeping
// every connection open, as an unreachable host does; new connections are
// accepted and connected to the node, and their traffic is dropped too.
// Blackhole(false) stops dropping (as Partition(0)).
func (p *Proxy) Blackhole(on bool) {
	if on {
		p.Partition(BothDirections)
	} else {
		p.Partition(0)
	}
}

// Partition drops the traffic in the directions dir and forwards the
// other direction, replacing any earlier Partition or Blackhole. With
// ClientToNode the node never sees the requests; with NodeToClient it
// executes them but the replies are lost. Partition(0) drops nothing.
func (p *Proxy) Partition(dir Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = dir & BothDirections
}

// Hold keeps back every reply (node->client chunk) not yet delivered and
// every later one, until Unhold or Heal delivers them in order. Requests
// still reach the node. Holding longer than a client's read timeout makes
// its commands fail even though the node executed them.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.held = true
		p.unheld = make(chan struct{})
	}
}

// Unhold delivers the replies kept back since Hold, in order, and stops
// holding.
func (p *Proxy) Unhold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held {
		p.held = false
		close(p.unheld)
	}
}

// Heal ends every fault: no latency, nothing dropped, held replies
// delivered. Chunks already delayed keep their delay.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.latency = [2]time.Duration{}
	p.drop = 0
	p.mu.Unlock()
	p.Unhold()
}

// Conns returns the number of client connections currently open through
// the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, closes every connection through the proxy, and
// waits until every goroutine of the proxy has ended. It runs at the end of
// the test that created the proxy; calling it earlier is allowed, and later
// calls do nothing.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	_ = p.ln.Close()
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
}

func dirIndex(d Direction) int {
	if d == NodeToClient {
		return 1
	}
	return 0
}

// state returns the delay and whether to drop a chunk read now in dir.
func (p *Proxy) state(dir Direction) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency[dirIndex(dir)], p.drop&dir != 0
}

// waitUnheld blocks while replies are held; false if done closed first.
func (p *Proxy) waitUnheld(done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		held, ch := p.held, p.unheld
		p.mu.Unlock()
		if !held {
			return true
		}
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if isClosedErr(err) {
				return
			}
			// Temporary accept errors (e.g. too many open files): retry.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.connect(c)
	}
}

func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "use of closed network connection")
}

// connect dials the target for the accepted client connection and starts
// forwarding.
func (p *Proxy) connect(client net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: proxyDialTimeout}
	node, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	pc := &proxyConn{p: p, client: client, node: node, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = client.Close()
		_ = node.Close()
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()
	up := newPipe(ClientToNode, client, node)
	down := newPipe(NodeToClient, node, client)
	p.wg.Add(4)
	go pc.read(up)
	go pc.write(up)
	go pc.read(down)
	go pc.write(down)
}

// proxyConn is one client connection and its connection to the node.
type proxyConn struct {
	p            *Proxy
	client, node net.Conn
	once         sync.Once
	done         chan struct{} // closed by close
}

func (pc *proxyConn) close() {
	pc.once.Do(func() {
		close(pc.done)
		_ = pc.client.Close()
		_ = pc.node.Close()
		pc.p.mu.Lock()
		delete(pc.p.conns, pc)
		pc.p.mu.Unlock()
	})
}

// pipe is one direction of a proxyConn: a queue of chunks from src to dst.
type pipe struct {
	dir      Direction
	src, dst net.Conn

	mu    sync.Mutex
	q     []chunk
	ready chan struct{} // capacity 1: something was queued
}

// chunk is data read at once from src, to deliver at at; eof marks the end
// of src.
type chunk struct {
	data []byte
	at   time.Time
	eof  bool
}

func newPipe(dir Direction, src, dst net.Conn) *pipe {
	return &pipe{dir: dir, src: src, dst: dst, ready: make(chan struct{}, 1)}
}

func (pp *pipe) push(c chunk) {
	pp.mu.Lock()
	pp.q = append(pp.q, c)
	pp.mu.Unlock()
	select {
	case pp.ready <- struct{}{}:
	default:
	}
}

// pop returns the next chunk, blocking until there is one; false when done
// is closed first.
func (pp *pipe) pop(done <-chan struct{}) (chunk, bool) {
	for {
		pp.mu.Lock()
		if len(pp.q) > 0 {
			c := pp.q[0]
			pp.q[0] = chunk{}
			pp.q = pp.q[1:]
			pp.mu.Unlock()
			return c, true
		}
		pp.mu.Unlock()
		select {
		case <-pp.ready:
		case <-done:
			return chunk{}, false
		}
	}
}

// read queues what src sends, stamped with its delivery time, or drops it.
func (pc *proxyConn) read(pp *pipe) {
	defer pc.p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := pp.src.Read(buf)
		if n > 0 {
			delay, drop := pc.p.state(pp.dir)
			if !drop {
				pp.push(chunk{data: append([]byte(nil), buf[:n]...), at: time.Now().Add(delay)})
			}
		}
		if err != nil {
			pp.push(chunk{eof: true})
			return
		}
	}
}

// write delivers queued chunks to dst at their time, in order, waiting
// while replies are held.
func (pc *proxyConn) write(pp *pipe) {
	defer pc.p.wg.Done()
	for {
		c, ok := pp.pop(pc.done)
		if !ok {
			return
		}
		if c.eof {
			pc.close()
			return
		}
		if wait := time.Until(c.at); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-pc.done:
				t.Stop()
				return
			}
		}
		if pp.dir == NodeToClient && !pc.p.waitUnheld(pc.done) {
			return
		}
		if _, err := pp.dst.Write(c.data); err != nil {
			pc.close()
			return
		}
	}
}
