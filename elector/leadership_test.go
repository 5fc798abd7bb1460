package elector_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestLeaderships: one read gives each election's leader, with the term
// its leader holds and when that term started; an election nobody leads
// has no leader; after a failover the new leader's term shows.
func TestLeaderships(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	a := startCandidate(t, cl, "a", w, elector.WithLeaseTTL(time.Second))
	reader := newTestClient(t, cl)
	ctx := context.Background()
	start := time.Now()
	var ls []elector.Leadership
	waitUntil(t, 10*time.Second, func() bool {
		var err error
		ls, err = elector.Leaderships(ctx, reader, []string{"test", "nobody"})
		return err == nil && ls[0].Term != 0
	})
	term, err := a.e.Term()
	if err != nil {
		t.Fatal(err)
	}
	if l := ls[0]; l.Election != "test" || l.Leader != "a" || l.Term != term || l.Since.Before(start.Add(-time.Second)) || l.Since.After(time.Now().Add(time.Second)) {
		t.Errorf("Leaderships test = %+v, want a with term %d since about %v", l, term, start)
	}
	if l := ls[1]; l.Leader != "" || l.Unknown || l.Term != 0 {
		t.Errorf("Leaderships nobody = %+v, want no leader", l)
	}
	b := startCandidate(t, cl, "b", w, elector.WithLeaseTTL(time.Second))
	a.stop()
	waitUntil(t, 10*time.Second, func() bool {
		ls, err = elector.Leaderships(ctx, reader, []string{"test"})
		return err == nil && ls[0].Leader == "b" && ls[0].Term != 0
	})
	if bt, err := b.e.Term(); err != nil || ls[0].Term != bt || bt <= term {
		t.Errorf("after failover: Leaderships = %+v, b's term %d (%v); want b's term, above %d", ls[0], bt, err, term)
	}
	for _, bad := range [][]string{nil, {""}, {"x", "x"}} {
		if _, err := elector.Leaderships(ctx, reader, bad); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("Leaderships(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// newTestClient returns a redlock Client of its own on cl's nodes.
func newTestClient(t *testing.T, cl redlocktest.Cluster) *redlock.Client {
	t.Helper()
	c, err := redlock.New(cl.Clients(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// waitUntil polls cond until it holds, failing t after d.
func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", d)
		}
	}
}
