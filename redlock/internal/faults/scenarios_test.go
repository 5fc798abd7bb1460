package faults

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// Scenarios that run both in the simulation (fake time, in-memory nodes)
// and against real redis-server processes.

// seedsFor returns the PR and soak seed counts of a scenario that runs in
// both tiers: more seeds in the simulation, which is cheap.
func seedsFor(sim bool, simPR, simSoak, redisPR, redisSoak int) (pr, soak int) {
	if sim {
		return simPR, simSoak
	}
	return redisPR, redisSoak
}

func tierName(sim bool) string {
	if sim {
		return "sim"
	}
	return "redis"
}

// simLatency gives every link of a simulated client a small random
// latency, so that the simulation is not a zero-latency network.
func simLatency(r *rand.Rand, links []link) {
	for _, l := range links {
		l.SetLatency(time.Duration(200+r.IntN(1800)) * time.Microsecond)
	}
}

// clientsFor returns a client set: in the simulation with small random
// link latencies, against Redis direct clients.
func clientsFor(w world, r *rand.Rand) []redis.UniversalClient {
	if w.tier() == "sim" {
		c, links := w.proxied()
		simLatency(r, links)
		return c
	}
	return w.clients()
}

func TestSimBaselineContention(t *testing.T)   { testBaseline(t, true) }
func TestRedisBaselineContention(t *testing.T) { testBaseline(t, false) }

// testBaseline: 8 clients contend for one resource with random short
// holds. Pass: 0 overlaps, spurious failures (Acquire giving up within 10 s
// without faults) under 1%, no lock key left after the TTL.
func testBaseline(t *testing.T, sim bool) {
	sc := newScenario(t, "baseline contention, 8 clients", tierName(sim), false)
	var grants, failures, releaseErrs, orphansNow counter
	var durs []time.Duration
	var mu sync.Mutex
	const clients, ttl = 8, time.Second
	cycles := pick(50, 250)
	if sim {
		cycles = pick(25, 150) // the in-memory engine parses every script: costly under -race
	}
	pr, long := seedsFor(sim, 3, 20, 2, 20)
	sc.seeds(pr, long, func(t *testing.T, seed uint64, r *rand.Rand) {
		inWorld(t, sim, 3, func(t *testing.T, w world) {
			h := &History{}
			stats := &contenderStats{}
			var cs []*contender
			for i := range clients {
				cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, clientsFor(w, r)), h: h,
					resource: "shared", ttl: ttl, cycles: cycles, stats: stats,
					hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(3000)) * time.Microsecond }})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			runContenders(ctx, r, cs)
			cancel()
			orphansNow.Add(int64(w.lockKeys()))
			time.Sleep(ttl + 100*time.Millisecond)
			if n := w.lockKeys(); n != 0 {
				t.Errorf("%d lock keys left a TTL after the last release", n)
			}
			v := sc.checkHistory(t, h)
			requireOK(t, v)
			s := stats.snapshot()
			sc.add(s.grants, 0, 0)
			grants.Add(int64(s.grants))
			failures.Add(int64(s.failures))
			releaseErrs.Add(int64(s.releaseErrs))
			mu.Lock()
			durs = append(durs, s.acquireDur...)
			mu.Unlock()
			if s.grants != clients*cycles {
				t.Errorf("%d grants, want %d (last error: %v)", s.grants, clients*cycles, s.lastErr)
			}
			if rate := float64(s.failures) / float64(s.grants+s.failures); rate >= 0.01 {
				t.Errorf("spurious failure rate %.2f%% (%d), want under 1%% (last: %v)", 100*rate, s.failures, s.lastErr)
			}
		})
	})
	total := grants.Load() + failures.Load()
	sc.metric("spurious failures", "%d (%.2f%%)", failures.Load(), 100*float64(failures.Load())/float64(max(total, 1)))
	sc.metric("acquire p50/p99", "%s/%s", ms(Percentile(durs, 50)), ms(Percentile(durs, 99)))
	sc.metric("release errors", "%d", releaseErrs.Load())
	sc.metric("lock keys right after the last release", "%d", orphansNow.Load())
}

func TestSimIgnoringValidity(t *testing.T)   { testIgnoringValidity(t, true) }
func TestRedisIgnoringValidity(t *testing.T) { testIgnoringValidity(t, false) }

