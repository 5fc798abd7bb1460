package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// Environment variables of the suite.
const (
	// envSoak=1 runs the long tier: more seeds, more repetitions, and the
	// soak-only scenarios.
	envSoak = "SCHEDLOCK_SOAK"
	// envSeeds, e.g. "3" or "3,7", runs exactly these seeds (to reproduce
	// a failure).
	envSeeds = "SCHEDLOCK_SEEDS"
	// envTable names a file to write the results table to (Markdown).
	envTable = "SCHEDLOCK_FAULTS_TABLE"
	// envChild makes the test binary act as a child holder process.
	envChild = "SCHEDLOCK_FAULTS_CHILD"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{}) // dial failures to killed nodes are expected
	if role := os.Getenv(envChild); role != "" {
		os.Exit(runChild(role))
	}
	// go-redis's pool probes a node it could not dial PoolSize times in a
	// row once a second until its client is closed, and sees the close
	// only after its sleep: up to a second after a scenario with killed
	// nodes has ended.
	goleak.VerifyTestMain(reporting{m},
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// reporting runs the tests, then prints the table (always; go test shows
// it with -v or when the package fails) and writes it to $envTable.
type reporting struct{ m *testing.M }

func (r reporting) Run() int {
	code := r.m.Run()
	var b strings.Builder
	if WriteTable(&b) > 0 {
		tier := "PR tier"
		if soak() {
			tier = "soak tier"
		}
		fmt.Printf("\n== fault-injection results (%s)\n%s\n", tier, b.String())
		if path := os.Getenv(envTable); path != "" {
			if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "faults: writing %s: %v\n", path, err)
				code = 1
			}
		}
	}
	return code
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func soak() bool { return os.Getenv(envSoak) == "1" }

// pick returns pr in the PR tier, long in the soak tier.
func pick[T any](pr, long T) T {
	if soak() {
		return long
	}
	return pr
}

// catalogue fixes the order of the table.
var catalogue = []string{
	"baseline contention, 8 clients",
	"client ignores validity (holds past Until)",
	"minority crash: kill -9 1 of 3, then 2 of 5",
	"majority loss for 3x TTL, then restore",
	"holder process killed (kill -9)",
	"holder isolated by the proxy (all links blackholed)",
	"bare-quorum hold, then one more node cut for 2 TTLs",
	"holder paused (SIGSTOP) past its TTL, no fencing",
	"holder paused (SIGSTOP) past its TTL, fenced store",
	"slow minority: +150 ms on 2 of 5 links",
	"uniformly slow links (round trip ~TTL/3)",
	"frozen node (SIGSTOP) mid-burst",
	"50 clients at the same instant",
	"extension under latency spikes",
	"scheduler instances with clock offsets",
	"restart without persistence, immediate",
	"restart without persistence, restart gating",
	"restart with appendonly + fsync always",
	"end-to-end soak: 5 skewed schedulers + elected singleton",
}

// scenario accumulates one row of the table over the seeds of one test.
type scenario struct {
	t     *testing.T
	start time.Time

	mu      sync.Mutex
	r       Result
	metrics map[string]string
	keys    []string
	lin     [3]int // porcupine's verdicts: linearizable, not, undecided
}

// newScenario starts the row named name (an entry of catalogue) for tier
// ("sim", "redis" or "soak"); it is recorded when t ends, passing unless t
// failed.
func newScenario(t *testing.T, name, tier string, control bool) *scenario {
	t.Helper()
	order := slices.Index(catalogue, name)
	if order < 0 {
		t.Fatalf("scenario %q is not in the catalogue", name)
	}
	sc := &scenario{t: t, start: time.Now(), metrics: map[string]string{},
		r: Result{Order: order*2 + tierOrder(tier), Scenario: name, Tier: tier, Control: control}}
	t.Cleanup(func() {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		sc.r.Pass = !t.Failed()
		sc.r.Elapsed = time.Since(sc.start)
		for _, k := range sc.keys {
			sc.r.Metrics = append(sc.r.Metrics, k+" "+sc.metrics[k])
		}
		sc.r.Metrics = append(sc.r.Metrics, fmt.Sprintf("wall %.1fs", sc.r.Elapsed.Seconds()))
		Record(sc.r)
	})
	return sc
}

