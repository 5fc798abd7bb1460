package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// Scenarios against real redis-server processes only: process faults of
// nodes and holders, proxies on the links.

// slack absorbs scheduling delays of a loaded 2-core machine under -race
// in bounds on real nodes; the outcomes, not the timings, are the point.
const slack = 500 * time.Millisecond

func TestRedisMinorityCrash(t *testing.T) {
	sc := newScenario(t, "minority crash: kill -9 1 of 3, then 2 of 5", "redis", false)
	phase := pick(time.Second, 3*time.Second)
	var perPhase []int
	var mu sync.Mutex
	sc.seeds(2, 10, func(t *testing.T, seed uint64, r *rand.Rand) {
		for _, n := range []int{3, 5} {
			t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
				w := newRedisWorld(t, n)
				h := &History{}
				stats := &contenderStats{}
				var cs []*contender
				for i := range 4 {
					cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, w.clients()), h: h,
						resource: "crash", ttl: time.Second, stats: stats,
						hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(5000)) * time.Microsecond }})
				}
				ctx, cancel := context.WithCancel(context.Background())
				cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
				done := make(chan struct{})
				go func() { defer close(done); runContenders(ctx, cr, cs) }()
				kills := n / 2
				marks := []time.Time{time.Now()}
				time.Sleep(phase)
				for _, i := range r.Perm(n)[:kills] {
					w.kill(i)
					marks = append(marks, time.Now())
					time.Sleep(phase)
				}
				marks = append(marks, time.Now())
				cancel()
				<-done
				ws := h.Windows()
				for p := 1; p < len(marks)-1; p++ {
					grants := 0
					for _, x := range ws {
						if !x.Attempt.Before(marks[p]) && x.Start.Before(marks[p+1]) {
							grants++
						}
					}
					mu.Lock()
					perPhase = append(perPhase, grants)
					mu.Unlock()
					if grants == 0 {
						t.Errorf("no grant after %d of %d nodes were killed", p, n)
					}
				}
				s := stats.snapshot()
				sc.add(s.grants, kills, 0)
				requireOK(t, sc.checkHistory(t, h))
			})
		}
	})
	sc.metric("grants per phase after a kill (min)", "%d", minInt(perPhase))
}

func minInt(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

func TestRedisHolderKilled(t *testing.T) {
	sc := newScenario(t, "holder process killed (kill -9)", "redis", false)
	const ttl = time.Second
	var recs []time.Duration
	var bound time.Duration
	sc.seeds(2, 20, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 3)
		p99 := calibrate(t, newLocks(t, w.clients()), ttl, 20)
		b := ttl + maxRetryDelay + p99 + slack
		bound = max(bound, b)
		h := &History{}
		ch := startChild(t, roleHang, w.cl.Addrs(), "victim", ttl, false, "")
		cstart, cuntil, _ := ch.acquired(20 * time.Second)
		stats := &contenderStats{}
		var cs []*contender
		for i := range 2 {
			cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, w.clients()), h: h,
				resource: "victim", ttl: ttl, pause: 10 * time.Millisecond, stats: stats,
				hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(5)) * time.Millisecond }})
		}
		ctx, cancel := context.WithCancel(context.Background())
		cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		done := make(chan struct{})
		go func() { defer close(done); runContenders(ctx, cr, cs) }()
		time.Sleep(time.Duration(r.IntN(400)) * time.Millisecond)
		killed := ch.kill()
		h.Add(Window{Lock: h.NewLockID(), Resource: "victim", Owner: "child", Start: cstart, End: killed, Until: cuntil})
		ok := waitFor(2*b, func() bool { _, ok := FirstStartAfter(h.Windows(), "victim", killed); return ok })
		cancel()
		<-done
		sc.add(stats.snapshot().grants+1, 1, 0)
		if !ok {
			t.Fatalf("no other client acquired within %v of the holder's death", 2*b)
		}
		first, _ := FirstStartAfter(h.Windows(), "victim", killed)
		rec := first.Start.Sub(killed)
		recs = append(recs, rec)
		if rec > b {
			t.Errorf("another client acquired %v after the kill, want at most %v", rec, b)
		}
		requireOK(t, sc.checkHistory(t, h))
	})
	sc.metric("time to recover max / bound", "%s / %s", ms(maxDur(recs)), ms(bound))
}

