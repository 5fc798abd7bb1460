package node_test

// What go-redis's AutoPipeliner (v9.23, experimental) does with the
// properties this package provides; docs/design.md, "Why not go-redis's
// AutoPipeline", rests on these tests and on BenchmarkTransport. A test
// here that fails after a go-redis upgrade means that section needs
// another look.

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/node"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// autoPipeline returns the blocking or the deferred AutoPipeliner of a new
// client of s, closed at the end, and a direct client of s.
func autoPipeline(t testing.TB, s *redlocktest.Server, async bool) (*redis.AutoPipeliner, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	get := rdb.AutoPipeline
	if async {
		get = rdb.AsyncAutoPipeline
	}
	ap, err := get()
	if err != nil {
		t.Fatalf("AutoPipeline: %v", err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	return ap, s.Client(t)
}

// pause holds every command the server gets for d (CLIENT PAUSE), so that
// the AutoPipeliner's batch in flight stays in flight and later calls
// queue up behind it; it returns once the pause is in place and a PING of
// ap is in flight. The pause ends no earlier than d after the call.
func pause(t *testing.T, ap *redis.AutoPipeliner, direct *redis.Client, d time.Duration) (inFlight <-chan error) {
	t.Helper()
	if err := ap.Ping(context.Background()).Err(); err != nil { // connected
		t.Fatalf("PING: %v", err)
	}
	if err := direct.ClientPause(context.Background(), d).Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- ap.Ping(context.Background()).Err() }()
	time.Sleep(20 * time.Millisecond)
	return done
}

// TestAutoPipelineSendsEndedCalls: a call whose ctx ends while it is
// queued is still sent, and its caller waits for the batch, not for its
// ctx (go-redis runs batches on a background context; node.Node drops
// such a call: TestEndedCallIsNotSent).
func TestAutoPipelineSendsEndedCalls(t *testing.T) {
	ap, direct := autoPipeline(t, redlocktest.StartServer(t), false)
	paused := time.Now()
	inFlight := pause(t, ap, direct, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := ap.Set(ctx, "k", "sent", 0).Err()
	returned := time.Since(paused)
	<-inFlight
	if err != nil || returned < 300*time.Millisecond {
		t.Errorf("SET with a 20ms ctx queued behind a 300ms pause = %v, %v after the pause began; want nil after the pause", err, returned)
	}
	if v := direct.Get(context.Background(), "k").Val(); v != "sent" {
		t.Errorf("k = %q; want \"sent\": the call went out after its ctx ended", v)
	}
}

// TestAutoPipelineBlockingFaceReordersGoroutines: on the blocking face,
// calls that goroutines make one after the other (each queued before the
// next is made) can reach the server in another order, because its queue
// is striped and a batch takes the stripes in index order. An undo sent
// by another goroutine than its acquire's could run before it.
func TestAutoPipelineBlockingFaceReordersGoroutines(t *testing.T) {
	ap, direct := autoPipeline(t, redlocktest.StartServer(t), false)
	direct.RPush(context.Background(), "order", "start")
	inFlight := pause(t, ap, direct, time.Second)
	var wg sync.WaitGroup
	const n = 16
	for i := range n {
		wg.Add(1)
		before := ap.Len()
		go func() { defer wg.Done(); ap.RPush(context.Background(), "order", i) }()
		// Call i is queued before call i+1 is made (or the flusher, which
		// waits for the batch in flight, took it: the length changes).
		for deadline := time.Now().Add(50 * time.Millisecond); ap.Len() == before && time.Now().Before(deadline); {
			time.Sleep(100 * time.Microsecond)
		}
	}
	wg.Wait()
	if err := <-inFlight; err != nil {
		t.Fatalf("the PING in flight: %v", err)
	}
	got := direct.LRange(context.Background(), "order", 1, -1).Val()
	inOrder := len(got) == n
	for i := 0; inOrder && i < n; i++ {
		inOrder = got[i] == strconv.Itoa(i)
	}
	if inOrder {
		t.Errorf("the server got %v: in the order made; want another order (striped queue)", got)
	}
	t.Logf("made in order 0..%d, the server ran %v", n-1, got)
}

// BenchmarkTransport: 64 goroutines run EVALSHA of a tiny script on one
// local redis-server through node.Node and through go-redis's
// AutoPipeliner (blocking and deferred face), each waiting for its reply.
func BenchmarkTransport(b *testing.B) {
	s := redlocktest.StartServer(b)
	script := node.NewScript(`return 1`)
	sha := redis.NewScript(`return 1`).Hash()
	keys := []string{"k"}
	cmd := script.Command(keys)
	b.Run("node", func(b *testing.B) {
		rdb := s.Client(b)
		n := node.New(rdb)
		defer func() { _ = n.Close(context.Background()) }()
		b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			out := make(chan error, 1)
			for pb.Next() {
				c := &node.Call{Ctx: context.Background(), Script: script, Keys: keys, Args: cmd,
					Done: func(_ *node.Call, r *redis.Cmd) { out <- r.Err() }}
				if err := n.Send(c); err != nil {
					b.Error(err)
					return
				}
				if err := <-out; err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	for _, face := range []struct {
		name  string
		async bool
	}{{"autopipeline", false}, {"autopipeline-async", true}} {
		b.Run(face.name, func(b *testing.B) {
			ap, direct := autoPipeline(b, s, face.async)
			direct.ScriptLoad(context.Background(), `return 1`)
			b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := ap.EvalSha(context.Background(), sha, keys).Err(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