// testIgnoringValidity is a negative control: a client holds its lock for
// three TTLs without extending it and keeps acting without checking
// validity, while two correct clients contend. The checker must find
// overlapping windows and late actions in every seed, all of them the
// rogue client's.
func testIgnoringValidity(t *testing.T, sim bool) {
	sc := newScenario(t, "client ignores validity (holds past Until)", tierName(sim), true)
	var late counter
	const ttl = 200 * time.Millisecond
	pr, long := seedsFor(sim, 3, 30, 2, 20)
	sc.seeds(pr, long, func(t *testing.T, seed uint64, r *rand.Rand) {
		inWorld(t, sim, 3, func(t *testing.T, w world) {
			h := &History{}
			stats := &contenderStats{}
			rogue := &contender{name: "rogue", locks: newLocks(t, clientsFor(w, r)), h: h, resource: "r", ttl: ttl,
				cycles: 2, ignoreValidity: true, pause: 50 * time.Millisecond, stats: &contenderStats{},
				hold: func(r *rand.Rand) time.Duration { return 3*ttl + time.Duration(r.IntN(100))*time.Millisecond }}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for i := range 2 {
				c := &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, clientsFor(w, r)), h: h, resource: "r",
					ttl: ttl, pause: 5 * time.Millisecond, stats: stats,
					hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(2000)) * time.Microsecond }}
				cr := rand.New(rand.NewPCG(r.Uint64(), 1))
				wg.Go(func() { c.run(ctx, cr) })
			}
			rogue.run(context.Background(), rand.New(rand.NewPCG(seed, 2)))
			cancel()
			wg.Wait()
			v := sc.checkHistory(t, h)
			sc.add(stats.snapshot().grants+rogue.stats.snapshot().grants, 2, 0)
			late.Add(int64(v.LateWork))
			if v.Overlaps == 0 || v.LateWork == 0 {
				t.Errorf("negative control not detected: %v", v)
			}
			// Every violation is the rogue's: without its windows and
			// actions the history is clean.
			var ws []Window
			for _, x := range h.Windows() {
				if x.Owner != "rogue" {
					ws = append(ws, x)
				}
			}
			if v2 := Check(ws, nil); v2.Overlaps != 0 {
				t.Errorf("overlaps between correct clients: %v", v2)
			}
		})
	})
	sc.metric("late actions", "%d", late.Load())
}

func TestSimMajorityLoss(t *testing.T)   { testMajorityLoss(t, true) }
func TestRedisMajorityLoss(t *testing.T) { testMajorityLoss(t, false) }