// holderLoss is how a Do holder's ctx ended.
type holderLoss struct {
	cause     error
	at, until time.Time
}

// runHolder starts Do on resource through locks in a goroutine; fn records
// its window in h and reports how its ctx ended. It returns once fn runs.
func runHolder(t *testing.T, ctx context.Context, locks *redlock.Client, h *History, resource string, ttl time.Duration, wg *sync.WaitGroup) <-chan holderLoss {
	t.Helper()
	out := make(chan holderLoss, 1)
	ready := make(chan struct{})
	wg.Go(func() {
		attempt := time.Now()
		err := locks.Do(ctx, []string{resource}, ttl, func(fctx context.Context) error {
			l, _ := redlock.FromContext(fctx)
			hd := h.Begin(resource, "holder", attempt, l)
			close(ready)
			<-fctx.Done()
			at := time.Now()
			hd.End()
			out <- holderLoss{cause: context.Cause(fctx), at: at, until: l.Until()}
			return nil
		})
		var qerr *redlock.QuorumError
		if err != nil && !errors.Is(err, redlock.ErrLockLost) && !errors.As(err, &qerr) {
			t.Errorf("holder: Do = %v", err)
		}
	})
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("holder did not acquire")
	}
	return out
}

func TestRedisHolderIsolated(t *testing.T) {
	sc := newScenario(t, "holder isolated by the proxy (all links blackholed)", "redis", false)
	const ttl = time.Second
	var recs, margins []time.Duration
	var bound time.Duration
	var excused counter
	sc.seeds(2, 20, func(t *testing.T, seed uint64, r *rand.Rand) {
		stalls := startStallMonitor(t)
		w := newRedisWorld(t, 3)
		clients, links := w.proxied()
		holder := newLocks(t, clients)
		warmUp(t, holder, ttl)
		p99 := calibrate(t, newLocks(t, w.clients()), ttl, 20)
		b := ttl + maxRetryDelay + p99 + slack
		bound = max(bound, b)
		h := &History{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		lost := runHolder(t, ctx, holder, h, "iso", ttl, &wg)
		stats := &contenderStats{}
		var cs []*contender
		for i := range 2 {
			cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, w.clients()), h: h,
				resource: "iso", ttl: ttl, pause: 10 * time.Millisecond, stats: stats,
				hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(5)) * time.Millisecond }})
		}
		cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		wg.Go(func() { runContenders(ctx, cr, cs) })
		time.Sleep(time.Duration(200+r.IntN(400)) * time.Millisecond)
		for _, l := range links {
			l.Partition(redlocktest.BothDirections)
		}
		isolated := time.Now()
		var loss holderLoss
		select {
		case loss = <-lost:
		case <-time.After(3 * ttl):
			t.Fatal("the isolated holder's ctx was not cancelled within 3 TTLs")
		}
		ok := waitFor(2*b, func() bool { _, ok := FirstStartAfter(h.Windows(), "iso", isolated); return ok })
		cancel()
		wg.Wait()
		for _, l := range links {
			l.Heal()
		}
		sc.add(stats.snapshot().grants+1, 3, 0)
		if !errors.Is(loss.cause, redlock.ErrLockLost) {
			t.Errorf("holder ctx ended with %v, want ErrLockLost", loss.cause)
		}
		checkCancelledInTime(t, stalls, loss, ttl, &excused)
		margins = append(margins, loss.until.Sub(loss.at))
		if !ok {
			t.Fatalf("no other client acquired within %v of the isolation", 2*b)
		}
		first, _ := FirstStartAfter(h.Windows(), "iso", isolated)
		rec := first.Start.Sub(isolated)
		recs = append(recs, rec)
		if rec > b {
			t.Errorf("another client acquired %v after the isolation, want at most %v", rec, b)
		}
		requireOK(t, sc.checkHistory(t, h))
	})
	sc.metric("holder ctx cancelled before Until by (min)", "%s", ms(minDur(margins)))
	sc.metric("late cancellations excused by a stall of the test process", "%d", excused.Load())
	sc.metric("time to recover max / bound", "%s / %s", ms(maxDur(recs)), ms(bound))
}

