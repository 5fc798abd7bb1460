package redlock_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock"
)

// TestMain checks that no goroutine outlives the tests, except go-redis's
// pool probe of a node it could not dial PoolSize times in a row, which
// sees its client's Close only after its one-second sleep.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// miniNodes starts n miniredis servers and returns clients for them.
func miniNodes(t *testing.T, n int) ([]*miniredis.Miniredis, []redis.UniversalClient) {
	t.Helper()
	var ms []*miniredis.Miniredis
	var cs []redis.UniversalClient
	for range n {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { c.Close() })
		ms = append(ms, m)
		cs = append(cs, c)
	}
	return ms, cs
}

func TestNewRejectsBadConfig(t *testing.T) {
	a := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	b := redis.NewClient(&redis.Options{Addr: "127.0.0.1:2"})
	sameAddr := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	var typedNil *redis.Client
	t.Cleanup(func() { a.Close(); b.Close(); sameAddr.Close() })
	tests := []struct {
		name  string
		nodes []redis.UniversalClient
		opts  []redlock.Option
		want  string
	}{
		{"no nodes", nil, nil, "no nodes"},
		{"nil node", []redis.UniversalClient{a, nil}, nil, "nodes[1] is nil"},
		{"typed nil node", []redis.UniversalClient{typedNil}, nil, "nodes[0] is nil"},
		{"same client twice", []redis.UniversalClient{a, b, a}, nil, "nodes[0] and nodes[2] are the same node (127.0.0.1:1)"},
		{"same address twice", []redis.UniversalClient{a, sameAddr}, nil, "nodes[0] and nodes[1] are the same node (127.0.0.1:1)"},
		{"negative drift", []redis.UniversalClient{a}, []redlock.Option{redlock.WithDriftFactor(-0.1)}, "drift factor -0.1"},
		{"drift 0.5", []redis.UniversalClient{a}, []redlock.Option{redlock.WithDriftFactor(0.5)}, "drift factor 0.5"},
		{"drift NaN", []redis.UniversalClient{a}, []redlock.Option{redlock.WithDriftFactor(math.NaN())}, "drift factor NaN"},
		{"zero node timeout", []redis.UniversalClient{a}, []redlock.Option{redlock.WithNodeTimeout(0)}, "node timeout 0s"},
		{"min validity 1", []redis.UniversalClient{a}, []redlock.Option{redlock.WithMinValidity(1)}, "minimum validity 1"},
		{"nil retry", []redis.UniversalClient{a}, []redlock.Option{redlock.WithRetry(nil)}, "retry policy factory (WithRetry) is nil"},
		{"nil option", []redis.UniversalClient{a}, []redlock.Option{nil}, "option 1 of 1 is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := redlock.New(tt.nodes, tt.opts...)
			if c != nil || !errors.Is(err, redlock.ErrInvalidArgument) {
				t.Fatalf("New() = %v, %v; want nil, ErrInvalidArgument", c, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
		})
	}
}

func TestAcquireRejectsBadInput(t *testing.T) {
	_, nodes := miniNodes(t, 1)
	c := newClient(t, nodes)
	tests := []struct {
		name      string
		resources []string
		ttl       time.Duration
		want      string
	}{
		{"ttl 999us", []string{"r"}, 999 * time.Microsecond, "TTL 999µs"},
		{"ttl zero", []string{"r"}, 0, "TTL 0s"},
		{"ttl negative", []string{"r"}, -time.Second, "TTL -1s"},
		{"ttl below drift", []string{"r"}, 3 * time.Millisecond, "TTL 3ms is too short"},
		{"no resources", nil, time.Second, "no resources"},
		{"empty resource", []string{"a", ""}, time.Second, "resources[1] is empty"},
		{"duplicate resource", []string{"a", "b", "a"}, time.Second, `resource "a" is listed twice`},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, acquire := range map[string]func() (*redlock.Lock, error){
				"Acquire":    func() (*redlock.Lock, error) { return c.Acquire(ctx, tt.resources, tt.ttl) },
				"TryAcquire": func() (*redlock.Lock, error) { return c.TryAcquire(ctx, tt.resources, tt.ttl) },
			} {
				l, err := acquire()
				if l != nil || !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s() = %v, %v; want an ErrInvalidArgument naming %q", name, l, err, tt.want)
				}
			}
			err := c.Do(ctx, tt.resources, tt.ttl, func(context.Context) error { return nil })
			if !errors.Is(err, redlock.ErrInvalidArgument) {
				t.Errorf("Do() = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if keys := nodes[0].Keys(ctx, "*").Val(); len(keys) != 0 {
		t.Errorf("keys after rejected input = %q, want none", keys)
	}
}

func TestNilLockIsAnErrorNotAPanic(t *testing.T) {
	var l *redlock.Lock
	ctx := context.Background()
	if err := l.Release(ctx); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Release on nil = %v, want ErrInvalidArgument", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Extend on nil = %v, want ErrInvalidArgument", err)
	}
	if !l.Until().IsZero() || l.Resources() != nil {
		t.Errorf("nil Lock: Until() = %v, Resources() = %v; want zero values", l.Until(), l.Resources())
	}
}

