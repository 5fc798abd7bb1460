package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
)

// threeNodes starts three in-memory Redis servers for the examples.
func threeNodes() (nodes []redis.UniversalClient, stop func()) {
	var ms []*miniredis.Miniredis
	for range 3 {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			panic(err)
		}
		ms = append(ms, m)
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: m.Addr()}))
	}
	return nodes, func() {
		for i, n := range nodes {
			n.Close()
			ms[i].Close()
		}
	}
}

func ExampleClient_Acquire() {
	nodes, stop := threeNodes()
	defer stop()
	locks, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer locks.Close(ctx) // stops the Client's goroutines; then close the nodes

	l, err := locks.Acquire(ctx, []string{"invoice:42"}, 10*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("held:", l.Resources(), "valid for more than 9s:", time.Until(l.Until()) > 9*time.Second)

	// A second owner is refused: busy, not "Redis down".
	_, err = locks.TryAcquire(ctx, []string{"invoice:42"}, 10*time.Second)
	fmt.Println("second owner refused:", errors.Is(err, redlock.ErrNotAcquired), "unavailable:", errors.Is(err, redlock.ErrUnavailable))

	fmt.Println("release:", l.Release(ctx))
	// Output:
	// held: [invoice:42] valid for more than 9s: true
	// second owner refused: true unavailable: false
	// release: <nil>
}

func ExampleClient_Do() {
	nodes, stop := threeNodes()
	defer stop()
	locks, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	defer locks.Close(context.Background())
	err = locks.Do(context.Background(), []string{"report"}, time.Second, func(ctx context.Context) error {
		// The lock is extended every third of its TTL while this runs; ctx
		// is cancelled if the lock is lost.
		time.Sleep(1500 * time.Millisecond)
		l, _ := redlock.FromContext(ctx)
		fmt.Println("still held after 1.5x the TTL:", time.Now().Before(l.Until()))
		return nil
	})
	fmt.Println("Do:", err)
	// Output:
	// still held after 1.5x the TTL: true
	// Do: <nil>
}
