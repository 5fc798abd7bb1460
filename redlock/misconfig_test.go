package redlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// These tests put one misconfigured node (or a majority of them) among real
// redis-server nodes and pin what a user sees: the classification
// (ErrMisconfigured, not ErrUnavailable, for what an operator must fix),
// the cause named in the error's text, and one log line naming the node
// while the quorum still works.

// logBuffer is a slog handler's output, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines returns the log lines that contain every one of parts.
func (l *logBuffer) lines(parts ...string) []string {
	var out []string
	for line := range strings.SplitSeq(l.String(), "\n") {
		ok := line != ""
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// newLogged returns a Client over nodes whose log goes to the returned
// buffer, closed at the end of the test.
func newLogged(t *testing.T, nodes []redis.UniversalClient, opts ...redlock.Option) (*redlock.Client, *logBuffer) {
	t.Helper()
	buf := &logBuffer{}
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c, err := redlock.New(nodes, append([]redlock.Option{redlock.WithLogger(log)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, buf
}

// client returns a go-redis client of addr with opts' username and
// password, closed at the end of the test.
func client(t *testing.T, addr, user, password string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password,
		ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// misconfigCase is one kind of misconfigured node.
type misconfigCase struct {
	name  string
	cause []string // what the error's text and the log line name
	// node starts the misconfigured node and returns its client; the
	// client's calls of a plain lock on resource "r" fail.
	node func(t *testing.T) redis.UniversalClient
	// resources are those of the lock the test takes (default "r").
	resources []string
}

func misconfigCases() []misconfigCase {
	return []misconfigCase{{
		name:  "wrong password",
		cause: []string{"WRONGPASS", "Password"},
		node: func(t *testing.T) redis.UniversalClient {
			s := redlocktest.StartServer(t, redlocktest.WithArgs("--requirepass", "right"))
			return client(t, s.Addr(), "", "wrong")
		},
	}, {
		name:  "no password",
		cause: []string{"requires a password", "Password"},
		node: func(t *testing.T) redis.UniversalClient {
			s := redlocktest.StartServer(t, redlocktest.WithArgs("--requirepass", "right"))
			return client(t, s.Addr(), "", "")
		},
	}, {
		name:  "ACL user without scripting",
		cause: []string{"NOPERM", "ACL user lacks a permission"},
		node: func(t *testing.T) redis.UniversalClient {
			s := redlocktest.StartServer(t)
			admin := s.Client(t)
			if err := admin.Do(context.Background(), "ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
				t.Fatal(err)
			}
			return client(t, s.Addr(), "noscript", "pw")
		},
	}, {
		name:      "cluster-mode node, keys of several slots",
		cause:     []string{"CROSSSLOT", "hash tag"},
		resources: []string{"a", "b"}, // different slots
		node: func(t *testing.T) redis.UniversalClient {
			s := redlocktest.StartServer(t, redlocktest.WithArgs("--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf")))
			serveAllSlots(t, s)
			return client(t, s.Addr(), "", "")
		},
	}, {
		name:  "read-only replica",
		cause: []string{"READONLY", "replica"},
		node: func(t *testing.T) redis.UniversalClient {
			master := redlocktest.StartServer(t)
			host, port, _ := net.SplitHostPort(master.Addr())
			s := redlocktest.StartServer(t, redlocktest.WithArgs("--replicaof", host, port))
			return client(t, s.Addr(), "", "")
		},
	}, {
		name:  "maxmemory reached under noeviction",
		cause: []string{"OOM", "maxmemory"},
		node: func(t *testing.T) redis.UniversalClient {
			s := redlocktest.StartServer(t, redlocktest.WithArgs("--maxmemory-policy", "noeviction"))
			admin := s.Client(t)
			ctx := context.Background()
			if err := admin.Set(ctx, "ballast", strings.Repeat("x", 4<<20), 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := admin.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
				t.Fatal(err)
			}
			return client(t, s.Addr(), "", "")
		},
	}}
}

// serveAllSlots makes a cluster-mode server serve every hash slot alone.
func serveAllSlots(t *testing.T, s *redlocktest.Server) {
	t.Helper()
	ctx := context.Background()
	admin := s.Client(t)
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := admin.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster state not ok: %q %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// script makes a TryAcquire use the acquire script, which an ACL user
// without scripting may not run, rather than SET NX GET.
var script = redlock.WithFencing(true)

// TestMisconfiguredNodesAreNotOutages: one misconfigured node among three
// is logged once, naming it and the cause, and locks work; with a majority
// misconfigured, Acquire fails with ErrMisconfigured, not ErrUnavailable,
// and the text names the cause and the fix.
func TestMisconfiguredNodesAreNotOutages(t *testing.T) {
	for _, tc := range misconfigCases() {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.resources
			if res == nil {
				res = []string{"r"}
			}
			good := redlocktest.Start(t, 2)
			t.Run("minority", func(t *testing.T) { misconfiguredMinority(t, tc, good, res) })
			t.Run("majority", func(t *testing.T) { misconfiguredMajority(t, tc, good, res) })
		})
	}
}

// misconfiguredMinority: with one node of three misconfigured (tc), locks
// work, one error line names the node and its cause, and further failures
// of it log no more.
func misconfiguredMinority(t *testing.T, tc misconfigCase, good redlocktest.Cluster, res []string) {
	ctx := context.Background()
	bad := tc.node(t)
	// A node timeout well above a healthy node's answer on a loaded
	// machine: the good nodes must not time out (100 ms did under load).
	c, logs := newLogged(t, append(good.Clients(t), bad), redlock.WithNodeTimeout(2*time.Second))
	addr := bad.(*redis.Client).Options().Addr
	// The node answers late when go-redis retries its reply
	// (READONLY): the log line may follow a few locks.
	deadline := time.Now().Add(10 * time.Second)
	for len(logs.lines("node="+addr, "level=ERROR")) == 0 {
		l, err := c.TryAcquire(ctx, res, time.Second, script)
		if err != nil {
			t.Fatalf("one misconfigured node of three: %v", err)
		}
		// A quorum released; the error names the node where the
		// release could not run.
		if err := l.Release(ctx); err != nil && (errors.Is(err, redlock.ErrLockLost) ||
			errors.Is(err, redlock.ErrUnavailable) || !strings.Contains(err.Error(), addr)) {
			t.Fatalf("release: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no error log names the node %s; log:\n%s", addr, logs)
		}
	}
	// More failures of the same node: no line per failure. (A
	// second line can follow a recovery that a timeout's cause
	// allowed before the node's answer named the misconfiguration.)
	for range 10 {
		l, err := c.TryAcquire(ctx, res, time.Second, script)
		if err != nil {
			t.Fatalf("one misconfigured node of three: %v", err)
		}
		_ = l.Release(ctx)
	}
	if n := len(logs.lines("node="+addr, "level=ERROR")); n > 2 {
		t.Errorf("%d error lines for the node in 10 more locks, want at most 2; log:\n%s", n, logs)
	}
	line := logs.lines("node="+addr, "level=ERROR")[0]
	for _, want := range append([]string{"misconfigured"}, tc.cause...) {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q does not name %q", line, want)
		}
	}
}

// misconfiguredMajority: with two nodes of three misconfigured (tc),
// Acquire fails with ErrMisconfigured, not ErrUnavailable, naming the
// cause, and each such node's result matches ErrMisconfigured.
func misconfiguredMajority(t *testing.T, tc misconfigCase, good redlocktest.Cluster, res []string) {
	ctx := context.Background()
	nodes := []redis.UniversalClient{good.Clients(t)[0], tc.node(t), tc.node(t)}
	c, _ := newLogged(t, nodes)
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = c.TryAcquire(ctx, res, time.Second, script)
		if err == nil {
			t.Fatal("acquired with two of three nodes misconfigured")
		}
		// A READONLY node's first answer may come after the node
		// timeout (go-redis retries it); from then on it is known.
		if errors.Is(err, redlock.ErrMisconfigured) && !errors.Is(err, redlock.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, redlock.ErrMisconfigured) || errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("error matches ErrMisconfigured %v, ErrUnavailable %v, want true, false: %v",
			errors.Is(err, redlock.ErrMisconfigured), errors.Is(err, redlock.ErrUnavailable), err)
	}
	if !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("error does not match ErrNotAcquired: %v", err)
	}
	for _, want := range tc.cause {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error text does not name %q: %v", want, err)
		}
	}
	var q *redlock.QuorumError
	if !errors.As(err, &q) {
		t.Fatalf("no *QuorumError in %v", err)
	}
	for _, i := range []int{1, 2} {
		if r := q.Nodes[i]; !errors.Is(r.Err, redlock.ErrMisconfigured) {
			t.Errorf("node %d: %v %v does not match ErrMisconfigured", i, r.Outcome, r.Err)
		}
	}
}