func tierOrder(tier string) int {
	if tier == "sim" {
		return 0
	}
	return 1
}

// add counts iterations, faults and overlaps; safe for concurrent use.
func (sc *scenario) add(iterations, faults, overlaps int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.r.Iterations += iterations
	sc.r.Faults += faults
	sc.r.Overlaps += overlaps
}

// linearizability counts porcupine's verdicts on the row's histories.
func (sc *scenario) linearizability(r porcupine.CheckResult) {
	sc.mu.Lock()
	switch r {
	case porcupine.Ok:
		sc.lin[0]++
	case porcupine.Illegal:
		sc.lin[1]++
	default:
		sc.lin[2]++
	}
	lin := sc.lin
	sc.mu.Unlock()
	sc.metric("histories linearizable (porcupine) / not / undecided", "%d / %d / %d", lin[0], lin[1], lin[2])
}

// metric sets a named figure of the row (the last call per name wins).
func (sc *scenario) metric(name, format string, args ...any) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if _, ok := sc.metrics[name]; !ok {
		sc.keys = append(sc.keys, name)
	}
	sc.metrics[name] = fmt.Sprintf(format, args...)
}

// seeds runs f once per seed as a subtest "seed=N". The PR tier runs pr
// seeds, the soak tier long; SCHEDLOCK_SEEDS overrides both.
func (sc *scenario) seeds(pr, long int, f func(t *testing.T, seed uint64, r *rand.Rand)) {
	sc.t.Helper()
	sc.runSeeds(pr, long, false, f)
}

// parallelSeeds is seeds with the seeds running in parallel, for
// scenarios that mostly wait (the scheduler's one-second ticks).
func (sc *scenario) parallelSeeds(pr, long int, f func(t *testing.T, seed uint64, r *rand.Rand)) {
	sc.t.Helper()
	sc.runSeeds(pr, long, true, f)
}

func (sc *scenario) runSeeds(pr, long int, parallel bool, f func(t *testing.T, seed uint64, r *rand.Rand)) {
	run := func(t *testing.T) {
		for _, seed := range seedList(pr, long) {
			sc.mu.Lock()
			sc.r.Seeds++
			sc.mu.Unlock()
			t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
				if parallel {
					t.Parallel()
				}
				f(t, seed, rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15+1)))
			})
		}
	}
	if !parallel {
		run(sc.t)
		return
	}
	// A group, so that the seeds have ended when runSeeds returns.
	sc.t.Run("seeds", run)
}

func seedList(pr, long int) []uint64 {
	if s := os.Getenv(envSeeds); s != "" {
		var out []uint64
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err == nil {
				out = append(out, n)
			}
		}
		return out
	}
	n := pick(pr, long)
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// checkHistory reports the checker's findings on t and adds the overlaps
// to the row; it returns the verdict. porcupine checks the same history
// for linearizability (Verdict.Linearizable) and must agree with the
// checker, in the negative controls too.
func (sc *scenario) checkHistory(t *testing.T, h *History) Verdict {
	t.Helper()
	v := h.Check()
	sc.add(0, 0, v.Overlaps)
	sc.linearizability(v.Linearizable)
	if !v.Agree() {
		t.Errorf("porcupine (%s) disagrees with the checker: %v", v.Linearizable, v)
	}
	return v
}

// requireOK fails t unless the verdict is clean.
func requireOK(t *testing.T, v Verdict) {
	t.Helper()
	if !v.OK() {
		t.Errorf("checker: %v", v)
	}
}

// keyPrefix is the redlock key prefix of every scenario, so that lock keys
// can be told from fencing counters and other keys.
const keyPrefix = "lock:"