func TestReleaseTwice(t *testing.T) {
	_, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("first Release = %v, want nil", err)
	}
	// defer l.Release(ctx) after an explicit Release: a no-op, never
	// ErrLockLost, which the docs say to alert on.
	if err := l.Release(ctx); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Extend after Release = %v, want ErrLockLost", err)
	}
}

func TestMultiResourceIsAllOrNothing(t *testing.T) {
	ms, nodes := miniNodes(t, 3)
	c := newClient(t, nodes)
	ctx := context.Background()
	held, err := c.TryAcquire(ctx, []string{"b"}, time.Second)
	must(t, err)
	_, err = c.TryAcquire(ctx, []string{"a", "b", "c"}, time.Second)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || !errors.Is(err, redlock.ErrNotAcquired) || errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("TryAcquire(a,b,c) with b held = %v; want a *QuorumError matching ErrNotAcquired only", err)
	}
	if got := qerr.Count(redlock.OutcomeHeld); got < 2 {
		t.Errorf("held outcomes = %d, want at least 2 (quorum impossible)", got)
	}
	for i, m := range ms {
		if m.Exists("a") || m.Exists("c") {
			t.Errorf("node %d: a or c set by a refused multi-resource acquire", i)
		}
	}
	must(t, held.Release(ctx))
	l, err := c.TryAcquire(ctx, []string{"a", "b", "c"}, time.Second)
	if err != nil {
		t.Fatalf("TryAcquire(a,b,c) when free = %v", err)
	}
	granted := 0
	for _, m := range ms {
		if len(m.Keys()) == 3 {
			granted++
		}
	}
	if granted < c.Quorum() {
		t.Errorf("%d nodes hold all 3 keys, want at least the quorum %d", granted, c.Quorum())
	}
	must(t, l.Release(ctx))
	waitSettled(t, c)
	for i, m := range ms {
		if got := m.Keys(); len(got) != 0 {
			t.Errorf("node %d keys after Release = %q, want none", i, got)
		}
	}
}

