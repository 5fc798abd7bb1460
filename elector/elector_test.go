package elector_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/tracing"
)

// TestMain checks that no goroutine outlives the tests, except go-redis's
// pool probe of a node it could not dial PoolSize times in a row, which
// sees its client's Close only after its one-second sleep.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// window is one leadership as its OnStartedLeading saw it, on the shared
// monotonic clock of the test process.
type window struct {
	who        string
	start, end time.Time
	term       uint64
}

// windows records leaderships; safe for concurrent use.
type windows struct {
	mu  sync.Mutex
	all []window
}

func (w *windows) add(x window) {
	w.mu.Lock()
	w.all = append(w.all, x)
	w.mu.Unlock()
}

func (w *windows) list() []window {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]window(nil), w.all...)
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// candidate is one elector with its own go-redis clients, run until stop
// (graceful) or crash (clients closed first, so no resignation reaches
// Redis).
type candidate struct {
	e       *elector.Elector
	clients []redis.UniversalClient
	cancel  context.CancelFunc
	done    chan struct{}
	started atomic.Int32
	stopped atomic.Int32
}

func startCandidate(t *testing.T, cl redlocktest.Cluster, id string, w *windows, opts ...elector.Option) *candidate {
	t.Helper()
	var clients []redis.UniversalClient
	for _, s := range cl {
		// Own clients that the test can close to simulate a crash.
		clients = append(clients, redis.NewClient(&redis.Options{Addr: s.Addr()}))
	}
	return startCandidateOn(t, clients, id, w, opts...)
}