func TestRedisHolderPausedWithoutFencing(t *testing.T) { testHolderPaused(t, false) }
func TestRedisHolderPausedFenced(t *testing.T)         { testHolderPaused(t, true) }

// testHolderPaused: a holder in a child process checks its validity, is
// paused with SIGSTOP right before its write, stays stopped past its TTL
// while another client acquires the lock and writes, then resumes and
// writes with its old lock. Without fencing (negative control) the store
// accepts the stale write, after the newer one: the checker must see it.
// With fencing the store rejects it.
func testHolderPaused(t *testing.T, fenced bool) {
	name := "holder paused (SIGSTOP) past its TTL, no fencing"
	if fenced {
		name = "holder paused (SIGSTOP) past its TTL, fenced store"
	}
	sc := newScenario(t, name, "redis", !fenced)
	const ttl = time.Second
	var staleAccepted, rejected, late counter
	var pauses []time.Duration
	sc.seeds(2, 20, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 3)
		storeSrv := redlocktest.StartServer(t)
		store := NewStore(storeSrv.Client(t), "store")
		h := &History{}
		ch := startChild(t, rolePauseWrite, w.cl.Addrs(), "acct", ttl, fenced, storeSrv.Addr())
		cstart, cuntil, ctoken := ch.acquired(20 * time.Second)
		ch.expect("checked", 10*time.Second)
		ch.stop()
		paused := time.Now()
		if _, err := io.WriteString(ch.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		locks := newLocks(t, w.clients(), redlock.WithFencing(fenced))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		attempt := time.Now()
		l, err := locks.Acquire(ctx, []string{"acct"}, ttl)
		if err != nil {
			t.Fatalf("new holder: %v", err)
		}
		hd := h.Begin("acct", "parent", attempt, l)
		if hd.Act() {
			if ok, err := store.Write(ctx, "parent", l.FencingToken(), fenced); err != nil || !ok {
				t.Errorf("the new holder's write = %v, %v; want accepted", ok, err)
			}
		}
		hd.End()
		_ = l.Release(ctx)
		time.Sleep(time.Duration(r.IntN(100)) * time.Millisecond)
		ch.cont()
		pauses = append(pauses, time.Since(paused))
		f := ch.expect("wrote", 10*time.Second)
		wroteAt := ch.monoField(f[0])
		id := h.NewLockID()
		h.Add(Window{Lock: id, Resource: "acct", Owner: "child", Start: cstart, End: wroteAt, Until: cuntil, Token: ctoken})
		h.AddWork(Work{Lock: id, Resource: "acct", Owner: "child", At: wroteAt, Until: cuntil, Token: ctoken})
		accepted, rej, err := store.Log(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A stale write: the child's write accepted after the new holder's.
		stale := 0
		sawParent := false
		for _, x := range accepted {
			switch x.Owner {
			case "parent":
				sawParent = true
			case "child":
				if sawParent {
					stale++
				}
			}
		}
		v := sc.checkHistory(t, h)
		sc.add(2, 1, 0)
		staleAccepted.Add(int64(stale))
		rejected.Add(int64(len(rej)))
		late.Add(int64(v.LateWork))
		if v.LateWork != 1 {
			t.Errorf("late actions = %d, want 1 (the paused holder's write): %v", v.LateWork, v)
		}
		if v.Overlaps != 0 || v.TokenViolations != 0 {
			t.Errorf("checker: %v", v)
		}
		if !fenced {
			if stale != 1 {
				t.Errorf("negative control not detected: stale writes accepted = %d, want 1 (log %v)", stale, accepted)
			}
			return
		}
		if stale != 0 || len(rej) != 1 || rej[0].Owner != "child" {
			t.Errorf("fenced store: accepted %v, rejected %v; want the child's write rejected", accepted, rej)
		}
		if ctoken == 0 || l.FencingToken() <= ctoken {
			t.Errorf("tokens: paused holder %d, new holder %d; want 0 < old < new", ctoken, l.FencingToken())
		}
	})
	sc.metric("late writes attempted", "%d", late.Load())
	sc.metric("stale writes accepted", "%d", staleAccepted.Load())
	sc.metric("stale writes rejected", "%d", rejected.Load())
	sc.metric("pause length max", "%s", ms(maxDur(pauses)))
}