// TestHashTaggedPrefixOnAClusterNode: the fix that CROSSSLOT's text gives
// works: with a hash-tagged key prefix, a multi-resource lock's keys share
// one slot of a cluster-mode node.
func TestHashTaggedPrefixOnAClusterNode(t *testing.T) {
	s := redlocktest.StartServer(t, redlocktest.WithArgs("--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf")))
	serveAllSlots(t, s)
	c, _ := newLogged(t, []redis.UniversalClient{client(t, s.Addr(), "", "")}, redlock.WithKeyPrefix("{locks}:"))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"a", "b"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUnreachableNodeNamesItsCause: a node at a closed port or an unknown
// host is an outage (ErrUnavailable, not ErrMisconfigured), and the text
// says why it gave no answer, also in the rounds that do not wait for it
// any more; one log line names it while the quorum works.
func TestUnreachableNodeNamesItsCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	for _, tc := range []struct{ name, addr, cause string }{
		{"closed port", closed, "connection refused"},
		{"unknown host", "schedlock-no-such-host.invalid:6379", "no such host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			alone, _ := newLogged(t, []redis.UniversalClient{client(t, tc.addr, "", "")})
			for i := range 2 { // the second round does not wait for the node
				_, err := alone.TryAcquire(ctx, []string{"r"}, time.Second)
				if !errors.Is(err, redlock.ErrUnavailable) || errors.Is(err, redlock.ErrMisconfigured) {
					t.Fatalf("round %d: want ErrUnavailable only: %v", i+1, err)
				}
				if !strings.Contains(err.Error(), "cannot connect") || !strings.Contains(err.Error(), tc.cause) {
					t.Errorf("round %d: text does not name the cause %q: %v", i+1, tc.cause, err)
				}
			}

			good := redlocktest.Start(t, 2)
			c, logs := newLogged(t, append(good.Clients(t), client(t, tc.addr, "", "")))
			for range 3 {
				l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			c.Close(ctx) // let the release rounds' last answers in
			lines := logs.lines("node=" + tc.addr)
			if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], tc.cause) {
				t.Errorf("want one warning naming %q for %s; log:\n%s", tc.cause, tc.addr, logs)
			}
		})
	}
}

