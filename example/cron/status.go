package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
)

// serveStatus serves the fleet's status page (scheduler.Handler, with its
// controls on) on addr, read through a Scheduler of its own on the nodes
// at addrs that runs no job: any instance of a fleet can serve the page.
// It returns the page's URL and a function that stops the server and
// closes its clients.
func serveStatus(addr string, addrs []string, length int) (url string, stop func(), err error) {
	nodes := make([]redis.UniversalClient, len(addrs))
	rdbs := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		rdbs[i] = redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		nodes[i] = rdbs[i]
	}
	closeClients := func() {
		for _, rdb := range rdbs {
			_ = rdb.Close()
		}
	}
	locks, err := redlock.New(nodes)
	if err != nil {
		closeClients()
		return "", nil, err
	}
	closeLocks := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = locks.Close(ctx)
		closeClients()
	}
	page, err := scheduler.New(locks, scheduler.WithLockerOptions(scheduler.WithInstanceID("status-page"),
		scheduler.WithHistoryLength(length)))
	if err != nil {
		closeLocks()
		return "", nil, err
	}
	h, err := page.Handler(scheduler.WithControls(true))
	if err != nil {
		closeLocks()
		return "", nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		closeLocks()
		return "", nil, fmt.Errorf("-status %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("status page:", err)
		}
		_ = page.Shutdown()
		closeLocks()
	}
	return "http://" + ln.Addr().String() + "/", stop, nil
}