// isLockKey reports whether key is a lock key: not a fencing counter, a
// reentrant lock's holds hash, the restart gate marker or any other key.
func isLockKey(key string) bool {
	return strings.HasPrefix(key, keyPrefix) && !strings.Contains(key, "\x00")
}

// jitterRetry is exponential backoff from 10 ms, doubling up to max, with
// full jitter, without a time limit (each call's ctx bounds it). The
// largest delay it ever waits is max.
func jitterRetry(maxDelay time.Duration) func() backoff.BackOff {
	return func() backoff.BackOff {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval = 10 * time.Millisecond
		b.Multiplier = 2
		b.MaxInterval = maxDelay
		b.MaxElapsedTime = 0
		b.RandomizationFactor = 0
		b.Reset()
		return redlock.FullJitter(b)
	}
}

// isSim reports whether nodes are clients of the simulation (SimCluster).
func isSim(nodes []redis.UniversalClient) bool {
	rdb, ok := nodes[0].(*redis.Client)
	return ok && strings.HasPrefix(rdb.Options().Addr, "sim-node-")
}

// maxRetryDelay is the largest retry delay of the contenders.
const maxRetryDelay = 200 * time.Millisecond

func newLocks(t testing.TB, nodes []redis.UniversalClient, opts ...redlock.Option) *redlock.Client {
	t.Helper()
	base := []redlock.Option{redlock.WithKeyPrefix(keyPrefix), redlock.WithRetry(jitterRetry(maxRetryDelay))}
	if isSim(nodes) {
		// The simulation has no pub/sub (sim.go), and a subscriber
		// still dialling would outlive the bubble: waiters poll.
		base = append(base, redlock.WithReleaseNotices(false))
	}
	c, err := redlock.New(nodes, append(base, opts...)...)
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) }) // in a bubble, before it ends
	return c
}

// world is where a scenario runs: real redis-server processes or the
// simulation. Methods must be called from the test's goroutine.
type world interface {
	tier() string
	nodes() int
	// clients returns a new set of direct clients, one per node.
	clients() []redis.UniversalClient
	// proxied returns a new set of clients with a faulty link per node.
	proxied() ([]redis.UniversalClient, []link)
	freeze(i int)
	thaw(i int)
	kill(i int)
	restart(i int)
	// lockKeys counts the lock keys on every node (all must be running).
	lockKeys() int
}

// link is one client's path to one node: a redlocktest.Proxy or a SimLink.
type link interface {
	SetLatency(d time.Duration)
	SetLatencyIn(dir redlocktest.Direction, d time.Duration)
	Partition(dir redlocktest.Direction)
	Heal()
}

type redisWorld struct {
	t  *testing.T
	cl redlocktest.Cluster
}

func newRedisWorld(t *testing.T, n int, opts ...redlocktest.Option) *redisWorld {
	t.Helper()
	return &redisWorld{t: t, cl: redlocktest.Start(t, n, opts...)}
}

func (w *redisWorld) tier() string                     { return "redis" }
func (w *redisWorld) nodes() int                       { return len(w.cl) }
func (w *redisWorld) clients() []redis.UniversalClient { return w.cl.Clients(w.t) }
func (w *redisWorld) proxied() ([]redis.UniversalClient, []link) {
	c, ps := w.cl.ProxiedClients(w.t)
	links := make([]link, len(ps))
	for i, p := range ps {
		links[i] = p
	}
	return c, links
}
func (w *redisWorld) freeze(i int)  { w.cl[i].Stop(w.t) }
func (w *redisWorld) thaw(i int)    { w.cl[i].Cont(w.t) }
func (w *redisWorld) kill(i int)    { w.cl[i].Kill(w.t) }
func (w *redisWorld) restart(i int) { w.cl[i].Restart(w.t) }
func (w *redisWorld) lockKeys() int {
	n := 0
	for _, keys := range w.cl.Keys(w.t) {
		for _, k := range keys {
			if isLockKey(k) {
				n++
			}
		}
	}
	return n
}

type simWorld struct{ c *SimCluster }