// testMajorityLoss: two holders run Do, three clients contend; a majority
// of nodes is frozen (odd seeds) or killed (even seeds) for 3x TTL, then
// restored. Pass: 0 grants while the majority is down, each holder's ctx
// cancelled with ErrLockLost before its Until, the first grant after the
// restore within TTL + max retry delay + p99 acquire time (+ slack on real
// nodes), 0 overlaps.
func testMajorityLoss(t *testing.T, sim bool) {
	sc := newScenario(t, "majority loss for 3x TTL, then restore", tierName(sim), false)
	ttl, slack := time.Second, 500*time.Millisecond
	if sim {
		ttl, slack = 5*time.Second, 10*time.Millisecond
	}
	var recoveries, margins []time.Duration
	var mu sync.Mutex
	var bound time.Duration
	var excused counter
	pr, long := seedsFor(sim, 3, 30, 2, 20)
	sc.seeds(pr, long, func(t *testing.T, seed uint64, r *rand.Rand) {
		inWorld(t, sim, 3, func(t *testing.T, w world) {
			var stalls *stallMonitor
			if !sim {
				stalls = startStallMonitor(t)
			}
			h := &History{}
			stats := &contenderStats{}
			p99 := calibrate(t, newLocks(t, clientsFor(w, r)), ttl, 20)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			var cs []*contender
			for i := range 3 {
				cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, clientsFor(w, r)), h: h,
					resource: "shared", ttl: ttl, pause: 10 * time.Millisecond, stats: stats,
					hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(20)) * time.Millisecond }})
			}
			cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
			wg.Go(func() { runContenders(ctx, cr, cs) })
			losses := make(chan holderLoss, 2)
			ready := make(chan struct{}, 2)
			for i := range 2 {
				locks := newLocks(t, clientsFor(w, r))
				res := fmt.Sprintf("held-%d", i)
				wg.Go(func() {
					attempt := time.Now()
					err := locks.Do(ctx, []string{res}, ttl, func(fctx context.Context) error {
						l, _ := redlock.FromContext(fctx)
						hd := h.Begin(res, res, attempt, l)
						ready <- struct{}{}
						<-fctx.Done()
						at := time.Now()
						hd.End()
						losses <- holderLoss{cause: context.Cause(fctx), at: at, until: l.Until()}
						return nil
					})
					if err != nil && !errors.Is(err, redlock.ErrLockLost) {
						t.Errorf("holder %s: Do = %v", res, err)
					}
				})
			}
			for range 2 {
				<-ready
			}
			time.Sleep(ttl / 2)
			down := r.Perm(3)[:2]
			frozen := seed%2 == 1
			for _, i := range down {
				if frozen {
					w.freeze(i)
				} else {
					w.kill(i)
				}
			}
			t0 := time.Now()
			time.Sleep(3 * ttl)
			t1Start := time.Now()
			for _, i := range down {
				if frozen {
					w.thaw(i)
				} else {
					w.restart(i)
				}
			}
			t1 := time.Now()
			b := ttl + maxRetryDelay + p99 + slack + t1.Sub(t1Start)
			mu.Lock()
			bound = max(bound, b)
			mu.Unlock()
			waitFor(2*b, func() bool { _, ok := FirstStartAfter(h.Windows(), "shared", t1); return ok })
			time.Sleep(ttl / 2)
			cancel()
			wg.Wait()
			sc.add(stats.snapshot().grants+2, 2, 0)
			for range 2 {
				l := <-losses
				if !errors.Is(l.cause, redlock.ErrLockLost) {
					t.Errorf("holder ctx ended with %v, want ErrLockLost", l.cause)
					continue
				}
				checkCancelledInTime(t, stalls, l, ttl, &excused)
				mu.Lock()
				margins = append(margins, l.until.Sub(l.at))
				mu.Unlock()
			}
			ws := h.Windows()
			for _, x := range ws {
				if !x.Attempt.Before(t0) && x.Start.Before(t1Start) {
					t.Errorf("%s granted %q at +%v while the majority was down", x.Owner, x.Resource, x.Start.Sub(t0))
				}
			}
			first, ok := FirstStartAfter(ws, "shared", t1)
			if !ok {
				t.Errorf("no grant after the restore")
			} else {
				rec := first.Start.Sub(t1)
				mu.Lock()
				recoveries = append(recoveries, rec)
				mu.Unlock()
				if rec > b {
					t.Errorf("recovery took %v, want at most %v (TTL %v + retry %v + p99 %v + slack)", rec, b, ttl, maxRetryDelay, p99)
				}
			}
			requireOK(t, sc.checkHistory(t, h))
		})
	})
	sc.metric("grants while down", "0 (asserted)")
	sc.metric("holder ctx cancelled before Until by (min)", "%s", ms(minDur(margins)))
	sc.metric("late cancellations excused by a stall of the test process", "%d", excused.Load())
	sc.metric("recovery max / bound", "%s / %s", ms(maxDur(recoveries)), ms(bound))
}

func minDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}

