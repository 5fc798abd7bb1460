package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// tripCounter is a go-redis hook that counts round trips to its node: a
// command sent alone or a pipeline is one each; the set-up of a new
// connection (HELLO, CLIENT SETINFO) is not counted.
type tripCounter struct{ n atomic.Int32 }

// setup reports whether cmd belongs to go-redis's connection set-up.
func setup(cmd redis.Cmder) bool { return cmd.Name() == "hello" || cmd.Name() == "client" }

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setup(cmd) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !setup(cmds[0]) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// bigFleet starts instances Schedulers on cl's nodes, each with the same
// jobs daily jobs (they do not fire during a test), writes runs entries
// of a run record for each job on every node, and waits until every
// instance has registered its jobs. It returns a reader Scheduler (not
// started, no jobs, nothing sent yet) and its redlock Client, whose
// go-redis clients count their round trips per node.
func bigFleet(t testing.TB, cl redlocktest.Cluster, instances, jobs, runs int) (*scheduler.Scheduler, *redlock.Client, []*tripCounter) {
	t.Helper()
	names := make([]string, jobs)
	for j := range jobs {
		names[j] = fmt.Sprintf("job-%04d", j)
	}
	for i := range instances {
		s, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(scheduler.WithInstanceID(fmt.Sprint("i", i))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Shutdown() })
		for _, name := range names {
			if _, err := s.NewJob(gocron.DailyJob(1, gocron.NewAtTimes(gocron.NewAtTime(3, 0, 0))), gocron.NewTask(func() {}), gocron.WithName(name)); err != nil {
				t.Fatal(err)
			}
		}
		s.Start()
	}
	// The run records: runs entries per job, as runs of the instances
	// write them.
	ctx := context.Background()
	start := time.Now().Truncate(time.Minute).Add(-time.Duration(runs) * time.Minute)
	for _, rdb := range cl.Clients(t) {
		pipe := rdb.Pipeline()
		for _, name := range names {
			for k := range runs {
				at := start.Add(time.Duration(k) * time.Minute)
				b, _ := json.Marshal(scheduler.Run{Job: name, Kind: "scheduled", Scheduled: at, Instance: fmt.Sprint("i", k%instances),
					Started: at.Add(3 * time.Millisecond), Ended: at.Add(250 * time.Millisecond), Outcome: "ok"})
				pipe.LPush(ctx, "schedlock:runs:"+name, b)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Every instance has registered its jobs and written a heartbeat.
	check, err := scheduler.New(newRedlock(t, cl.Clients(t)), scheduler.WithLockerOptions(scheduler.WithInstanceID("check")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = check.Shutdown() })
	waitForT(t, 30*time.Second, func() bool {
		st, err := check.Status(ctx, scheduler.WithRuns(1))
		return err == nil && len(st.Jobs) == jobs && len(st.Instances) == instances
	})
	var nodes []redis.UniversalClient
	var trips []*tripCounter
	for _, srv := range cl {
		h := &tripCounter{}
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
		rdb.AddHook(h)
		t.Cleanup(func() { _ = rdb.Close() })
		nodes = append(nodes, rdb)
		trips = append(trips, h)
	}
	client := newRedlock(t, nodes)
	reader, err := scheduler.New(client, scheduler.WithLockerOptions(scheduler.WithInstanceID("reader")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reader.Shutdown() })
	return reader, client, trips
}

// waitForT is waitFor for a testing.TB.
func waitForT(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("condition not met within %v", d)
		}
	}
}

// TestStatusRoundTripsDoNotGrowWithJobs: Status reads the fleet's hashes,
// then every job's run record and run lock, in at most two round trips
// per node each (one when the node's sender batches the two scripts of
// the second round), with 10 jobs as with 1,000 jobs of 5 instances.
func TestStatusRoundTripsDoNotGrowWithJobs(t *testing.T) {
	t.Parallel()
	for _, jobs := range []int{10, 1000} {
		t.Run(fmt.Sprint(jobs, "jobs"), func(t *testing.T) {
			cl := redlocktest.Start(t, 3)
			reader, client, trips := bigFleet(t, cl, 5, jobs, 10)
			ctx := context.Background()
			st, err := reader.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := client.Close(ctx); err != nil { // Eval returns at a quorum: what is queued for the last node goes out first
				t.Fatal(err)
			}
			if len(st.Jobs) != jobs || len(st.Jobs[0].Runs) != 10 || len(st.Instances) != 5 {
				t.Fatalf("Status: %d jobs, %d runs of the first, %d instances; want %d, 10, 5", len(st.Jobs), len(st.Jobs[0].Runs), len(st.Instances), jobs)
			}
			for i, h := range trips {
				if n := h.n.Load(); n < 2 || n > 3 {
					t.Errorf("node %d: %d round trips for one Status of %d jobs, want 2 or 3 (the hashes; the run records and run locks, batched or not)", i, n, jobs)
				}
				t.Logf("node %d: %d round trips", i, h.n.Load())
			}
		})
	}
}

// BenchmarkStatusAPI measures GET /api/status of a fleet of 1,000 jobs x
// 5 instances on 3 local redis-server nodes, with 10 runs per job (the
// page's default) and with 1: the latency of one read, p50 and p99 over
// the iterations.
//
//	go test -run '^$' -bench BenchmarkStatusAPI -benchtime 200x ./scheduler/
func BenchmarkStatusAPI(b *testing.B) {
	cl := redlocktest.Start(b, 3)
	reader, _, _ := bigFleet(b, cl, 5, 1000, 10)
	h, err := reader.Handler()
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, runs := range []int{10, 1} {
		b.Run(fmt.Sprint("runs=", runs), func(b *testing.B) {
			var lat []time.Duration
			var size int
			for b.Loop() {
				start := time.Now()
				resp, err := http.Get(fmt.Sprint(srv.URL, "/api/status?runs=", runs))
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("GET /api/status = %d", resp.StatusCode)
				}
				lat = append(lat, time.Since(start))
				size = int(n)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
			b.ReportMetric(float64(size)/1e6, "MB/response")
		})
	}
}
