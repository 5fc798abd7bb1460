package faults

import (
	"context"
	"fmt"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
)

func TestProto(t *testing.T) {
	var ms []*miniredis.Miniredis
	for range 3 {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		ms = append(ms, m)
	}
	synctest.Test(t, func(t *testing.T) {
		stop := make(chan struct{})
		ffDone := make(chan struct{})
		go func() {
			defer close(ffDone)
			last := time.Now()
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				now := time.Now()
				for _, m := range ms {
					m.FastForward(now.Sub(last))
				}
				last = now
			}
		}()
		var nodes []redis.UniversalClient
		for i, m := range ms {
			c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("sim%d:6379", i), Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				a, b := net.Pipe()
				m.Server().ServeConn(b)
				return a, nil
			}})
			nodes = append(nodes, c)
		}
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
		err = rl.Do(context.Background(), []string{"y"}, time.Second, func(ctx context.Context) error {
			time.Sleep(5 * time.Second)
			return nil
		})
		t.Logf("do: %v at %v", err, time.Since(start))
		_ = l2.Release(context.Background())
		for _, n := range nodes {
			n.Close()
		}
		close(stop)
		<-ffDone
	})
}
