package scheduler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
)

// exampleNodes starts three in-memory Redis nodes.
func exampleNodes() (*redlock.Client, func()) {
	var nodes []redis.UniversalClient
	var ms []*miniredis.Miniredis
	for range 3 {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			panic(err)
		}
		ms = append(ms, m)
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: m.Addr()}))
	}
	locks, err := redlock.New(nodes)
	if err != nil {
		panic(err)
	}
	return locks, func() {
		_ = locks.Close(context.Background())
		for i := range nodes {
			nodes[i].Close()
			ms[i].Close()
		}
	}
}

func ExampleNew() {
	locks, stop := exampleNodes()
	defer stop()

	s, err := scheduler.New(locks)
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_, err = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func(ctx context.Context) {
			ctx = s.RunContext(ctx) // cancelled if this run's lock is lost
			_, held := redlock.FromContext(ctx)
			fmt.Println("report ran; lock held:", held)
			close(done)
		}),
		gocron.WithName("report"), // a stable name, the same on every instance
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	<-done
	if err := s.Shutdown(); err != nil {
		panic(err)
	}
	// Output:
	// report ran; lock held: true
}

// Only the elected leader runs jobs: gocron asks the elector before every
// run (gocron.WithDistributedElector), and no locker is consulted.
func Example_withElector() {
	locks, stop := exampleNodes()
	defer stop()

	e, err := elector.New(locks, "cron-leader", elector.WithIdentity("instance-1"),
		elector.WithLeaseTTL(2*time.Second))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	running := make(chan struct{})
	go func() { defer close(running); _ = e.Run(ctx) }()
	for e.IsLeader(ctx) != nil {
		time.Sleep(10 * time.Millisecond)
	}

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() {
			term, _ := e.Term()
			fmt.Println("ran on the leader, with a fencing term:", term > 0)
			close(done)
		}), gocron.WithName("report"))
	if err != nil {
		panic(err)
	}
	s.Start()
	<-done
	_ = s.Shutdown() // scheduler first, then resign, then close clients
	cancel()
	<-running
	// Output:
	// ran on the leader, with a fencing term: true
}
