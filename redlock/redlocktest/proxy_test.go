package redlocktest

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// rawConn is a plain RESP connection through a proxy, so that a test can
// see exactly which bytes arrive, on one connection that stays open.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

// send writes an inline command.
func (rc *rawConn) send(cmd string) {
	rc.t.Helper()
	if _, err := rc.c.Write([]byte(cmd + "\r\n")); err != nil {
		rc.t.Fatalf("write %q: %v", cmd, err)
	}
}

// line reads one reply line within d; it returns the error on timeout or
// close.
func (rc *rawConn) line(d time.Duration) (string, error) {
	rc.t.Helper()
	if err := rc.c.SetReadDeadline(time.Now().Add(d)); err != nil {
		rc.t.Fatal(err)
	}
	s, err := rc.r.ReadString('\n')
	return strings.TrimRight(s, "\r\n"), err
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyForwardsAndAddsLatency(t *testing.T) {
	t.Parallel()
	s := StartServer(t)
	p := NewProxy(t, s.Addr())
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") || p.Target() != s.Addr() {
		t.Fatalf("Addr() = %q, Target() = %q", p.Addr(), p.Target())
	}
	rc := dialRaw(t, p.Addr())
	ping := func() time.Duration {
		t.Helper()
		start := time.Now()
		rc.send("PING")
		got, err := rc.line(5 * time.Second)
		if err != nil || got != "+PONG" {
			t.Fatalf("PING through the proxy = %q, %v", got, err)
		}
		return time.Since(start)
	}
	ping()
	const d = 60 * time.Millisecond
	p.SetLatency(d)
	if got := ping(); got < 2*d {
		t.Errorf("round trip with %v each way took %v, want at least %v", d, got, 2*d)
	}
	p.SetLatency(0)
	p.SetLatencyIn(NodeToClient, 2*d)
	if got := ping(); got < 2*d {
		t.Errorf("round trip with %v on replies took %v, want at least %v", 2*d, got, 2*d)
	}
	p.Heal()
	if got := ping(); got >= 2*d {
		t.Logf("round trip after Heal took %v (slow machine?)", got)
	}
	if n := p.Conns(); n != 1 {
		t.Errorf("Conns() = %d, want 1", n)
	}
}

func TestProxyBlackholeTimesOutAndHealRestores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t)
	p := NewProxy(t, s.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatalf("SET through the proxy: %v", err)
	}
	p.Blackhole(true)
	start := time.Now()
	err := rdb.Get(ctx, "k").Err()
	if !isNetTimeout(err) {
		t.Fatalf("GET while blackholed = %v, want a timeout", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("GET failed after %v, before the 200ms read timeout", d)
	}
	p.Heal()
	if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "1" {
		t.Fatalf("GET after Heal = %q, %v; want 1", got, err)
	}

	// The connection itself stays open while blackholed: a dropped request
	// is lost, the next one is answered.
	rc := dialRaw(t, p.Addr())
	p.Blackhole(true)
	rc.send("PING")
	if got, err := rc.line(200 * time.Millisecond); !isNetTimeout(err) {
		t.Fatalf("raw PING while blackholed = %q, %v; want a timeout", got, err)
	}
	p.Blackhole(false)
	rc.send("ECHO again")
	if got, err := rc.line(5 * time.Second); err != nil || got != "$5" {
		t.Fatalf("raw ECHO after the black hole = %q, %v; want $5 (the dropped PING never reached the node)", got, err)
	}
}

func TestProxyOneWayPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t)
	direct := s.Client(t)
	p := NewProxy(t, s.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	p.Partition(ClientToNode)
	if err := rdb.Set(ctx, "req", "1", 0).Err(); !isNetTimeout(err) {
		t.Fatalf("SET with requests dropped = %v, want a timeout", err)
	}
	if n, _ := direct.Exists(ctx, "req").Result(); n != 0 {
		t.Errorf("the node executed a request that was dropped")
	}

	// A new connection's handshake would be lost too: open one first.
	p.Heal()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Partition(NodeToClient)
	if err := rdb.Set(ctx, "rep", "1", 0).Err(); !isNetTimeout(err) {
		t.Fatalf("SET with replies dropped = %v, want a timeout", err)
	}
	if n, _ := direct.Exists(ctx, "rep").Result(); n != 1 {
		t.Errorf("the node did not execute a request whose reply was dropped")
	}

	p.Heal()
	if err := rdb.Set(ctx, "healed", "1", 0).Err(); err != nil {
		t.Fatalf("SET after Heal: %v", err)
	}
}

func TestProxyHoldDeliversRepliesLater(t *testing.T) {
	t.Parallel()
	s := StartServer(t)
	p := NewProxy(t, s.Addr())
	rc := dialRaw(t, p.Addr())
	p.Hold()
	rc.send("INCR n")
	if got, err := rc.line(200 * time.Millisecond); !isNetTimeout(err) {
		t.Fatalf("reply while held = %q, %v; want none", got, err)
	}
	// The node executed the command although its reply is held.
	if got, err := s.Client(t).Get(context.Background(), "n").Result(); err != nil || got != "1" {
		t.Fatalf("n on the node = %q, %v; want 1", got, err)
	}
	rc.send("INCR n")
	p.Unhold()
	for _, want := range []string{":1", ":2"} {
		if got, err := rc.line(5 * time.Second); err != nil || got != want {
			t.Fatalf("held reply = %q, %v; want %q", got, err, want)
		}
	}
}

func TestProxyToKilledServerClosesConnections(t *testing.T) {
	t.Parallel()
	s := StartServer(t)
	p := NewProxy(t, s.Addr())
	rc := dialRaw(t, p.Addr())
	s.Kill(t)
	if got, err := rc.line(5 * time.Second); err == nil {
		t.Fatalf("read after the server was killed = %q, want EOF", got)
	}
	// New connections are accepted and closed while the server is down.
	rc2 := dialRaw(t, p.Addr())
	if got, err := rc2.line(5 * time.Second); err == nil {
		t.Fatalf("read from a connection to a killed server = %q, want EOF", got)
	}
	s.Restart(t)
	rc3 := dialRaw(t, p.Addr())
	rc3.send("PING")
	if got, err := rc3.line(5 * time.Second); err != nil || got != "+PONG" {
		t.Fatalf("PING after Restart = %q, %v", got, err)
	}
}

func TestProxiedClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := Start(t, 3)
	clients, proxies := c.ProxiedClients(t)
	if len(clients) != 3 || len(proxies) != 3 {
		t.Fatalf("ProxiedClients returned %d clients and %d proxies", len(clients), len(proxies))
	}
	for i, rdb := range clients {
		if proxies[i].Target() != c[i].Addr() {
			t.Errorf("proxy %d targets %s, want %s", i, proxies[i].Target(), c[i].Addr())
		}
		if err := rdb.Set(ctx, "k", i, 0).Err(); err != nil {
			t.Fatalf("SET through proxy %d: %v", i, err)
		}
	}
	for i, s := range c {
		if keys := s.Keys(t); len(keys) != 1 || keys[0] != "k" {
			t.Errorf("server %d keys = %q, want [k]", i, keys)
		}
	}
	proxies[0].SetLatency(50 * time.Millisecond)
	start := time.Now()
	if err := clients[0].Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("PING through the slow proxy took %v, want at least 100ms", d)
	}
	if err := clients[1].Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}