func TestRedisSlowMinority(t *testing.T) {
	sc := newScenario(t, "slow minority: +150 ms on 2 of 5 links", "redis", false)
	const ttl, nodeTimeout = time.Second, redlock.DefaultNodeTimeout
	var probes []time.Duration
	var mu sync.Mutex
	runFor := pick(3*time.Second, 15*time.Second)
	sc.seeds(2, 10, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 5)
		slow := r.Perm(5)[:2]
		proxied := func() *redlock.Client {
			clients, links := w.proxied()
			locks := newLocks(t, clients)
			warmUp(t, locks, ttl)
			for _, i := range slow {
				links[i].SetLatency(75 * time.Millisecond) // +150 ms per round trip
			}
			return locks
		}
		h := &History{}
		stats := &contenderStats{}
		var cs []*contender
		for i := range 4 {
			cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: proxied(), h: h, resource: "slowmin",
				ttl: ttl, stats: stats, hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(5)) * time.Millisecond }})
		}
		probe := proxied()
		ctx, cancel := context.WithTimeout(context.Background(), runFor)
		defer cancel()
		cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		done := make(chan struct{})
		go func() { defer close(done); runContenders(ctx, cr, cs) }()
		var ds []time.Duration
		for i := 0; ctx.Err() == nil; i++ {
			start := time.Now()
			l, err := probe.TryAcquire(context.Background(), []string{fmt.Sprintf("probe-%d", i)}, ttl)
			ds = append(ds, time.Since(start))
			if err != nil {
				t.Errorf("uncontended TryAcquire with 2 slow nodes of 5: %v", err)
				continue
			}
			_ = l.Release(context.Background())
		}
		<-done
		mu.Lock()
		probes = append(probes, ds...)
		mu.Unlock()
		if p := Percentile(ds, 99); p > nodeTimeout+50*time.Millisecond {
			t.Errorf("acquire round p99 %v with 2 slow nodes, want at most the node timeout %v (+50ms)", p, nodeTimeout)
		}
		s := stats.snapshot()
		sc.add(s.grants+len(ds), 2*5, 0)
		if s.grants == 0 {
			t.Errorf("no grant (last: %v)", s.lastErr)
		}
		time.Sleep(ttl + 300*time.Millisecond)
		if n := w.lockKeys(); n != 0 {
			t.Errorf("%d lock keys left a TTL after the end", n)
		}
		requireOK(t, sc.checkHistory(t, h))
	})
	sc.metric("uncontended round p50/p99", "%s/%s (node timeout %s)", ms(Percentile(probes, 50)), ms(Percentile(probes, 99)), ms(nodeTimeout))
}