func maxDur(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

func TestSimUniformlySlowLinks(t *testing.T)   { testUniformlySlow(t, true) }
func TestRedisUniformlySlowLinks(t *testing.T) { testUniformlySlow(t, false) }

// testUniformlySlow: every link is slow, a round trip takes about TTL/3.
// Two clients run with WithMinValidity(0.75) on one resource: every grant
// leaves about 0.65 TTL and must be refused (and undone); two with the
// default 0.5 contend for another resource and get their locks. Every client makes one round per try (TryAcquire), so each
// refusal is counted. Pass: strict clients 0 grants and their refusals counted,
// default clients granted, 0 overlaps, no lock key a TTL after the end.
func testUniformlySlow(t *testing.T, sim bool) {
	sc := newScenario(t, "uniformly slow links (round trip ~TTL/3)", tierName(sim), false)
	const ttl = 600 * time.Millisecond
	var weak, strictGrants, grants counter
	runFor := pick(4*time.Second, 10*time.Second)
	if sim {
		runFor = pick(20*time.Second, 2*time.Minute)
	}
	pr, long := seedsFor(sim, 3, 20, 2, 10)
	sc.seeds(pr, long, func(t *testing.T, seed uint64, r *rand.Rand) {
		inWorld(t, sim, 3, func(t *testing.T, w world) {
			h := &History{}
			strict, lax := &contenderStats{}, &contenderStats{}
			oneWay := ttl/6 + time.Duration(r.IntN(20)-10)*time.Millisecond // round trip ~ TTL/3
			var cs []*contender
			for i := range 4 {
				clients, links := w.proxied()
				opts := []redlock.Option{redlock.WithNodeTimeout(500 * time.Millisecond)}
				// Open the connections and load the scripts first: a new
				// connection (handshake) or script (NOSCRIPT, then EVAL)
				// costs one more round trip.
				warmUp(t, newLocks(t, clients, opts...), ttl)
				for _, l := range links {
					l.SetLatency(oneWay)
				}
				st, name, res := lax, fmt.Sprintf("default%d", i), "slow-default"
				if i < 2 {
					opts = append(opts, redlock.WithMinValidity(0.75))
					st, name, res = strict, fmt.Sprintf("strict%d", i), "slow-strict"
				}
				cs = append(cs, &contender{name: name, locks: newLocks(t, clients, opts...), h: h, resource: res,
					ttl: ttl, try: true, pause: 10 * time.Millisecond, stats: st,
					hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(20)) * time.Millisecond }})
			}
			ctx, cancel := context.WithTimeout(context.Background(), runFor)
			runContenders(ctx, r, cs)
			cancel()
			time.Sleep(ttl + 200*time.Millisecond)
			if n := w.lockKeys(); n != 0 {
				t.Errorf("%d lock keys left a TTL after the end", n)
			}
			requireOK(t, sc.checkHistory(t, h))
			s, l := strict.snapshot(), lax.snapshot()
			sc.add(s.grants+s.failures+l.grants, 12, 0)
			weak.Add(int64(s.weak + l.weak))
			strictGrants.Add(int64(s.grants))
			grants.Add(int64(l.grants))
			if s.grants != 0 {
				t.Errorf("clients with minimum validity 0.75 got %d grants over links of ~%v round trip", s.grants, 2*oneWay)
			}
			if s.weak == 0 {
				t.Errorf("no weak grant refused (strict failures %d, last: %v)", s.failures, s.lastErr)
			}
			if l.grants == 0 {
				t.Errorf("clients with the default minimum validity got no grant (last: %v)", l.lastErr)
			}
		})
	})
	sc.metric("weak grants refused", "%d", weak.Load())
	sc.metric("grants (minValidity 0.75 / 0.5)", "%d / %d", strictGrants.Load(), grants.Load())
	sc.metric("lock keys a TTL after the end", "0 (asserted)")
}

// warmUp runs acquire, extend and release once through locks, so that its
// connections are open and its scripts loaded.
func warmUp(t *testing.T, locks *redlock.Client, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	l, err := locks.Acquire(ctx, []string{"warm-up"}, ttl)
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	if err := l.Extend(ctx, ttl); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
}

func TestSimExtensionUnderLatencySpikes(t *testing.T)   { testExtensionSpikes(t, true) }
func TestRedisExtensionUnderLatencySpikes(t *testing.T) { testExtensionSpikes(t, false) }

// extendProbe is a go-redis hook on a holder's clients that sees every
// extend script sent for the holder's current lock and counts those sent
// after the lock's validity deadline (there must be none). It learns
// the extend script's SHA1 from a warm-up Extend (learn), so it does not
// depend on the script's text or arguments.
type extendProbe struct {
	lock  atomic.Pointer[redlock.Lock]
	sha   atomic.Pointer[string]
	sent  atomic.Int64
	late  atomic.Int64
	ties  atomic.Int64 // sent at the deadline instant (fake time)
	worst atomic.Int64 // ns past the deadline

	learning atomic.Int32 // 1: the warm-up Acquire, 2: the warm-up Extend
	mu       sync.Mutex
	examples []string
	acquire  map[string]bool // SHA1s sent by the warm-up Acquire
}

// learn runs a warm-up Extend through locks (whose clients carry the
// probe) and records the SHA1 of the script it sends.
func (p *extendProbe) learn(t *testing.T, locks *redlock.Client, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	p.acquire = map[string]bool{}
	p.learning.Store(1)
	l, err := locks.Acquire(ctx, []string{"warm-up"}, ttl)
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	// The Acquire decided after a quorum: its script may still reach the
	// last node during the Extend, so the Extend's script is the one that
	// the Acquire did not send.
	p.learning.Store(2)
	err = l.Extend(ctx, ttl)
	p.learning.Store(0)
	if err != nil {
		t.Fatalf("warm-up Extend: %v", err)
	}
	_ = l.Release(ctx)
	if p.sha.Load() == nil {
		t.Fatal("warm-up Extend sent no script")
	}
}

