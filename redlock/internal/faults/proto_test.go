package faults

import (
	"context"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

func TestProto(t *testing.T) {
	RunSim(t, 3, func(t *testing.T, c *SimCluster) {
		nodes, links := c.Clients()
		rl, err := redlock.New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		l, err := rl.Acquire(context.Background(), []string{"x"}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("acquired in %v, until %v", time.Since(start), l.Until().Sub(start))
		_, err = rl.TryAcquire(context.Background(), []string{"x"}, 10*time.Second)
		t.Logf("second: %v", err)
		time.Sleep(11 * time.Second)
		l2, err := rl.TryAcquire(context.Background(), []string{"x"}, 10*time.Second)
		t.Logf("after expiry: %v", err)
		links[0].SetLatency(30 * time.Millisecond)
		links[1].Partition(redlocktest.BothDirections)
		s2 := time.Now()
		err = rl.Do(context.Background(), []string{"y"}, time.Second, func(ctx context.Context) error {
			t.Logf("do acquired after %v", time.Since(s2))
			time.Sleep(5 * time.Second)
			return nil
		})
		t.Logf("do: %v at %v", err, time.Since(start))
		c.Nodes[2].Freeze()
		err = rl.Do(context.Background(), []string{"z"}, time.Second, func(ctx context.Context) error {
			select {
			case <-ctx.Done():
				t.Logf("lost after %v: %v", time.Since(s2), context.Cause(ctx))
			case <-time.After(5 * time.Second):
			}
			return nil
		})
		t.Logf("do2: %v", err)
		c.Nodes[2].Thaw()
		_ = l2.Release(context.Background())
		t.Logf("keys %v", c.Keys(func(string) bool { return true }))
		time.Sleep(2 * time.Second)
		t.Logf("keys %v", c.Keys(func(string) bool { return true }))
	})
}
