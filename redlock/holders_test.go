package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestHolders: one round reads the holder of many resources, as
// HolderMetadata does one by one, with the lock's remaining TTL; a lock on
// a minority is not held, and a failed node that could complete a quorum
// leaves it unknown.
func TestHolders(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, nodes, redlock.WithNodeTimeout(300*time.Millisecond))
	ctx := context.Background()
	_, err := c.TryAcquire(ctx, []string{"a"}, time.Minute, redlock.WithMetadata("instance-a"))
	must(t, err)
	_, err = c.TryAcquire(ctx, []string{"b"}, time.Minute, redlock.WithMetadata("instance-b"))
	must(t, err)
	waitSettled(t, c)
	// "b" stays on node 0 only.
	for _, n := range nodes[1:] {
		must(t, n.Del(ctx, "b").Err())
	}
	hs, err := c.Holders(ctx, []string{"a", "b", "free"})
	must(t, err)
	if h := hs[0]; !heldAboutAMinute(h, "instance-a") {
		t.Errorf("Holders a = %+v, want held by instance-a for about a minute", h)
	}
	if h := hs[1]; h.Held || h.Unknown || h.Metadata != "" {
		t.Errorf("Holders b (on one node of 3) = %+v, want not held, known", h)
	}
	if h := hs[2]; h != (redlock.Holding{}) {
		t.Errorf("Holders free = %+v, want the zero Holding", h)
	}
	must(t, nodes[1].Del(ctx, "a").Err())
	cl[2].Stop(t)
	defer cl[2].Cont(t)
	hs, err = c.Holders(ctx, []string{"a", "free"})
	if err != nil {
		t.Fatalf("Holders with one node of 3 stopped: %v", err)
	}
	if !hs[0].Unknown || hs[0].Held || hs[1].Unknown {
		t.Errorf("Holders with node 2 stopped = %+v, want a unknown (node 2 may complete its quorum), free known", hs)
	}
	cl[1].Stop(t)
	defer cl[1].Cont(t)
	if _, err := c.Holders(ctx, []string{"a"}); !errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("Holders with two nodes of 3 stopped = %v, want ErrUnavailable", err)
	}
	checkHoldersRejectsBadInput(t, c)
}

// heldAboutAMinute reports whether h says held by metadata md, known, for
// 50 s to a minute.
func heldAboutAMinute(h redlock.Holding, md string) bool {
	return h.Held && h.Metadata == md && h.TTL > 50*time.Second && h.TTL <= time.Minute && !h.Unknown
}

// checkHoldersRejectsBadInput fails the test unless c's Holders rejects
// no resources, an empty one, a duplicate and one with a NUL byte.
func checkHoldersRejectsBadInput(t *testing.T, c *redlock.Client) {
	t.Helper()
	for _, bad := range [][]string{nil, {""}, {"x", "x"}, {"a\x00"}} {
		if _, err := c.Holders(context.Background(), bad); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("Holders(%q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}