func (p *extendProbe) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *extendProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			p.see(ctx, cmd)
		}
		return next(ctx, cmds)
	}
}
func (p *extendProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		p.see(ctx, cmd)
		return next(ctx, cmd)
	}
}

// see inspects a command about to be sent (alone or in a pipeline).
func (p *extendProbe) see(ctx context.Context, cmd redis.Cmder) {
	sha := scriptSHA(cmd.Args())
	switch p.learning.Load() {
	case 1:
		p.mu.Lock()
		p.acquire[sha] = true
		p.mu.Unlock()
		return
	case 2:
		p.mu.Lock()
		acquire := p.acquire[sha]
		p.mu.Unlock()
		if sha != "" && !acquire {
			p.sha.Store(&sha)
		}
		return
	}
	// go-redis does not send a command whose ctx has ended.
	if want := p.sha.Load(); want == nil || sha != *want || ctx.Err() != nil {
		return
	}
	p.sent.Add(1)
	l := p.lock.Load()
	if l == nil {
		return
	}
	past := time.Since(l.Until())
	if past == 0 {
		// Only in fake time: the send and the deadline fall on the same
		// instant (the round's context is not yet cancelled then: its
		// timer has not run). Counted, not failed: it is not after.
		p.ties.Add(1)
		return
	}
	if past > 0 {
		p.late.Add(1)
		p.worst.Store(max(p.worst.Load(), int64(past)))
		p.mu.Lock()
		if len(p.examples) < 3 {
			p.examples = append(p.examples, fmt.Sprintf("%v sent %v after Until", cmd.Args()[0], past))
		}
		p.mu.Unlock()
	}
}

// scriptSHA returns the SHA1 of the script an EVALSHA or EVAL command
// runs, or "".
func scriptSHA(args []any) string {
	if len(args) < 2 {
		return ""
	}
	name, _ := args[0].(string)
	body, _ := args[1].(string)
	switch strings.ToLower(name) {
	case "evalsha":
		return body
	case "eval":
		return fmt.Sprintf("%x", sha1.Sum([]byte(body)))
	}
	return ""
}