func TestKeyPrefix(t *testing.T) {
	ms, nodes := miniNodes(t, 1)
	c := newClient(t, nodes, redlock.WithKeyPrefix("lock:"))
	l, err := c.TryAcquire(context.Background(), []string{"job"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !ms[0].Exists("lock:job") {
		t.Errorf("keys = %q, want lock:job", ms[0].Keys())
	}
	if got := l.Resources(); len(got) != 1 || got[0] != "job" {
		t.Errorf("Resources() = %q, want [job]", got)
	}
	_ = l.Release(context.Background())
}

func TestQuorumIsOfConfiguredNodes(t *testing.T) {
	ms, nodes := miniNodes(t, 5)
	c := newClient(t, nodes, redlock.WithNodeTimeout(200*time.Millisecond))
	if c.Quorum() != 3 || c.Nodes() != 5 {
		t.Fatalf("Quorum(), Nodes() = %d, %d; want 3, 5", c.Quorum(), c.Nodes())
	}
	ms[0].Close()
	ms[1].Close()
	ms[2].Close()
	_, err := c.TryAcquire(context.Background(), []string{"r"}, time.Second)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || !errors.Is(err, redlock.ErrUnavailable) || !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire with 3 of 5 down = %v; want *QuorumError matching ErrUnavailable and ErrNotAcquired", err)
	}
	if got := qerr.Count(redlock.OutcomeOK); got != 2 {
		t.Errorf("ok outcomes = %d, want 2 (the two live nodes)", got)
	}
	waitSettled(t, c) // the undo does not wait
	for _, m := range ms[3:] {
		if keys := m.Keys(); len(keys) != 0 {
			t.Errorf("live node keeps %q after a failed attempt, want none", keys)
		}
	}
}

// TestHolderWithFailedNodes: on 4 nodes (quorum 3), Holder names a lock
// held on a quorum, answers ErrUnavailable when the failed nodes could
// complete a quorum for the most voted lock, and "not held" when they
// could not (two failed nodes and no lock on the others: before, two
// failed nodes of four always made the answer unknown). Per node: A holds
// the lock, - lost its key, X is down.
func TestHolderWithFailedNodes(t *testing.T) {
	for _, tc := range []struct {
		nodes         string
		held, unknown bool
	}{
		{"AAAX", true, false},
		{"AA-X", false, true},
		{"A-XX", false, true},
		{"--XX", false, false},
		{"A---", false, false},
	} {
		t.Run(tc.nodes, func(t *testing.T) { holderWithFailedNodes(t, tc.nodes, tc.held, tc.unknown) })
	}
}

// holderWithFailedNodes is one case of TestHolderWithFailedNodes: nodes
// says what becomes of each node after the lock was granted ('A' keeps
// it, '-' loses the key, 'X' goes down).
func holderWithFailedNodes(t *testing.T, nodes string, wantHeld, wantUnknown bool) {
	ms, cs := miniNodes(t, 4)
	// 500 ms: a down node's call ends at the node timeout.
	c := newClient(t, cs, redlock.WithNodeTimeout(500*time.Millisecond))
	ctx := context.Background()
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, redlock.WithMetadata("a")); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	for i, state := range nodes {
		switch state {
		case '-':
			ms[i].Del("r")
		case 'X':
			ms[i].Close()
		}
	}
	md, held, err := c.HolderMetadata(ctx, "r")
	checkHolder(t, md, held, err, wantHeld, wantUnknown)
}

// checkHolder fails the test unless HolderMetadata's md, held and err
// say held by "a" (wantHeld), unknown (wantUnknown), or not held.
func checkHolder(t *testing.T, md string, held bool, err error, wantHeld, wantUnknown bool) {
	t.Helper()
	switch {
	case wantHeld && (!held || md != "a" || err != nil):
		t.Errorf("Holder = %q, %v, %v; want a, true, nil", md, held, err)
	case wantUnknown && (held || !errors.Is(err, redlock.ErrUnavailable)):
		t.Errorf("Holder = %q, %v, %v; want ErrUnavailable", md, held, err)
	case !wantHeld && !wantUnknown && (held || err != nil):
		t.Errorf("Holder = %q, %v, %v; want not held, nil", md, held, err)
	}
}

// TestHolderNeedsAQuorum: a refused round names a holder only when one
// holder refused on a quorum of nodes. A 1-1 split between two contenders
// named the lexically smaller one, so OnNewLeader reported candidates that
// never led (found with example/leader).
func TestHolderNeedsAQuorum(t *testing.T) {
	split := &redlock.QuorumError{Op: "acquire", Quorum: 2, Nodes: []redlock.NodeResult{
		{Outcome: redlock.OutcomeHeld, Holder: "b"},
		{Outcome: redlock.OutcomeHeld, Holder: "a"},
		{Outcome: redlock.OutcomePending},
	}}
	if h, ok := split.HolderMetadata(); ok {
		t.Errorf("Holder() of a split round = %q, true; want no holder", h)
	}
	held := &redlock.QuorumError{Op: "acquire", Quorum: 2, Nodes: []redlock.NodeResult{
		{Outcome: redlock.OutcomeHeld, Holder: "b"},
		{Outcome: redlock.OutcomeOK},
		{Outcome: redlock.OutcomeHeld, Holder: "b"},
	}}
	if h, ok := held.HolderMetadata(); !ok || h != "b" {
		t.Errorf("Holder() = %q, %v; want b, true", h, ok)
	}
}