func TestRedisFrozenNodeMidBurst(t *testing.T) {
	sc := newScenario(t, "frozen node (SIGSTOP) mid-burst", "redis", false)
	const ttl, clients = time.Second, 8
	var reacquire []time.Duration
	var mu sync.Mutex
	sc.seeds(2, 20, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 3)
		h := &History{}
		var locks []*redlock.Client
		for range clients {
			locks = append(locks, newLocks(t, w.clients()))
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var grants atomic.Int64
		for i, lc := range locks {
			cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
			wg.Go(func() {
				for ctx.Err() == nil {
					res := fmt.Sprintf("burst-%d", cr.IntN(4))
					attempt := time.Now()
					l, err := lc.TryAcquire(ctx, []string{res}, ttl)
					if err != nil {
						time.Sleep(time.Duration(cr.IntN(2000)) * time.Microsecond)
						continue
					}
					grants.Add(1)
					hd := h.Begin(res, fmt.Sprintf("c%d", i), attempt, l)
					if hd.Act() {
						time.Sleep(time.Duration(1+cr.IntN(3)) * time.Millisecond)
					}
					hd.End()
					_ = l.Release(context.Background())
				}
			})
		}
		time.Sleep(300 * time.Millisecond)
		frozen := r.IntN(3)
		w.freeze(frozen)
		time.Sleep(time.Duration(500+r.IntN(1000)) * time.Millisecond)
		w.thaw(frozen)
		time.Sleep(300 * time.Millisecond)
		cancel()
		wg.Wait()
		// The same clients acquire every resource again at once: the late
		// keys on the thawed node must not block them.
		for i, lc := range locks {
			for k := range 4 {
				res := fmt.Sprintf("burst-%d", k)
				start := time.Now()
				actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
				l, err := lc.Acquire(actx, []string{res}, ttl)
				acancel()
				if err != nil {
					t.Errorf("client %d: re-acquiring %s after the thaw: %v", i, res, err)
					continue
				}
				mu.Lock()
				reacquire = append(reacquire, time.Since(start))
				mu.Unlock()
				hd := h.Begin(res, fmt.Sprintf("c%d", i), start, l)
				hd.End()
				_ = l.Release(context.Background())
			}
		}
		time.Sleep(ttl + 300*time.Millisecond)
		if n := w.lockKeys(); n != 0 {
			t.Errorf("%d lock keys left a TTL after the thaw", n)
		}
		sc.add(int(grants.Load())+clients*4, 1, 0)
		requireOK(t, sc.checkHistory(t, h))
	})
	sc.metric("re-acquire after thaw p50/p99", "%s/%s", ms(Percentile(reacquire, 50)), ms(Percentile(reacquire, 99)))
	sc.metric("lock keys a TTL after the thaw", "0 (asserted)")
}

func TestRedisSameInstantBurst(t *testing.T) {
	sc := newScenario(t, "50 clients at the same instant", "redis", false)
	const n, ttl = 50, 2 * time.Second
	reps := pick(40, 1000)
	var rounds []int
	var noWinner, split counter
	sc.seeds(2, 3, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 3)
		h := &History{}
		locks := make([]*redlock.Client, n)
		for i := range locks {
			locks[i] = newLocks(t, w.clients())
		}
		for rep := range reps {
			res := fmt.Sprintf("same-%d", rep)
			start := make(chan struct{})
			type result struct {
				l     *redlock.Lock
				round int
				hd    *Hold
			}
			results := make(chan result, n)
			var wg sync.WaitGroup
			for i, lc := range locks {
				cr := rand.New(rand.NewPCG(r.Uint64(), uint64(i)))
				wg.Go(func() {
					<-start
					deadline := time.Now().Add(5 * time.Second)
					for round := 1; time.Now().Before(deadline); round++ {
						attempt := time.Now()
						l, err := lc.TryAcquire(context.Background(), []string{res}, ttl)
						if err == nil {
							results <- result{l: l, round: round, hd: h.Begin(res, fmt.Sprintf("c%d", i), attempt, l)}
							return
						}
						// Lost for sure once a quorum holds the lock.
						if _, held, _ := lc.HolderMetadata(context.Background(), res); held {
							return
						}
						split.Add(1)
						time.Sleep(time.Duration(cr.IntN(10*round)) * time.Millisecond)
					}
				})
			}
			close(start)
			wg.Wait()
			close(results)
			var won []result
			for x := range results {
				won = append(won, x)
			}
			for _, x := range won {
				x.hd.End()
				_ = x.l.Release(context.Background())
			}
			switch len(won) {
			case 0:
				noWinner.Add(1)
				t.Errorf("rep %d: no winner within 5 s", rep)
			case 1:
				rounds = append(rounds, won[0].round)
			default:
				t.Errorf("rep %d: %d winners", rep, len(won))
			}
		}
		sc.add(reps, 0, 0)
		requireOK(t, sc.checkHistory(t, h))
	})
	sc.metric("rounds to the first grant p50/p99/max", "%d/%d/%d", PercentileInt(rounds, 50), PercentileInt(rounds, 99), PercentileInt(rounds, 100))
	sc.metric("split rounds (no quorum for anyone)", "%d", split.Load())
	sc.metric("reps without a winner", "%d", noWinner.Load())
}