// testExtensionSpikes: a holder runs Do for 2 s at a time with TTL 600 ms
// (extension every 200 ms) through links that get random latency spikes,
// some above the 100 ms node timeout, while a contender grabs the lock
// whenever it is free. Pass: 0 extensions sent after the deadline, 0
// overlaps; the false-loss rate (holds lost although the holder and the
// nodes were alive) is reported.
func testExtensionSpikes(t *testing.T, sim bool) {
	sc := newScenario(t, "extension under latency spikes", tierName(sim), false)
	const ttl = 600 * time.Millisecond
	var holds, lost, sent, ties, spikes counter
	var worst atomic.Int64
	runFor := pick(5*time.Second, 20*time.Second)
	if sim {
		runFor = pick(30*time.Second, 2*time.Minute)
	}
	pr, long := seedsFor(sim, 3, 10, 2, 10)
	sc.seeds(pr, long, func(t *testing.T, seed uint64, r *rand.Rand) {
		inWorld(t, sim, 3, func(t *testing.T, w world) {
			h := &History{}
			clients, links := w.proxied()
			probe := &extendProbe{}
			for _, c := range clients {
				c.AddHook(probe)
			}
			holder := newLocks(t, clients)
			probe.learn(t, holder, ttl)
			rival := &contender{name: "rival", locks: newLocks(t, clientsFor(w, r)), h: h, resource: "ext", ttl: ttl,
				try: true, pause: 20 * time.Millisecond, stats: &contenderStats{},
				hold: func(r *rand.Rand) time.Duration { return 5 * time.Millisecond }}
			ctx, cancel := context.WithTimeout(context.Background(), runFor)
			defer cancel()
			var wg sync.WaitGroup
			wg.Go(func() { rival.run(ctx, rand.New(rand.NewPCG(seed, 3))) })
			sr := rand.New(rand.NewPCG(seed, 4))
			wg.Go(func() {
				lat := []time.Duration{20 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond, 250 * time.Millisecond}
				for ctx.Err() == nil {
					sleepCtx(ctx, time.Duration(50+sr.IntN(200))*time.Millisecond)
					var hit []link
					for _, i := range sr.Perm(len(links))[:1+sr.IntN(len(links))] {
						hit = append(hit, links[i])
					}
					d := lat[sr.IntN(len(lat))]
					for _, l := range hit {
						l.SetLatency(d)
					}
					spikes.Add(1)
					sc.add(0, 1, 0)
					sleepCtx(ctx, time.Duration(50+sr.IntN(350))*time.Millisecond)
					for _, l := range hit {
						l.Heal()
					}
				}
			})
			for ctx.Err() == nil {
				attempt := time.Now()
				err := holder.Do(ctx, []string{"ext"}, ttl, func(fctx context.Context) error {
					l, _ := redlock.FromContext(fctx)
					probe.lock.Store(l)
					hd := h.Begin("ext", "holder", attempt, l)
					defer hd.End()
					holds.Add(1)
					sc.add(1, 0, 0)
					for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
						if !hd.Act() {
							break
						}
						select {
						case <-fctx.Done():
							if errors.Is(context.Cause(fctx), redlock.ErrLockLost) {
								lost.Add(1)
							}
							return nil
						case <-time.After(20 * time.Millisecond):
						}
					}
					return nil
				})
				// Under spikes an acquisition can fail, a hold can be lost,
				// and a release can fail to confirm on a quorum (a
				// *QuorumError): all expected.
				var qerr *redlock.QuorumError
				if err != nil && !errors.Is(err, redlock.ErrNotAcquired) && !errors.Is(err, redlock.ErrLockLost) &&
					!errors.As(err, &qerr) {
					t.Errorf("Do: %v", err)
				}
			}
			wg.Wait()
			for _, l := range links {
				l.Heal()
			}
			sent.Add(probe.sent.Load())
			ties.Add(probe.ties.Load())
			worst.Store(max(worst.Load(), probe.worst.Load()))
			if n := probe.late.Load(); n != 0 {
				t.Errorf("%d extensions sent after the deadline (worst %v late): %q", n, time.Duration(probe.worst.Load()), probe.examples)
			}
			if probe.sent.Load() == 0 {
				t.Errorf("no extension seen by the probe")
			}
			requireOK(t, sc.checkHistory(t, h))
		})
	})
	if ttls, nsent, nlate := nearDeadlineSweep(t, sim); ttls > 0 {
		sc.add(ttls, ttls*2, 0)
		sc.metric("near-deadline sweep (frozen node + cut link, TTL 400-700 ms)", "%d TTLs, %d extensions sent, %d after Until", ttls, nsent, nlate)
	}
	if sim {
		t.Run("batched-after-noscript", func(t *testing.T) {
			RunSim(t, 3, func(t *testing.T, c *SimCluster) {
				s, l := extendBatchedAfterNoscript(t, c)
				sc.add(1, 4, 0)
				sc.metric("batched extension after NOSCRIPT (targeted)", "%d scripts sent, %d after Until", s, l)
			})
		})
	}
	sc.metric("extensions sent / after deadline (random spikes)", "%d / 0", sent.Load())
	if sim {
		sc.metric("sent at the deadline instant (fake-time ties)", "%d", ties.Load())
	}
	sc.metric("false losses", "%d of %d holds (%.1f%%)", lost.Load(), holds.Load(), 100*float64(lost.Load())/float64(max(holds.Load(), 1)))
	sc.metric("spikes", "%d", spikes.Load())
}

// extendNearDeadline is the targeted case of the extension scenario: an
// acquire call is still on its way to a frozen node (its go-redis read
// lasts up to 3 s) while every extension fails because a second node is
// cut off, so the watchdog retries right up to its deadline. No extension
// may be sent after Until. Where the last retry lands depends on the
// TTL, so callers try a range of TTLs. It returns the number sent and the
// number late.
func extendNearDeadline(t *testing.T, w world, ttl time.Duration) (sent, late int64) {
	t.Helper()
	clients, links := w.proxied()
	probe := &extendProbe{}
	for _, c := range clients {
		c.AddHook(probe)
	}
	holder := newLocks(t, clients)
	probe.learn(t, holder, ttl)
	res := "near-" + ttl.String()
	w.freeze(2)
	defer w.thaw(2)
	err := holder.Do(context.Background(), []string{res}, ttl, func(ctx context.Context) error {
		l, _ := redlock.FromContext(ctx)
		probe.lock.Store(l)
		links[1].Partition(redlocktest.BothDirections)
		<-ctx.Done()
		return nil
	})
	links[1].Heal()
	if !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Do with two of three nodes unreachable = %v, want ErrLockLost", err)
	}
	if n := probe.late.Load(); n != 0 {
		t.Errorf("TTL %v: %d extensions sent after Until (worst %v): %q", ttl, n, time.Duration(probe.worst.Load()), probe.examples)
	}
	return probe.sent.Load(), probe.late.Load()
}

