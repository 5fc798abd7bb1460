package redlock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// BenchmarkAcquireRelease measures one TryAcquire + Release of a free lock
// on real redis-server nodes: sequential (one key, one goroutine) and
// parallel (GOMAXPROCS x -cpu goroutines, distinct keys).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, n := range []int{1, 3, 5} {
		cl := redlocktest.Start(b, n)
		c, err := redlock.New(cl.Clients(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { closeClient(b, c) })
		ctx := context.Background()
		b.Run(fmt.Sprintf("nodes=%d/sequential", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.TryAcquire(ctx, []string{"bench"}, 10*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("nodes=%d/parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			var id atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				key := []string{fmt.Sprintf("bench-%d", id.Add(1))}
				for pb.Next() {
					l, err := c.TryAcquire(ctx, key, 10*time.Second)
					if err != nil {
						b.Error(err)
						return
					}
					if err := l.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