func (w simWorld) tier() string { return "sim" }
func (w simWorld) nodes() int   { return len(w.c.Nodes) }
func (w simWorld) clients() []redis.UniversalClient {
	c, _ := w.c.Clients()
	return c
}
func (w simWorld) proxied() ([]redis.UniversalClient, []link) {
	c, ls := w.c.Clients()
	links := make([]link, len(ls))
	for i, l := range ls {
		links[i] = l
	}
	return c, links
}
func (w simWorld) freeze(i int)  { w.c.Nodes[i].Freeze() }
func (w simWorld) thaw(i int)    { w.c.Nodes[i].Thaw() }
func (w simWorld) kill(i int)    { w.c.Nodes[i].Kill() }
func (w simWorld) restart(i int) { w.c.Nodes[i].Restart() }
func (w simWorld) lockKeys() int {
	n := 0
	for _, k := range w.c.Keys(isLockKey) {
		n += k
	}
	return n
}

// inWorlds runs body in the simulation (sim true) or against real
// redis-server nodes.
func inWorld(t *testing.T, sim bool, n int, body func(t *testing.T, w world)) {
	t.Helper()
	if sim {
		RunSim(t, n, func(t *testing.T, c *SimCluster) { body(t, simWorld{c}) })
		return
	}
	body(t, newRedisWorld(t, n))
}

// contender acquires one resource in a loop until its ctx ends, holds it
// for a random time, doing guarded work only within validity, and
// releases it.
type contender struct {
	name     string
	locks    *redlock.Client
	h        *History
	resource string
	ttl      time.Duration
	// hold returns how long to hold the lock.
	hold func(r *rand.Rand) time.Duration
	// acquireTimeout bounds each Acquire (default 10 s).
	acquireTimeout time.Duration
	// try uses TryAcquire (one round) instead of Acquire, pausing pause
	// between tries.
	try   bool
	pause time.Duration
	// ignoreValidity: hold for the whole hold time, acting without
	// checking validity (negative control).
	ignoreValidity bool
	// cycles, if positive, ends the run after that many grants.
	cycles int

	stats *contenderStats
}

// contenderStats is shared by the contenders of a scenario.
type contenderStats struct {
	mu          sync.Mutex
	grants      int
	failures    int // Acquire/TryAcquire errors other than ctx ending the run
	unavailable int // ... of which matched ErrUnavailable
	weak        int // ... of which refused a weak grant (QuorumError.Validity)
	releaseErrs int
	acquireDur  []time.Duration // successful Acquire durations
	lastErr     error
}

func (s *contenderStats) snapshot() contenderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return contenderStats{grants: s.grants, failures: s.failures, unavailable: s.unavailable, weak: s.weak,
		releaseErrs: s.releaseErrs, acquireDur: slices.Clone(s.acquireDur), lastErr: s.lastErr}
}

func (c *contender) run(ctx context.Context, r *rand.Rand) {
	timeout := c.acquireTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	for n := 0; ctx.Err() == nil && (c.cycles == 0 || n < c.cycles); {
		attempt := time.Now()
		actx, cancel := context.WithTimeout(ctx, timeout)
		var l *redlock.Lock
		var err error
		if c.try {
			l, err = c.locks.TryAcquire(actx, []string{c.resource}, c.ttl)
		} else {
			l, err = c.locks.Acquire(actx, []string{c.resource}, c.ttl)
		}
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.stats.mu.Lock()
			c.stats.failures++
			c.stats.lastErr = err
			if errors.Is(err, redlock.ErrUnavailable) {
				c.stats.unavailable++
			}
			var qerr *redlock.QuorumError
			if errors.As(err, &qerr) && strings.Contains(qerr.Error(), "validity remained") {
				c.stats.weak++
			}
			c.stats.mu.Unlock()
			if c.try {
				sleepCtx(ctx, c.pause)
			}
			continue
		}
		n++
		took := time.Since(attempt)
		hd := c.h.Begin(c.resource, c.name, attempt, l)
		c.stats.mu.Lock()
		c.stats.grants++
		c.stats.acquireDur = append(c.stats.acquireDur, took)
		c.stats.mu.Unlock()
		hold := c.hold(r)
		if c.ignoreValidity {
			// Act every 10 ms for the whole hold time, never checking.
			for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				hd.ActBlindly()
			}
			hd.EndIgnoringValidity()
		} else {
			if hd.Act() {
				time.Sleep(hold)
				hd.Act() // the last step of the critical section, if still valid
			}
			hd.End()
		}
		if err := l.Release(context.Background()); err != nil {
			c.stats.mu.Lock()
			c.stats.releaseErrs++
			c.stats.mu.Unlock()
		}
		if c.pause > 0 {
			sleepCtx(ctx, c.pause)
		}
	}
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// runContenders runs cs until ctx ends, each with its own random source
// derived from r, and waits for them.
func runContenders(ctx context.Context, r *rand.Rand, cs []*contender) {
	var wg sync.WaitGroup
	for _, c := range cs {
		cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		wg.Go(func() { c.run(ctx, cr) })
	}
	wg.Wait()
}