// nearDeadlineSweep runs extendNearDeadline for TTLs from 400 to 700 ms (every
// 20 ms in the simulation, 40 ms on real nodes, 10 ms there in the soak tier)
// as subtests and returns the totals.
func nearDeadlineSweep(t *testing.T, sim bool) (ttls int, sent, late int64) {
	t.Helper()
	var w world
	if !sim {
		w = newRedisWorld(t, 3)
	}
	step := 20 * time.Millisecond
	if !sim {
		step = pick(40*time.Millisecond, 10*time.Millisecond)
	}
	for ttl := 400 * time.Millisecond; ttl <= 700*time.Millisecond; ttl += step {
		t.Run("near-deadline/ttl="+ttl.String(), func(t *testing.T) {
			ttls++ // not counted when -run filters the subtest out
			if sim {
				RunSim(t, 3, func(t *testing.T, c *SimCluster) {
					s, l := extendNearDeadline(t, simWorld{c}, ttl)
					sent += s
					late += l
				})
				return
			}
			rw := &redisWorld{t: t, cl: w.(*redisWorld).cl}
			s, l := extendNearDeadline(t, rw, ttl)
			sent += s
			late += l
		})
	}
	return ttls, sent, late
}

// extendBatchedAfterNoscript is a targeted case for the batching of
// scripts per node (redlock/pipeline.go), in the simulation's exact time:
// an Extend queued behind another call of the same Client, sent in a batch
// together with a call that has a later deadline, on nodes that lost their
// script cache (a restart, SCRIPT FLUSH). The EVALSHA batch is sent before
// Until; the nodes answer NOSCRIPT; the EVAL batch must not carry the
// extension after Until. Round trip 40 ms, TTL 200 ms (Until = start +
// 196 ms): X (another acquisition) at +100 ms runs EVALSHA, NOSCRIPT, EVAL
// until +180 ms; the Extend (+150 ms) and Y (another acquisition, +175 ms,
// deadline +275 ms) queue behind it and go out as one batch at +180 ms;
// NOSCRIPT comes back after Until, and the EVAL batch goes out under Y's
// deadline.
func extendBatchedAfterNoscript(t *testing.T, c *SimCluster) (sent, late int64) {
	t.Helper()
	const ttl = 200 * time.Millisecond
	clients, links := c.Clients()
	probe := &extendProbe{}
	for _, rdb := range clients {
		rdb.AddHook(probe)
	}
	holder := newLocks(t, clients)
	probe.learn(t, holder, ttl)
	for _, l := range links {
		l.SetLatency(20 * time.Millisecond)
	}
	ctx := context.Background()
	start := time.Now()
	a, err := holder.Acquire(ctx, []string{"a"}, ttl)
	if err != nil {
		t.Fatalf("acquire a: %v", err)
	}
	probe.lock.Store(a)
	direct, _ := c.Clients()
	for _, rdb := range direct {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
	}
	var wg sync.WaitGroup
	at := func(d time.Duration, f func()) {
		wg.Go(func() {
			time.Sleep(time.Until(start.Add(d)))
			f()
		})
	}
	at(100*time.Millisecond, func() { _, _ = holder.TryAcquire(ctx, []string{"x"}, ttl) })
	at(150*time.Millisecond, func() { _ = a.Extend(ctx, ttl) })
	at(175*time.Millisecond, func() { _, _ = holder.TryAcquire(ctx, []string{"y"}, ttl) })
	wg.Wait()
	time.Sleep(time.Second)
	if n := probe.late.Load(); n != 0 {
		t.Errorf("batched extension after NOSCRIPT: %d extension scripts sent after Until (worst %v): %q",
			n, time.Duration(probe.worst.Load()), probe.examples)
	}
	return probe.sent.Load(), probe.late.Load()
}
