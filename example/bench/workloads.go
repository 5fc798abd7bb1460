package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// keyPrefix starts every key the benchmark locks, so that it never touches
// other data on servers given with -redis.
const keyPrefix = "schedlock-bench:"

// participants returns the selected libraries that run workload w on n
// nodes, in table order.
func (b *bench) participants(w string, n int) []string {
	var out []string
	for _, name := range b.cfg.libs {
		switch {
		case singleNode(name) && n != 1:
			continue
		case name == libFloor && (w == wContended || w == wPaused):
			continue
		case w == wPaused && name != libOurs && name != libRedsync:
			continue
		}
		out = append(out, name)
	}
	return out
}

// order returns names rotated by round, so that no library always runs
// first or last in a round.
func order(names []string, round int) []string {
	k := round % len(names)
	return append(append([]string(nil), names[k:]...), names[:k]...)
}

// segmentGC collects garbage before a segment so that one library's
// garbage is not collected on another one's time.
func segmentGC() { runtime.GC() }

// --- 1. sequential ---

type seqAcc struct {
	ops, errs int
	cmds      int64
	elapsed   time.Duration
	lat       []time.Duration
	perRound  []float64
	lastErr   error
}

func (b *bench) runSequential(ctx context.Context) error {
	for _, n := range b.cfg.nodes {
		names := b.participants(wSeq, n)
		accs := map[string]*seqAcc{}
		keys := map[string]*key{}
		for _, name := range names {
			accs[name] = &seqAcc{}
			keys[name] = newKey(fmt.Sprintf("%sseq:%s:%d", keyPrefix, name, n))
			l, err := b.lib(name, n)
			if err != nil {
				return err
			}
			seqSegment(ctx, l, keys[name], b.cfg.warmup, &seqAcc{})
		}
		for r := range b.cfg.rounds {
			for _, name := range order(names, r) {
				l, _ := b.lib(name, n)
				segmentGC()
				a := &seqAcc{}
				c0 := l.commands()
				seqSegment(ctx, l, keys[name], b.cfg.seg, a)
				acc := accs[name]
				acc.cmds += l.commands() - c0
				acc.ops += a.ops
				acc.errs += a.errs
				acc.elapsed += a.elapsed
				acc.lat = append(acc.lat, a.lat...)
				acc.perRound = append(acc.perRound, float64(a.ops)/a.elapsed.Seconds())
				if a.lastErr != nil {
					acc.lastErr = a.lastErr
				}
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
		for _, name := range names {
			a := accs[name]
			res := result{Workload: wSeq, Nodes: n, Lib: name, Main: mOpsPerSec, PerRound: a.perRound,
				Metrics: map[string]float64{
					mOps:       float64(a.ops),
					mErrors:    float64(a.errs),
					mOpsPerSec: float64(a.ops) / a.elapsed.Seconds(),
					mP50us:     us(percentile(a.lat, 0.50)),
					mP99us:     us(percentile(a.lat, 0.99)),
					mCmdsPerOp: float64(a.cmds) / float64(max(a.ops, 1)),
				}}
			if a.lastErr != nil {
				res.Note = "last error: " + a.lastErr.Error()
			}
			b.add(res)
		}
	}
	return nil
}

// seqSegment runs cycles of k on l for d (at least one) into a.
func seqSegment(ctx context.Context, l lib, k *key, d time.Duration, a *seqAcc) {
	start := time.Now()
	deadline := start.Add(d)
	for {
		t0 := time.Now()
		err := l.cycle(ctx, k)
		t1 := time.Now()
		if err != nil {
			a.errs++
			a.lastErr = err
		} else {
			a.ops++
			a.lat = append(a.lat, t1.Sub(t0))
		}
		if !t1.Before(deadline) || ctx.Err() != nil {
			a.elapsed += t1.Sub(start)
			return
		}
	}
}

// --- 2. parallel ---

func (b *bench) runParallel(ctx context.Context) error {
	g := b.cfg.goroutines
	for _, n := range b.cfg.nodes {
		names := b.participants(wPar, n)
		type acc struct {
			ops, errs int64
			cmds      int64
			mallocs   uint64
			elapsed   time.Duration
			perRound  []float64
			lastErr   error
		}
		accs := map[string]*acc{}
		keys := map[string][]*key{}
		for _, name := range names {
			accs[name] = &acc{}
			for i := range g {
				keys[name] = append(keys[name], newKey(fmt.Sprintf("%spar:%s:%d:%d", keyPrefix, name, n, i)))
			}
			l, err := b.lib(name, n)
			if err != nil {
				return err
			}
			parSegment(ctx, l, keys[name], b.cfg.warmup)
		}
		for r := range b.cfg.rounds {
			for _, name := range order(names, r) {
				l, _ := b.lib(name, n)
				segmentGC()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				c0 := l.commands()
				ops, errs, el, lastErr := parSegment(ctx, l, keys[name], b.cfg.seg)
				runtime.ReadMemStats(&m1)
				a := accs[name]
				a.mallocs += m1.Mallocs - m0.Mallocs
				a.cmds += l.commands() - c0
				a.ops += ops
				a.errs += errs
				a.elapsed += el
				a.perRound = append(a.perRound, float64(ops)/el.Seconds())
				if lastErr != nil {
					a.lastErr = lastErr
				}
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
		for _, name := range names {
			a := accs[name]
			res := result{Workload: wPar, Nodes: n, Lib: name, Main: mOpsPerSec, PerRound: a.perRound,
				Metrics: map[string]float64{
					mOps:       float64(a.ops),
					mErrors:    float64(a.errs),
					mOpsPerSec: float64(a.ops) / a.elapsed.Seconds(),
					mCmdsPerOp: float64(a.cmds) / float64(max(a.ops, 1)),
					mAllocs:    float64(a.mallocs) / float64(max(a.ops, 1)),
				}}
			if a.lastErr != nil {
				res.Note = "last error: " + a.lastErr.Error()
			}
			b.add(res)
		}
	}
	return nil
}

// parSegment runs one goroutine per key, each cycling its own key, for d.
func parSegment(ctx context.Context, l lib, keys []*key, d time.Duration) (ops, errs int64, elapsed time.Duration, lastErr error) {
	var stop atomic.Bool
	var nOps, nErrs atomic.Int64
	var errMu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	t := time.AfterFunc(d, func() { stop.Store(true) })
	defer t.Stop()
	for _, k := range keys {
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				if err := l.cycle(ctx, k); err != nil {
					nErrs.Add(1)
					errMu.Lock()
					lastErr = err
					errMu.Unlock()
				} else {
					nOps.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return nOps.Load(), nErrs.Load(), time.Since(start), lastErr
}

// --- 3. contended ---

type contAcc struct {
	acqs, errs, overlaps int64
	elapsed              time.Duration
	handoffs             []time.Duration
	clientCmds           int64
	serverCmds           int64
	perRound             []float64
	lastErr              error
}

func (b *bench) runContended(ctx context.Context) error {
	for _, n := range b.cfg.nodes {
		names := b.participants(wContended, n)
		accs := map[string]*contAcc{}
		keys := map[string]*key{}
		for _, name := range names {
			accs[name] = &contAcc{}
			keys[name] = newKey(fmt.Sprintf("%scont:%s:%d", keyPrefix, name, n))
			l, err := b.lib(name, n)
			if err != nil {
				return err
			}
			if err := b.contSegment(ctx, l, n, keys[name], b.cfg.warmup, &contAcc{}); err != nil {
				return err
			}
		}
		for r := range b.cfg.rounds {
			for _, name := range order(names, r) {
				l, _ := b.lib(name, n)
				segmentGC()
				a := accs[name]
				before := a.acqs
				el := a.elapsed
				if err := b.contSegment(ctx, l, n, keys[name], b.cfg.contSeg, a); err != nil {
					return err
				}
				a.perRound = append(a.perRound, float64(a.acqs-before)/(a.elapsed-el).Seconds())
			}
		}
		for _, name := range names {
			a := accs[name]
			res := result{Workload: wContended, Nodes: n, Lib: name, Main: mAcqPerSec, PerRound: a.perRound,
				Metrics: map[string]float64{
					mAcqs:         float64(a.acqs),
					mErrors:       float64(a.errs),
					mOverlaps:     float64(a.overlaps),
					mAcqPerSec:    float64(a.acqs) / a.elapsed.Seconds(),
					mHandoffP50ms: ms(percentile(a.handoffs, 0.50)),
					mHandoffP99ms: ms(percentile(a.handoffs, 0.99)),
					mClientCmds:   float64(a.clientCmds) / float64(max(a.acqs, 1)),
					mServerCmds:   float64(a.serverCmds) / float64(max(a.acqs, 1)),
				}}
			if a.lastErr != nil {
				res.Note = "last error: " + a.lastErr.Error()
			}
			b.add(res)
		}
	}
	return nil
}

// contSegment runs the contenders on one key for d: each waits for the
// lock with the library's own policy, holds it for the hold time, and
// releases it. A goroutine that has released does not compete again until
// another goroutine has taken the lock, so every acquisition is a handoff
// to a goroutine that was waiting (no barging by the releaser, which would
// find the key free at once while the others sleep). The handoff is the
// time from the moment a holder starts its release to the moment the next
// holder's acquire returns.
func (b *bench) contSegment(ctx context.Context, l lib, n int, k *key, d time.Duration, a *contAcc) error {
	nodes := b.nodes[:n]
	srv0, err := nodes.commandCalls(ctx)
	if err != nil {
		return err
	}
	cli0 := l.commands()
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()

	var holders atomic.Int32
	var relStart atomic.Int64 // UnixNano of the last release start, 0 when taken
	var mu sync.Mutex
	taken := make(chan struct{}) // closed at the next acquisition
	var wg sync.WaitGroup
	start := time.Now()
	for range b.cfg.contenders {
		wg.Go(func() {
			for sctx.Err() == nil {
				rel, err := l.acquire(sctx, k, true)
				now := time.Now()
				if err != nil {
					if sctx.Err() == nil {
						mu.Lock()
						a.errs++
						a.lastErr = err
						mu.Unlock()
					}
					continue
				}
				over := holders.Add(1) > 1
				prev := relStart.Swap(0)
				mu.Lock()
				a.acqs++
				if over {
					a.overlaps++
				}
				if prev != 0 {
					a.handoffs = append(a.handoffs, now.Sub(time.Unix(0, prev)))
				}
				close(taken)
				taken = make(chan struct{})
				next := taken
				mu.Unlock()
				time.Sleep(b.cfg.hold)
				holders.Add(-1)
				relStart.Store(time.Now().UnixNano())
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				if err := rel(rctx); err != nil {
					mu.Lock()
					a.errs++
					a.lastErr = fmt.Errorf("release: %w", err)
					mu.Unlock()
				}
				rcancel()
				select {
				case <-next:
				case <-sctx.Done():
				}
			}
		})
	}
	wg.Wait()
	a.elapsed += time.Since(start)
	a.clientCmds += l.commands() - cli0
	srv1, err := nodes.commandCalls(ctx)
	if err != nil {
		return err
	}
	a.serverCmds += srv1 - srv0
	return nil
}

// --- 4. one node paused ---

func (b *bench) runPaused(ctx context.Context) error {
	for _, n := range b.cfg.pausedNodes {
		victim := b.nodes[n-1]
		if !victim.owned() {
			b.logf("paused: skipped on %d nodes: the nodes were given with -redis, so they cannot be paused", n)
			continue
		}
		names := b.participants(wPaused, n)
		// Fresh clients: the paused node leaves stuck connections behind.
		libs := map[string]lib{}
		type acc struct {
			acq, rel  []time.Duration
			ops, errs int
			perRound  []float64
			lastErr   error
		}
		accs := map[string]*acc{}
		for _, name := range names {
			l, err := newLib(name, b.nodes[:n].addrs())
			if err != nil {
				return err
			}
			defer l.close()
			libs[name] = l
			accs[name] = &acc{}
			seqSegment(ctx, l, newKey(fmt.Sprintf("%spaused-warm:%s:%d", keyPrefix, name, n)), b.cfg.warmup, &seqAcc{})
		}
		b.logf("paused: SIGSTOP %s (node %d of %d)", victim.addr, n, n)
		if err := victim.pause(); err != nil {
			return err
		}
		for r := range b.cfg.pausedRounds {
			for _, name := range order(names, r) {
				l := libs[name]
				a := accs[name]
				k := newKey(fmt.Sprintf("%spaused:%s:%d", keyPrefix, name, n))
				var acq []time.Duration
				start := time.Now()
				for {
					t0 := time.Now()
					rel, err := l.acquire(ctx, k, false)
					t1 := time.Now()
					if err != nil {
						a.errs++
						a.lastErr = err
					} else {
						a.acq = append(a.acq, t1.Sub(t0))
						acq = append(acq, t1.Sub(t0))
						if err := rel(ctx); err != nil {
							a.errs++
							a.lastErr = fmt.Errorf("release: %w", err)
						}
						a.rel = append(a.rel, time.Since(t1))
						a.ops++
					}
					if time.Since(start) >= b.cfg.pausedSeg || ctx.Err() != nil {
						break
					}
				}
				a.perRound = append(a.perRound, ms(percentile(acq, 0.99)))
				b.logf("paused: %d nodes, %s: %d ops in %v", n, name, len(acq), time.Since(start).Round(time.Millisecond))
			}
		}
		if err := victim.resume(ctx); err != nil {
			return err
		}
		for _, name := range names {
			a := accs[name]
			res := result{Workload: wPaused, Nodes: n, Lib: name, Main: mAcqP99ms, PerRound: a.perRound,
				Metrics: map[string]float64{
					mOps:      float64(a.ops),
					mErrors:   float64(a.errs),
					mAcqP50ms: ms(percentile(a.acq, 0.50)),
					mAcqP99ms: ms(percentile(a.acq, 0.99)),
					mRelP50ms: ms(percentile(a.rel, 0.50)),
					mRelP99ms: ms(percentile(a.rel, 0.99)),
				}}
			if a.lastErr != nil {
				res.Note = "last error: " + a.lastErr.Error()
			}
			b.add(res)
		}
	}
	return nil
}

// --- 5. allocations ---

func (b *bench) runAllocs(ctx context.Context) error {
	for _, n := range b.cfg.nodes {
		names := b.participants(wAllocs, n)
		type acc struct {
			ops            int
			mallocs, bytes uint64
			errs           int
		}
		accs := map[string]*acc{}
		for _, name := range names {
			accs[name] = &acc{}
		}
		for r := range b.cfg.rounds {
			for _, name := range order(names, r) {
				l, err := b.lib(name, n)
				if err != nil {
					return err
				}
				k := newKey(fmt.Sprintf("%sallocs:%s:%d", keyPrefix, name, n))
				for range 100 { // warm: connections, scripts, pools
					_ = l.cycle(ctx, k)
				}
				a := accs[name]
				var m0, m1 runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m0)
				for range b.cfg.allocOps {
					if err := l.cycle(ctx, k); err != nil {
						a.errs++
					}
				}
				runtime.ReadMemStats(&m1)
				a.ops += b.cfg.allocOps
				a.mallocs += m1.Mallocs - m0.Mallocs
				a.bytes += m1.TotalAlloc - m0.TotalAlloc
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
		for _, name := range names {
			a := accs[name]
			b.add(result{Workload: wAllocs, Nodes: n, Lib: name, Metrics: map[string]float64{
				mOps:    float64(a.ops),
				mErrors: float64(a.errs),
				mAllocs: float64(a.mallocs) / float64(a.ops),
				mBytes:  float64(a.bytes) / float64(a.ops),
			}})
		}
	}
	return nil
}
