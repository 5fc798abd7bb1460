package faults

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// Restart scenarios: the redis.io page's "delayed restarts". Holder A
// holds a lock on all three nodes; two of them are killed and restarted
// at once, one after the other, while A still holds it; then B tries to
// take the same lock for as long as A holds it.
//
//   - Without persistence and without gating (negative control) the two
//     restarted nodes are empty and grant B a quorum: two holders at once.
//     The checker must see the overlap in every seed.
//   - With restart gating (redlock.WithRestartGating) the restarted nodes
//     refuse to vote (OutcomeGated) until the maximum TTL has passed: 0
//     overlaps, refusals counted.
//   - With appendonly yes + appendfsync always the restarted nodes come back
//     with A's keys and refuse B without any gate: 0 overlaps.

type restartMode int

const (
	restartPlain restartMode = iota
	restartGated
	restartAOF
)

func TestRedisRestartWithoutPersistence(t *testing.T) { testRestart(t, restartPlain) }
func TestRedisRestartGated(t *testing.T)              { testRestart(t, restartGated) }
func TestRedisRestartAppendOnly(t *testing.T)         { testRestart(t, restartAOF) }

func testRestart(t *testing.T, mode restartMode) {
	names := map[restartMode]string{
		restartPlain: "restart without persistence, immediate",
		restartGated: "restart without persistence, restart gating",
		restartAOF:   "restart with appendonly + fsync always",
	}
	sc := newScenario(t, names[mode], "redis", mode == restartPlain)
	const ttl, gate = 2 * time.Second, 2 * time.Second
	var grantsB, gated, held counter
	sc.seeds(2, 20, func(t *testing.T, seed uint64, r *rand.Rand) {
		var opts []redlocktest.Option
		if mode == restartAOF {
			opts = append(opts, redlocktest.WithAppendOnlyFsyncAlways())
		}
		w := newRedisWorld(t, 3, opts...)
		var lopts []redlock.Option
		if mode == restartGated {
			lopts = append(lopts, redlock.WithRestartGating(gate))
		}
		a := newLocks(t, w.clients(), lopts...)
		b := newLocks(t, w.clients(), lopts...)
		ctx := context.Background()
		if mode == restartGated {
			// Brand-new nodes are gated too: arm the markers, wait the gate.
			_, _ = a.TryAcquire(ctx, []string{"arm"}, gate)
			time.Sleep(gate + 100*time.Millisecond)
		}
		h := &History{}
		attempt := time.Now()
		la, err := a.Acquire(ctx, []string{"r"}, ttl)
		if err != nil {
			t.Fatalf("A: %v", err)
		}
		hd := h.Begin("r", "A", attempt, la)
		// A acts, within validity, while B tries.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				hd.Act()
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
		// Let A's acquire calls land on every node first: a call still on
		// its way when its node is killed is retried by go-redis on a new
		// connection, and would write A's key to the restarted node.
		if !waitFor(2*time.Second, func() bool {
			for _, keys := range w.cl.Keys(t) {
				if !slices.Contains(keys, keyPrefix+"r") {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("A's key is not on every node: %q", w.cl.Keys(t))
		}
		time.Sleep(20 * time.Millisecond) // and their replies be read
		restarted := r.Perm(3)[:2]
		for _, i := range restarted {
			w.kill(i)
			w.restart(i)
		}
		sc.add(1, 2, 0)
		// B tries for the rest of A's hold (A holds for half its TTL).
		for time.Now().Before(hd.Start().Add(ttl / 2)) {
			attempt := time.Now()
			lb, err := b.TryAcquire(ctx, []string{"r"}, ttl)
			sc.add(1, 0, 0)
			if err == nil {
				grantsB.Add(1)
				hb := h.Begin("r", "B", attempt, lb)
				hb.Act()
				hb.End()
				_ = lb.Release(ctx)
				break // one overlap is the finding
			}
			var qerr *redlock.QuorumError
			if errors.As(err, &qerr) {
				gated.Add(int64(qerr.Count(redlock.OutcomeGated)))
				held.Add(int64(qerr.Count(redlock.OutcomeHeld)))
			}
			time.Sleep(20 * time.Millisecond)
		}
		close(stop)
		wg.Wait()
		hd.End()
		_ = la.Release(ctx)
		v := sc.checkHistory(t, h)
		if mode == restartPlain {
			if v.Overlaps == 0 {
				t.Errorf("negative control not detected: B never held the lock while A did (%v)", v)
			}
			return
		}
		requireOK(t, v)
	})
	sc.metric("grants to B while A held", "%d", grantsB.Load())
	sc.metric("refusals: gated / held", "%d / %d", gated.Load(), held.Load())
}