// startCandidateOn is startCandidate with the given go-redis clients,
// which it closes.
func startCandidateOn(t *testing.T, clients []redis.UniversalClient, id string, w *windows, opts ...elector.Option) *candidate {
	t.Helper()
	c := &candidate{done: make(chan struct{}), clients: clients}
	client, err := redlock.New(c.clients)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	base := []elector.Option{
		elector.WithIdentity(id),
		elector.OnStartedLeading(func(ctx context.Context) {
			c.started.Add(1)
			term, _ := elector.TermFromContext(ctx)
			start := time.Now()
			<-ctx.Done()
			w.add(window{who: id, start: start, end: time.Now(), term: term})
		}),
		elector.OnStoppedLeading(func() { c.stopped.Add(1) }),
	}
	c.e, err = elector.New(client, "test", append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		if err := c.e.Run(ctx); err != nil {
			t.Errorf("%s: Run = %v", id, err)
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// stop ends Run gracefully (resigning) and waits for it.
func (c *candidate) stop() {
	c.cancel()
	<-c.done
	for _, rdb := range c.clients {
		rdb.Close()
	}
}

// crash closes the candidate's Redis clients, then ends Run: the lease
// stays on the nodes until its TTL, as after a process crash.
func (c *candidate) crash() {
	for _, rdb := range c.clients {
		rdb.Close()
	}
	c.cancel()
	<-c.done
}

// waitLeader polls until one of cs leads, up to limit.
func waitLeader(t *testing.T, cs []*candidate, limit time.Duration) *candidate {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			if c.e.IsLeader(context.Background()) == nil {
				return c
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no leader within %v", limit)
	return nil
}

// violations lists overlapping leaderships and terms that do not increase,
// in ws sorted by start.
func violations(ws []window) []string {
	var out []string
	for i := 1; i < len(ws); i++ {
		if ws[i].start.Before(ws[i-1].end) {
			out = append(out, fmt.Sprintf("%s led from %v while %s led until %v", ws[i].who,
				ws[i].start.Format("15:04:05.000"), ws[i-1].who, ws[i-1].end.Format("15:04:05.000")))
		}
		if ws[i].term <= ws[i-1].term {
			out = append(out, fmt.Sprintf("term %d of %s follows term %d of %s", ws[i].term, ws[i].who, ws[i-1].term, ws[i-1].who))
		}
	}
	return out
}

// checkNoOverlap fails t if two leaderships overlap or terms do not
// increase.
func checkNoOverlap(t *testing.T, ws []window) {
	t.Helper()
	for _, v := range violations(ws) {
		t.Error(v)
	}
}

// TestCheckerSeesViolations is the negative control of checkNoOverlap.
func TestCheckerSeesViolations(t *testing.T) {
	t0 := time.Now()
	ws := []window{
		{who: "a", start: t0, end: t0.Add(time.Second), term: 1},
		{who: "b", start: t0.Add(500 * time.Millisecond), end: t0.Add(2 * time.Second), term: 1},
	}
	if got := violations(ws); len(got) != 2 {
		t.Errorf("violations = %q, want an overlap and a repeated term", got)
	}
}

func TestNeverTwoLeaders(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	opts := []elector.Option{elector.WithLeaseTTL(500 * time.Millisecond), elector.WithRetryPeriod(50 * time.Millisecond)}
	var cs []*candidate
	for i := range 5 {
		cs = append(cs, startCandidate(t, cl, "c"+string(rune('0'+i)), w, opts...))
	}
	kills := 0
	end := time.Now().Add(60 * time.Second)
	for n := 5; time.Now().Before(end); n++ {
		leader := waitLeader(t, cs, 3*time.Second)
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		// Kill the leader (crash half the time, graceful stop otherwise)
		// and start a replacement candidate.
		if rand.IntN(2) == 0 {
			leader.crash()
		} else {
			leader.stop()
		}
		kills++
		for i, c := range cs {
			if c == leader {
				cs[i] = startCandidate(t, cl, "c"+string(rune('0'+n%10))+"-"+time.Now().Format(".000"), w, opts...)
			}
		}
	}
	for _, c := range cs {
		c.stop()
	}
	ws := w.list()
	checkNoOverlap(t, ws)
	if len(ws) < kills {
		t.Errorf("%d leaderships for %d kills", len(ws), kills)
	}
	t.Logf("%d kills, %d leaderships, 0 overlaps checked", kills, len(ws))
}

func TestRenewalThatHangsStepsDownBeforeDeadline(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	type result struct{ cancelled, until time.Time }
	results := make(chan result, 1)
	client, err := redlock.New(cl.Clients(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	var stopped atomic.Int32
	var e *elector.Elector
	e, err = elector.New(client, "hang", elector.WithLeaseTTL(time.Second),
		elector.OnStartedLeading(func(ctx context.Context) {
			lease, _ := redlock.FromContext(ctx)
			cl[1].Stop(t)
			cl[2].Stop(t)
			<-ctx.Done()
			r := result{cancelled: time.Now(), until: lease.Until()}
			if err := e.IsLeader(ctx); !errors.Is(err, elector.ErrNotLeader) {
				t.Errorf("IsLeader after the ctx was cancelled = %v, want ErrNotLeader", err)
			}
			results <- r
		}),
		elector.OnStoppedLeading(func() { stopped.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	var r result
	select {
	case r = <-results:
	case <-time.After(10 * time.Second):
		t.Fatal("leadership never ended")
	}
	if !r.cancelled.Before(r.until) {
		t.Errorf("OnStartedLeading ctx cancelled at %v, not before the lease deadline %v", r.cancelled, r.until)
	}
	cl[1].Cont(t)
	cl[2].Cont(t)
	cancel()
	<-done
	if n := stopped.Load(); n < 1 {
		t.Errorf("OnStoppedLeading called %d times after a loss, want 1 per leadership", n)
	}
}

func TestStoppedLeadingOncePerLeadership(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	c := startCandidate(t, cl, "solo", w, elector.WithLeaseTTL(400*time.Millisecond), elector.WithRetryPeriod(50*time.Millisecond))
	waitLeader(t, []*candidate{c}, 3*time.Second)
	// Loss by expiry: the majority freezes, the lease cannot be renewed.
	cl[0].Stop(t)
	cl[1].Stop(t)
	time.Sleep(time.Second)
	cl[0].Cont(t)
	cl[1].Cont(t)
	// IsLeader turns true before OnStartedLeading runs: wait for the
	// second leadership's callback, not for IsLeader.
	waitFor(t, "a second OnStartedLeading", func() bool { return c.started.Load() >= 2 })
	c.stop()
	if s, st := c.started.Load(), c.stopped.Load(); s < 2 || s != st {
		t.Errorf("OnStartedLeading %d times, OnStoppedLeading %d times; want equal, at least 2", s, st)
	}
}

func TestTakeoverAfterCrashAndAfterGracefulStop(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	const ttl, retry = time.Second, 100 * time.Millisecond
	const margin = 700 * time.Millisecond // loaded 2-core CI machine
	w := &windows{}
	opts := []elector.Option{elector.WithLeaseTTL(ttl), elector.WithRetryPeriod(retry)}
	a := startCandidate(t, cl, "a", w, opts...)
	b := startCandidate(t, cl, "b", w, opts...)
	leader := waitLeader(t, []*candidate{a, b}, 3*time.Second)
	other := a
	if leader == a {
		other = b
	}
	start := time.Now()
	leader.stop() // graceful: resigns
	waitLeader(t, []*candidate{other}, 5*time.Second)
	if d := time.Since(start); d > retry+margin {
		t.Errorf("takeover after a graceful stop took %v, want within the retry period %v + %v", d, retry, margin)
	}
	c := startCandidate(t, cl, "c", w, opts...)
	time.Sleep(100 * time.Millisecond)
	start = time.Now()
	other.crash()
	waitLeader(t, []*candidate{c}, 5*time.Second)
	if d := time.Since(start); d > ttl+retry+margin {
		t.Errorf("takeover after a crash took %v, want within TTL %v + retry %v + %v", d, ttl, retry, margin)
	}
	checkNoOverlap(t, w.list())
}

func TestRecoversAfterAllNodesRestartEmpty(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	opts := []elector.Option{elector.WithLeaseTTL(500 * time.Millisecond), elector.WithRetryPeriod(50 * time.Millisecond)}
	cs := []*candidate{startCandidate(t, cl, "a", w, opts...), startCandidate(t, cl, "b", w, opts...)}
	waitLeader(t, cs, 3*time.Second)
	for _, s := range cl {
		s.Kill(t)
	}
	for _, s := range cl {
		s.Restart(t)
	}
	time.Sleep(time.Second)
	leader := waitLeader(t, cs, 5*time.Second)
	if id, err := leader.e.Leader(context.Background()); err != nil || id != leader.e.Identity() {
		t.Errorf("Leader() = %q, %v; want %q", id, err, leader.e.Identity())
	}
}

func TestFailedCampaignLeavesNoBlockingKey(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	opts := []elector.Option{elector.WithLeaseTTL(10 * time.Second), elector.WithRetryPeriod(50 * time.Millisecond)}
	a := startCandidate(t, cl, "a", w, opts...)
	waitLeader(t, []*candidate{a}, 3*time.Second)
	var seen []string
	var mu sync.Mutex
	b := startCandidate(t, cl, "b", w, append(opts, elector.OnNewLeader(func(id string) {
		mu.Lock()
		seen = append(seen, id)
		mu.Unlock()
	}))...)
	time.Sleep(300 * time.Millisecond) // b campaigns and fails several times
	start := time.Now()
	a.stop()
	waitLeader(t, []*candidate{b}, 3*time.Second)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("b took %v to lead after a resigned: a failed campaign left a blocking key?", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen, ",") != "a,b" {
		t.Errorf("b's OnNewLeader saw %q, want a then b", seen)
	}
}

// countHook counts the lock commands (scripts, SET) a client sends.
type countHook struct{ n atomic.Int32 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}
func (h *countHook) count(cmd redis.Cmder) {
	switch cmd.Name() {
	case "eval", "evalsha", "set":
		h.n.Add(1)
	}
}

// TestFollowerCampaignsOnAQuorum: a follower's campaigns against a
// leader ask a quorum of the nodes (redlock.WithQuorumFirst), always the
// same: on 3 nodes, one node gets none of them.
func TestFollowerCampaignsOnAQuorum(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	opts := []elector.Option{elector.WithLeaseTTL(10 * time.Second), elector.WithRetryPeriod(20 * time.Millisecond)}
	a := startCandidate(t, cl, "a", w, opts...)
	waitLeader(t, []*candidate{a}, 3*time.Second)
	hooks := make([]*countHook, len(cl))
	var clients []redis.UniversalClient
	for i, s := range cl {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
		hooks[i] = &countHook{}
		rdb.AddHook(hooks[i])
		clients = append(clients, rdb)
	}
	b := startCandidateOn(t, clients, "b", w, opts...)
	time.Sleep(500 * time.Millisecond) // b campaigns and fails many times
	b.stop()
	var got []int32
	idle := 0
	for _, h := range hooks {
		got = append(got, h.n.Load())
		if h.n.Load() == 0 {
			idle++
		}
	}
	if idle != 1 || b.started.Load() != 0 {
		t.Errorf("a follower's lock commands per node %v (led %d times); want one node never asked, the other two asked", got, b.started.Load())
	}
}

func TestNewValidatesTiming(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	client, err := redlock.New([]redis.UniversalClient{rdb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	tests := []struct {
		name   string
		client *redlock.Client
		elect  string
		opts   []elector.Option
		want   string
	}{
		{"nil client", nil, "x", nil, "the *redlock.Client is nil"},
		{"empty name", client, "", nil, "the election name is empty"},
		{"empty identity", client, "x", []elector.Option{elector.WithIdentity("")}, "identity (WithIdentity) is empty"},
		{"tiny TTL", client, "x", []elector.Option{elector.WithLeaseTTL(time.Millisecond)}, "lease TTL 1ms"},
		{"renew too long", client, "x", []elector.Option{elector.WithLeaseTTL(time.Second), elector.WithRenewInterval(600 * time.Millisecond)}, "renew interval 600ms"},
		{"renew zero", client, "x", []elector.Option{elector.WithRenewInterval(0)}, "renew interval 0s"},
		{"retry not below TTL", client, "x", []elector.Option{elector.WithLeaseTTL(time.Second), elector.WithRetryPeriod(time.Second)}, "retry period 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := elector.New(tt.client, tt.elect, tt.opts...)
			if e != nil || !errors.Is(err, redlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New() = %v, %v; want ErrInvalidArgument naming %q", e, err, tt.want)
			}
		})
	}
	e, err := elector.New(client, "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.IsLeader(context.Background()); !errors.Is(err, elector.ErrNotLeader) {
		t.Errorf("IsLeader before Run = %v, want ErrNotLeader", err)
	}
	if _, err := e.Leader(context.Background()); !errors.Is(err, elector.ErrNoLeader) {
		t.Errorf("Leader with no leader = %v, want ErrNoLeader", err)
	}
	if _, err := e.Term(); !errors.Is(err, elector.ErrNotLeader) {
		t.Errorf("Term before Run = %v, want ErrNotLeader", err)
	}
}

func TestRunTwiceIsAnError(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	client, _ := redlock.New([]redis.UniversalClient{rdb})
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	e, err := elector.New(client, "x", elector.WithLeaseTTL(time.Second), elector.WithRetryPeriod(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(3 * time.Second)
	for e.IsLeader(ctx) != nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.Run(ctx); !errors.Is(err, elector.ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	if term, err := e.Term(); err != nil || term == 0 {
		t.Errorf("Term() = %d, %v; want a positive term", term, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil after ctx ended", err)
	}
	if m.Exists("schedlock:elector:x") {
		t.Error("lease key left after Run returned: no resignation")
	}
}

// TestGocronRunsJobsOnlyOnTheLeader: three gocron schedulers with skewed
// clocks use the elector (gocron.WithDistributedElector); the leader is
// killed mid-run. No tick runs twice, and ticks resume on a new leader.
func TestGocronRunsJobsOnlyOnTheLeader(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	w := &windows{}
	type tickRun struct {
		tick time.Time
		who  string
		at   time.Time
	}
	var mu sync.Mutex
	var runs []tickRun
	opts := []elector.Option{elector.WithLeaseTTL(time.Second), elector.WithRetryPeriod(100 * time.Millisecond)}
	var cs []*candidate
	var scheds []gocron.Scheduler
	offsets := map[string]time.Duration{} // instance ID: its clock's offset
	for i, off := range []time.Duration{-300 * time.Millisecond, 0, 250 * time.Millisecond} {
		id := fmt.Sprintf("i%d", i)
		offsets[id] = off
		c := startCandidate(t, cl, id, w, opts...)
		cs = append(cs, c)
		clock := redlocktest.OffsetClock(off)
		s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithDistributedElector(c.e))
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
			mu.Lock()
			runs = append(runs, tickRun{tick: clock.Now().Add(250 * time.Millisecond).Truncate(time.Second), who: id, at: time.Now()})
			mu.Unlock()
		}), gocron.WithName("job"))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		scheds = append(scheds, s)
	}
	leader := waitLeader(t, cs, 5*time.Second)
	time.Sleep(4 * time.Second)
	killedAt := time.Now()
	leader.crash()
	time.Sleep(5 * time.Second)
	// Schedulers first, then candidates, so every leadership is recorded.
	for _, s := range scheds {
		if err := s.Shutdown(); err != nil {
			t.Error(err)
		}
	}
	for _, c := range cs {
		if c != leader {
			c.stop()
		}
	}

	mu.Lock()
	defer mu.Unlock()
	byTick := map[time.Time][]string{}
	after := 0
	for _, r := range runs {
		byTick[r.tick] = append(byTick[r.tick], r.who)
		if r.at.After(killedAt) {
			after++
		}
		// A tick that came before the crash may still be running its task
		// just after it (gocron asked IsLeader before the crash); a tick
		// that came after it (on the real clock) must not run there.
		if r.who == leader.e.Identity() && r.tick.Add(-offsets[r.who]).After(killedAt) {
			t.Errorf("killed leader %s ran tick %v, which came after its crash at %v", r.who, r.tick, killedAt)
		}
	}
	for tick, who := range byTick {
		if len(who) > 1 {
			t.Errorf("tick %v ran on %v", tick.Format("15:04:05"), who)
		}
	}
	if after < 2 {
		t.Errorf("%d runs after the leader was killed, want ticks to resume on a new leader", after)
	}
	// Every run happened inside its instance's leadership.
	for _, r := range runs {
		inside := false
		for _, x := range w.list() {
			if x.who == r.who && !r.at.Before(x.start) && !r.at.After(x.end) {
				inside = true
			}
		}
		if !inside {
			t.Errorf("%s ran tick %v at %v outside its leadership", r.who, r.tick.Format("15:04:05"), r.at.Format("15:04:05.000"))
		}
	}
}

func TestLeadershipSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	client, _ := redlock.New([]redis.UniversalClient{rdb}, redlock.WithTracerProvider(tp))
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	inLead := make(chan trace.SpanContext, 1)
	e, err := elector.New(client, "traced", elector.WithIdentity("me"), elector.WithTracerProvider(tp),
		elector.WithLeaseTTL(time.Second), elector.WithRetryPeriod(20*time.Millisecond),
		elector.OnStartedLeading(func(ctx context.Context) {
			inLead <- trace.SpanFromContext(ctx).SpanContext()
			<-ctx.Done()
		}))
	if err != nil {
		t.Fatal(err)
	}
	// Run under an application span: the term's spans are roots all the same.
	appCtx, app := tp.Tracer("app").Start(context.Background(), "main")
	defer app.End()
	ctx, cancel := context.WithCancel(appCtx)
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	var leadSC trace.SpanContext
	select {
	case leadSC = <-inLead:
	case <-time.After(3 * time.Second):
		t.Fatal("never led")
	}
	// While the term runs: its start span has ended (so it is exported),
	// carries the term, and renewals are traces of their own linked to it.
	find := func(name string) (out []sdktrace.ReadOnlySpan) {
		for _, s := range rec.Ended() {
			if s.Name() == name {
				out = append(out, s)
			}
		}
		return out
	}
	linksTo := func(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
		return len(s.Links()) == 1 && s.Links()[0].SpanContext.SpanID() == sc.SpanID()
	}
	starts := find(tracing.SpanTermStarted)
	if len(starts) != 1 || len(find(tracing.SpanCampaign)) == 0 {
		t.Fatalf("while leading: %d %q spans, %d campaign spans; want 1 and some", len(starts), tracing.SpanTermStarted, len(find(tracing.SpanCampaign)))
	}
	start := starts[0]
	if start.Parent().IsValid() {
		t.Errorf("%q has parent %v: want the root of a trace of its own", tracing.SpanTermStarted, start.Parent().SpanID())
	}
	if start.SpanContext().SpanID() != leadSC.SpanID() {
		t.Error("OnStartedLeading's ctx does not carry the term's start span")
	}
	termOf := func(s sdktrace.ReadOnlySpan) int64 {
		for _, kv := range s.Attributes() {
			if kv.Key == tracing.Term {
				return kv.Value.AsInt64()
			}
		}
		return -1
	}
	if termOf(start) < 1 {
		t.Errorf("%q term = %d, want >= 1", tracing.SpanTermStarted, termOf(start))
	}
	waitFor(t, "a renewal while leading", func() bool {
		for _, ext := range find(tracing.SpanExtend) {
			if !ext.Parent().IsValid() && linksTo(ext, start.SpanContext()) {
				return true
			}
		}
		return false
	})
	if n := len(find(tracing.SpanTermEnded)); n != 0 {
		t.Fatalf("%d %q spans while still leading", n, tracing.SpanTermEnded)
	}

	cancel()
	<-done
	ends := find(tracing.SpanTermEnded)
	if len(ends) != 1 {
		t.Fatalf("%d %q spans after resigning, want 1", len(ends), tracing.SpanTermEnded)
	}
	end := ends[0]
	if !linksTo(end, start.SpanContext()) || end.Parent().IsValid() {
		t.Errorf("%q: parent %v, links %v; want a root linked to the term's start", tracing.SpanTermEnded, end.Parent(), end.Links())
	}
	var events []string
	for _, ev := range end.Events() {
		events = append(events, ev.Name)
	}
	if strings.Join(events, ",") != tracing.EventLeadershipLost {
		t.Errorf("%q events = %v", tracing.SpanTermEnded, events)
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range end.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	if termOf(end) != termOf(start) || attrs[tracing.Outcome].AsString() != tracing.OutcomeResigned || attrs[tracing.TermMillis].AsFloat64() <= 0 {
		t.Errorf("%q attributes %v; want term %d, outcome %s, a duration", tracing.SpanTermEnded, end.Attributes(), termOf(start), tracing.OutcomeResigned)
	}
}

// waitFor polls cond every 10 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestTermEndSaysWhenTheResignationFailed: a leader whose nodes are frozen
// when Run's ctx ends cannot resign; its term's end span says so instead of
// "resigned".
func TestTermEndSaysWhenTheResignationFailed(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	client, err := redlock.New(cl.Clients(t), redlock.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	leading := make(chan struct{})
	e, err := elector.New(client, "frozen", elector.WithIdentity("me"), elector.WithTracerProvider(tp),
		elector.WithLeaseTTL(3*time.Second), elector.OnStartedLeading(func(ctx context.Context) { close(leading); <-ctx.Done() }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ctx) }()
	<-leading
	for _, s := range cl {
		s.Stop(t)
	}
	cancel()
	<-done
	for _, s := range cl {
		s.Cont(t)
	}
	var end sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanTermEnded {
			end = s
		}
	}
	if end == nil {
		t.Fatalf("no %q span", tracing.SpanTermEnded)
	}
	outcome := ""
	for _, kv := range end.Attributes() {
		if kv.Key == tracing.Outcome {
			outcome = kv.Value.AsString()
		}
	}
	if outcome == tracing.OutcomeResigned || end.Status().Code != codes.Error {
		t.Errorf("%q: outcome %q, status %v; want not %q, status Error: the nodes never confirmed the resignation",
			tracing.SpanTermEnded, outcome, end.Status(), tracing.OutcomeResigned)
	}
}

// TestRunOnAClosedClientReturns: Run stops with an error matching
// redlock.ErrClosed once its Client is closed, whether it led or not. It
// went on campaigning without a word until its ctx ended (found by an
// adversarial helper).
func TestRunOnAClosedClientReturns(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	client, err := redlock.New(cl.Clients(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := elector.New(client, "x", elector.WithLeaseTTL(time.Second), elector.WithRetryPeriod(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	for e.IsLeader(ctx) != nil && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if err := client.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, redlock.ErrClosed) {
			t.Errorf("Run = %v, want an error matching redlock.ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("Run still campaigning 20s after its Client was closed")
	}
}

// TestStoppedLeadingPairsWithStarted: a leadership whose OnStartedLeading
// is not run (the lease had expired when its goroutine started: here
// OnNewLeader, on Run's goroutine, stalls past the lease while a majority
// of nodes is frozen, as a process pause would) does not call
// OnStoppedLeading either.
func TestStoppedLeadingPairsWithStarted(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	var stalled atomic.Bool
	c := startCandidate(t, cl, "stalls", &windows{}, elector.WithLeaseTTL(300*time.Millisecond),
		elector.WithRetryPeriod(50*time.Millisecond),
		elector.OnNewLeader(func(identity string) {
			if identity == "stalls" && stalled.CompareAndSwap(false, true) {
				// A pause of the whole process: no renewal reaches a quorum.
				cl[0].Stop(t)
				cl[1].Stop(t)
				time.Sleep(600 * time.Millisecond) // past the lease
				cl[0].Cont(t)
				cl[1].Cont(t)
			}
		}))
	deadline := time.Now().Add(5 * time.Second)
	for c.started.Load() == 0 && time.Now().Before(deadline) { // the next leadership starts
		time.Sleep(10 * time.Millisecond)
	}
	c.stop()
	if s, st := c.started.Load(), c.stopped.Load(); s == 0 || s != st {
		t.Errorf("OnStartedLeading %d times, OnStoppedLeading %d times; want equal, at least 1", s, st)
	}
}