// TestFrozenNodeIsLoggedAndRecovers: a node stopped (SIGSTOP) while a
// quorum works is logged once when it stops answering and once when it
// answers again.
func TestFrozenNodeIsLoggedAndRecovers(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c, logs := newLogged(t, cl.Clients(t))
	ctx := context.Background()
	lockUnlock := func() {
		t.Helper()
		l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lockUnlock()
	cl[2].Stop(t)
	for end := time.Now().Add(time.Second); time.Now().Before(end); { // ten node timeouts
		lockUnlock()
	}
	cl[2].Cont(t)
	deadline := time.Now().Add(10 * time.Second)
	for len(logs.lines("answers again")) == 0 && time.Now().Before(deadline) {
		lockUnlock()
		time.Sleep(50 * time.Millisecond)
	}
	addr := cl[2].Addr()
	bad, good := logs.lines("node="+addr, "node failing"), logs.lines("node="+addr, "answers again")
	if len(bad) != 1 || len(good) != 1 {
		t.Fatalf("want one failing and one recovery line for %s; log:\n%s", addr, logs)
	}
	if !strings.Contains(bad[0], "no answer within the") {
		t.Errorf("failing line does not say why: %s", bad[0])
	}
	if others := logs.lines("node failing"); len(others) != 1 {
		t.Errorf("other nodes logged as failing:\n%s", logs)
	}
	if !strings.Contains(bad[0], "1 of 3 nodes failing: locks work while a quorum of 2 answers") {
		t.Errorf("failing line does not say that the quorum still works: %s", bad[0])
	}
}

// TestLostQuorumIsLoggedAsSuch: once so many nodes fail that no quorum
// answers, the failing line says that no lock works (it said "locks work
// while a quorum of the nodes answers" with every node down).
func TestLostQuorumIsLoggedAsSuch(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c, logs := newLogged(t, cl.Clients(t))
	ctx := context.Background()
	cl[1].Stop(t)
	cl[2].Stop(t)
	defer cl[1].Cont(t)
	defer cl[2].Cont(t)
	for range 3 {
		if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second); !errors.Is(err, redlock.ErrUnavailable) {
			t.Fatalf("TryAcquire with 2 of 3 nodes stopped = %v, want ErrUnavailable", err)
		}
	}
	// The two nodes' lines may be logged concurrently (each counts the
	// failing nodes when it logs): at least the later one says that no
	// quorum answers, and none says that locks work with two failing.
	lost := logs.lines("node failing", "2 of 3 nodes failing, fewer than a quorum of 2 answer: no lock can be acquired")
	if len(lost) == 0 {
		t.Errorf("no failing line says that no quorum answers; log:\n%s", logs)
	}
	if works := logs.lines("node failing", "locks work"); len(works) > 1 || len(works) == 1 && !strings.Contains(works[0], "1 of 3") {
		t.Errorf("a failing line says that locks work with two nodes failing:\n%s", logs)
	}
}