// calibrate measures uncontended acquire+release rounds on locks and
// returns the p99 acquire time.
func calibrate(t *testing.T, locks *redlock.Client, ttl time.Duration, n int) time.Duration {
	t.Helper()
	// The first calls dial the nodes: not what is measured, and on a
	// loaded machine a dial can take longer than the node timeout.
	warmUp(t, locks, ttl)
	var ds []time.Duration
	for i := range n {
		start := time.Now()
		l, err := locks.TryAcquire(context.Background(), []string{"calibrate-" + strconv.Itoa(i)}, ttl)
		if err != nil {
			t.Fatalf("calibration TryAcquire: %v", err)
		}
		ds = append(ds, time.Since(start))
		_ = l.Release(context.Background())
	}
	return Percentile(ds, 99)
}

// waitFor polls cond every 5 ms until it holds or limit passes.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// counter is a concurrency-safe counter for figures.
type counter struct{ atomic.Int64 }

// ms formats d in milliseconds: one decimal below 10 ms.
func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// stallMonitor records when this process did not run for a while (a GC
// pause or CPU starvation of a loaded test machine), so that a deadline
// observed late can be told apart from a library that acted late: a
// goroutine sleeps 2 ms at a time and records every gap above 20 ms.
type stallMonitor struct {
	mu     sync.Mutex
	stalls [][2]time.Time
	stop   chan struct{}
	done   chan struct{}
}

const stallThreshold = 20 * time.Millisecond

func startStallMonitor(t *testing.T) *stallMonitor {
	m := &stallMonitor{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		last := time.Now()
		for {
			select {
			case <-m.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			now := time.Now()
			if now.Sub(last) > stallThreshold {
				m.mu.Lock()
				m.stalls = append(m.stalls, [2]time.Time{last, now})
				m.mu.Unlock()
			}
			last = now
		}
	}()
	t.Cleanup(func() { close(m.stop); <-m.done })
	return m
}

// stalled returns how long the process stalled within [from, to].
func (m *stallMonitor) stalled(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var total time.Duration
	for _, s := range m.stalls {
		a, b := s[0], s[1]
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			total += b.Sub(a)
		}
	}
	return total
}

// checkCancelledInTime fails t if a holder's ctx, which the library
// cancels at the latest at until - ttl/10, was seen cancelled at or after
// until, unless this process stalled at least as long as the lateness in
// between (then it is counted in excused).
func checkCancelledInTime(t *testing.T, m *stallMonitor, l holderLoss, ttl time.Duration, excused *counter) {
	t.Helper()
	late := l.at.Sub(l.until)
	if late < 0 {
		return
	}
	if m != nil {
		if s := m.stalled(l.until.Add(-ttl/10), l.at); s >= late {
			excused.Add(1)
			t.Logf("holder ctx seen cancelled %v after its deadline, during a %v stall of the test process", late, s)
			return
		}
	}
	t.Errorf("holder ctx cancelled %v after its deadline (no stall of the test process to explain it)", late)
}
