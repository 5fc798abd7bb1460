package elector_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// The error texts are part of what a user reads in a log: these tests pin
// the texts of the common errors.

// checkText fails t unless err reads want exactly and matches sentinel.
func checkText(t *testing.T, what string, err, sentinel error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error, want %q", what, want)
	case !errors.Is(err, sentinel):
		t.Errorf("%s = %v, want an error matching %v", what, err, sentinel)
	case err.Error() != want:
		t.Errorf("%s reads\n%s\nwant\n%s", what, err, want)
	}
}

func TestNewErrorTexts(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	client, err := redlock.New([]redis.UniversalClient{rdb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	gated, err := redlock.New([]redis.UniversalClient{rdb}, redlock.WithRestartGating(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		client *redlock.Client
		elect  string
		opts   []elector.Option
		want   string
	}{
		{"nil client", nil, "x", nil, "elector: invalid argument: the *redlock.Client is nil"},
		{"empty name", client, "", nil, "elector: invalid argument: the election name is empty"},
		{"empty identity", client, "x", []elector.Option{elector.WithIdentity("")},
			"elector: invalid argument: identity (WithIdentity) is empty"},
		{"long identity", client, "x", []elector.Option{elector.WithIdentity(strings.Repeat("x", 2000))},
			"elector: invalid argument: identity (WithIdentity) is 2000 bytes, more than the maximum 1024"},
		{"tiny TTL", client, "x", []elector.Option{elector.WithLeaseTTL(time.Millisecond)},
			"elector: invalid argument: lease TTL 1ms (WithLeaseTTL) is below the minimum 30ms"},
		{"renew too long", client, "x", []elector.Option{elector.WithLeaseTTL(time.Second), elector.WithRenewInterval(600 * time.Millisecond)},
			"elector: invalid argument: renew interval 600ms (WithRenewInterval) must be above 0 and at most half the lease TTL (500ms), " +
				"so that the lease survives a failed renewal"},
		{"retry not below TTL", client, "x", []elector.Option{elector.WithLeaseTTL(time.Second), elector.WithRetryPeriod(time.Second)},
			"elector: invalid argument: retry period 1s (WithRetryPeriod) must be above 0 and below the lease TTL 1s"},
		{"nil option", client, "x", []elector.Option{elector.WithIdentity("a"), nil},
			"elector: invalid argument: option 2 of 2 is nil"},
		{"lease above the restart gate", gated, "x", nil,
			"elector: lease TTL 10s (WithLeaseTTL): invalid argument: TTL 10s is above the restart gate's maximum TTL 5s (WithRestartGating)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := elector.New(tt.client, tt.elect, tt.opts...)
			checkText(t, "New", err, redlock.ErrInvalidArgument, tt.want)
		})
	}
	e, err := elector.New(client, "x")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Leader(context.Background())
	checkText(t, "Leader of an election without one", err, elector.ErrNoLeader, "elector: no leader")
	if err := e.IsLeader(context.Background()); err != elector.ErrNotLeader || err.Error() != "elector: not the leader" {
		t.Errorf("IsLeader of a candidate that does not run = %v, want %q", err, "elector: not the leader")
	}
}

// TestLeaderUnknownText freezes two of three real Redis servers: the
// text is the elector's, with redlock's count of the nodes.
func TestLeaderUnknownText(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	addrs := cl.Addrs()
	client, err := redlock.New(cl.Clients(t), redlock.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	e, err := elector.New(client, "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cl[1:] {
		s.Stop(t)
		t.Cleanup(func() { s.Cont(t) }) // before the Client's Close
	}
	_, err = e.Leader(context.Background())
	checkText(t, "Leader with 2 of 3 nodes down", err, redlock.ErrUnavailable,
		`elector: leader of "x": holder of "schedlock:elector:x" unknown: 1 of 3 nodes answered, quorum is 2, too many nodes failed: `+
			addrs[0]+` answered; `+addrs[1]+` no answer within the 100ms node timeout; `+addrs[2]+` no answer within the 100ms node timeout`)
}

// TestMisconfiguredCampaignIsLogged: a campaign refused by nodes that an
// operator must fix (a password the clients do not send) is logged with
// the cause, where a campaign lost to another leader is not.
func TestMisconfiguredCampaignIsLogged(t *testing.T) {
	var nodes []redis.UniversalClient
	for i := range 3 {
		m := miniredis.RunT(t)
		if i > 0 {
			m.RequireAuth("secret")
		}
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		nodes = append(nodes, rdb)
	}
	client, err := redlock.New(nodes, redlock.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	logs := &logBuffer{}
	e, err := elector.New(client, "x", elector.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
		elector.WithRetryPeriod(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "campaign failed") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // about 20 more campaigns
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); strings.Count(got, "campaign failed") != 1 || !strings.Contains(got, "NOAUTH") {
		t.Errorf("log does not report the misconfigured campaign once with its cause:\n%s", got)
	}
}

// logBuffer is a log's output, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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