// TestNewWarnsAboutNodeSets: 2 nodes, an even count and two names of one
// local server work, and New says on the logger what they do not
// tolerate; 3 and 5 distinct nodes log nothing. No I/O.
func TestNewWarnsAboutNodeSets(t *testing.T) {
	nodes := func(addrs ...string) []redis.UniversalClient {
		var out []redis.UniversalClient
		for _, a := range addrs {
			rdb := redis.NewClient(&redis.Options{Addr: a})
			t.Cleanup(func() { _ = rdb.Close() })
			out = append(out, rdb)
		}
		return out
	}
	t.Run("ring", func(t *testing.T) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "10.0.0.9:6379"}})
		t.Cleanup(func() { _ = ring.Close() })
		_, logs := newLogged(t, append(nodes("10.0.0.1:6379", "10.0.0.2:6379"), ring))
		if !strings.Contains(logs.String(), "redis.Ring is one node here") {
			t.Errorf("no warning about a Ring as a node: %q", logs)
		}
	})
	for _, tc := range []struct {
		name  string
		addrs []string
		want  string // "" for no warning
	}{
		{"two", []string{"10.0.0.1:6379", "10.0.0.2:6379"}, "2 nodes: the quorum is both"},
		{"four", []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379", "10.0.0.4:6379"}, "4 nodes: the quorum is 3"},
		{"one server twice", []string{"localhost:7001", "127.0.0.1:7001", "10.0.0.3:6379"}, "two nodes are one server"},
		{"three", []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}, ""},
		{"five local", []string{"localhost:7001", "localhost:7002", "127.0.0.1:7003", "[::1]:7004", "localhost:7005"}, ""},
		{"one", []string{"10.0.0.1:6379"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, logs := newLogged(t, nodes(tc.addrs...))
			got := logs.String()
			switch {
			case tc.want == "" && got != "":
				t.Errorf("unexpected log: %s", got)
			case tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "level=WARN")):
				t.Errorf("log %q does not warn %q", got, tc.want)
			}
		})
	}
}

// TestEvalOnMisconfiguredNodesIsMisconfigured: an Eval that every node
// refuses with NOPERM (an ACL user without EVAL) is an operator's mistake,
// not an outage: its error matches ErrMisconfigured and not
// ErrUnavailable, as Eval's doc says (a reviewer found the doc saying
// ErrUnavailable).
func TestEvalOnMisconfiguredNodesIsMisconfigured(t *testing.T) {
	ctx := context.Background()
	var nodes []redis.UniversalClient
	for range 3 {
		s := redlocktest.StartServer(t)
		if err := s.Client(t).Do(ctx, "ACL", "SETUSER", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha").Err(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, client(t, s.Addr(), "noeval", "pw"))
	}
	c := newClient(t, nodes, redlock.WithLogger(slog.New(slog.DiscardHandler)))
	_, err := c.Eval(ctx, redlock.NewScript("return 1"), []string{"k"})
	var q *redlock.QuorumError
	if !errors.As(err, &q) || q.Op != "eval" {
		t.Fatalf("Eval = %v, want a *QuorumError of op eval", err)
	}
	if !errors.Is(err, redlock.ErrMisconfigured) || errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("Eval = %v: want ErrMisconfigured (%v) and not ErrUnavailable (%v)",
			err, errors.Is(err, redlock.ErrMisconfigured), errors.Is(err, redlock.ErrUnavailable))
	}
}
