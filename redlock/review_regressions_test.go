package redlock_test

// Tests from a peer review of the core (acquire.go, round.go, lock.go,
// client.go): the defects it found, fixed, and two stress runs of
// multi-resource locks under faults, which the model does not explore.

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestSlowShorteningExtendKeepsTheLock: an Extend to a TTL shorter than
// its own round trip is confirmed by every node (each still holds the
// lock, for the old, longer TTL: the nodes never lower a TTL), and Until
// has not passed. It is not extended (an error with the round's
// *QuorumError, no sentinel), and the lock stays held until its unchanged
// Until: the next Extend works. It returned ErrLockLost and marked the
// Lock lost before.
func TestSlowShorteningExtendKeepsTheLock(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := ctxTimeoutProxied(t, cl, 0)
	c := newClient(t, nodes, redlock.WithMinValidity(0))
	ctx := context.Background()
	l, err := c.Acquire(ctx, []string{"r"}, 10*time.Second, redlock.WithNodeTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	for _, p := range proxies {
		p.SetLatency(30 * time.Millisecond) // a round trip of about 60 ms
	}
	defer func() {
		for _, p := range proxies {
			p.Heal()
		}
	}()
	before := l.Until()
	err = l.Extend(ctx, 20*time.Millisecond)
	t.Logf("Extend(20ms) over a 60 ms round trip = %v", err)
	if time.Now().After(before) {
		t.Skip("Until passed during the test (a stalled machine): nothing to conclude")
	}
	var q *redlock.QuorumError
	switch {
	case errors.Is(err, redlock.ErrLockLost):
		t.Errorf("Extend = %v: ErrLockLost while Until was %v ahead and every node still held the lock",
			err, time.Until(before).Round(time.Millisecond))
	case err == nil || !errors.As(err, &q) || errors.Is(err, redlock.ErrUnavailable):
		t.Errorf("Extend = %v, want the round's *QuorumError matching no sentinel", err)
	case l.Until() != before:
		t.Errorf("Until moved from %v to %v", before, l.Until())
	}
	for _, p := range proxies {
		p.Heal()
	}
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Errorf("the next Extend, with Until still %v ahead and the keys on every node, = %v",
			time.Until(before).Round(time.Millisecond), err)
	}
}

// TestReleaseAfterKeepGaveUpNamesTheCause: Keep gives up at
// Until - TTL/10 when its extensions cannot reach a quorum (two of three
// nodes black-holed). A Release then, with the same two nodes still
// unreachable, said the lock "was already lost: an earlier Extend found it
// no longer held (its keys are deleted where they remained)": no Extend
// found it no longer held, and the keys stay on the two nodes it could not
// reach. It now names what happened (Keep gave up) and matches
// ErrUnavailable as well as ErrLockLost.
func TestReleaseAfterKeepGaveUpNamesTheCause(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := ctxTimeoutProxied(t, cl, 0)
	c := newClient(t, nodes)
	ctx := context.Background()
	l, err := c.Acquire(ctx, []string{"r"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := l.Keep(ctx)
	proxies[1].Blackhole(true)
	proxies[2].Blackhole(true)
	defer func() {
		for _, p := range proxies {
			p.Heal()
		}
	}()
	<-kctx.Done()
	lost := stop()
	if !errors.Is(lost, redlock.ErrLockLost) {
		t.Fatalf("stop = %v, want the loss", lost)
	}
	if !time.Now().Before(l.Until()) {
		t.Skip("Until passed before Release (a stalled machine): nothing to conclude")
	}
	err = l.Release(ctx)
	t.Logf("Release = %v", err)
	if err == nil || !strings.Contains(err.Error(), "was already lost (Keep gave up on it: ") {
		t.Errorf("Release = %v, want it to say that Keep gave up on the lock", err)
	}
	if !errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("Release = %v, want it to match ErrUnavailable: 2 of 3 nodes did not answer", err)
	}
	for _, p := range proxies {
		p.Heal()
	}
	waitSettled(t, c)
}

// TestAcquireClosedKeepsTheLastRound: Acquire's doc says its error
// carries "the last round's *QuorumError (errors.As)", and ErrClosed
// "(with no *QuorumError before any round)". An Acquire refused by a
// holder for several rounds and then stopped by Close returned ErrClosed
// without it, so the caller could not see who held the lock.
func TestAcquireClosedKeepsTheLastRound(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	holder, c := newClient(t, cl.Clients(t)), newClient(t, cl.Clients(t))
	ctx := context.Background()
	l, err := holder.Acquire(ctx, []string{"r"}, 10*time.Second, redlock.WithMetadata("the holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	var rounds atomic.Int32
	closed := make(chan struct{})
	policy := func() backoff.BackOff {
		return countingRetry{BackOff: backoff.NewConstantBackOff(20 * time.Millisecond), n: &rounds, hook: func() {
			if rounds.Load() == 3 {
				go func() { closeClient(t, c); close(closed) }()
			}
		}}
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = c.Acquire(actx, []string{"r"}, time.Second, redlock.WithRetry(policy), redlock.WithReleaseNotices(false))
	<-closed
	t.Logf("Acquire after %d failed rounds, then Close = %v", rounds.Load(), err)
	if !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("Acquire = %v, want ErrClosed", err)
	}
	var q *redlock.QuorumError
	if !errors.As(err, &q) {
		t.Fatalf("Acquire = %v: after %d rounds refused by a holder, no *QuorumError of the last round", err, rounds.Load())
	}
	if md, ok := q.HolderMetadata(); !ok || md != "the holder" {
		t.Errorf("the last round's holder = %q, %v; want \"the holder\"", md, ok)
	}
}

// TestMultiResourceExclusionUnderFaults: the model explores locks on one
// resource only (docs/safety.md, "Left out": "locks on several resources
// (compared, not explored)"). Here clients take overlapping sets of
// resources (stressHolds); no two holds of one resource may overlap.
func TestMultiResourceExclusionUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress run")
	}
	n := 0
	for r, hs := range stressHolds(t, func(int) []redlock.LockOption { return nil }) {
		n += len(hs)
		for i := 1; i < len(hs); i++ {
			for j := range i {
				if hs[j].to.After(hs[i].from) && hs[j].from.Before(hs[i].to) {
					t.Errorf("resource %s: client %d held it until %v after client %d acquired it",
						r, hs[j].who, hs[j].to.Sub(hs[i].from), hs[i].who)
				}
			}
		}
	}
	t.Logf("%d holds checked", n)
}

// TestFencedReentrantMultiResourceUnderFaults: as
// TestMultiResourceExclusionUnderFaults, with fencing on every lock and
// clients 0 and 1 sharing an owner (WithOwner): holds of different owners
// never overlap, and of two successive holds of different owners the
// later has the larger token (FencingToken: "strictly increases across
// successive holders").
func TestFencedReentrantMultiResourceUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress run")
	}
	n := 0
	holds := stressHolds(t, func(w int) []redlock.LockOption {
		if w < 2 {
			return []redlock.LockOption{redlock.WithFencing(true), redlock.WithOwner("o1")}
		}
		return []redlock.LockOption{redlock.WithFencing(true)}
	})
	for r, hs := range holds {
		n += len(hs)
		for i := range hs {
			if hs[i].token == 0 {
				t.Errorf("resource %s: client %d held a fenced lock without a token", r, hs[i].who)
			}
			for j := range i {
				if hs[j].who < 2 && hs[i].who < 2 {
					continue // one owner: they may share
				}
				if !hs[j].to.After(hs[i].from) && hs[j].token >= hs[i].token {
					t.Errorf("resource %s: client %d got token %d after client %d held it with token %d",
						r, hs[i].who, hs[i].token, hs[j].who, hs[j].token)
				}
				if hs[j].to.After(hs[i].from) && hs[j].from.Before(hs[i].to) {
					t.Errorf("resource %s: client %d held it until %v after client %d acquired it",
						r, hs[j].who, hs[j].to.Sub(hs[i].from), hs[i].who)
				}
			}
		}
	}
	t.Logf("%d holds checked", n)
}

// stressHold is one hold of a resource in stressHolds: a holder believes
// it holds from Acquire's return until min(Until, the start of its
// Release).
type stressHold struct {
	from, to time.Time
	who      int
	token    uint64
}

// stressHolds has 6 clients take overlapping sets of 3 resources for 8 s,
// by Acquire and TryAcquire (SET NX GET for one resource) with the
// options opts(client), extend them (also to shorter TTLs) and release
// them, each through its own proxies with random latency and black holes;
// it returns each resource's holds, in order of their start.
func stressHolds(t *testing.T, opts func(client int) []redlock.LockOption) map[string][]stressHold {
	cl := redlocktest.Start(t, 3)
	var mu sync.Mutex
	holds := map[string][]stressHold{}
	resources := []string{"a", "b", "c"}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 6 {
		nodes, proxies := ctxTimeoutProxied(t, cl, 0)
		c := newClient(t, nodes, redlock.WithNodeTimeout(60*time.Millisecond), redlock.WithLogger(slog.New(slog.DiscardHandler)))
		rng := rand.New(rand.NewPCG(uint64(w), 7))
		wg.Go(func() {
			defer func() {
				for _, p := range proxies {
					p.Heal()
				}
			}()
			for ctx.Err() == nil {
				for _, p := range proxies {
					switch rng.IntN(10) {
					case 0:
						p.Blackhole(true)
					case 1, 2:
						p.SetLatency(time.Duration(rng.IntN(80)) * time.Millisecond)
					default:
						p.Heal()
					}
				}
				var rs []string
				for _, r := range resources {
					if rng.IntN(2) == 0 {
						rs = append(rs, r)
					}
				}
				if len(rs) == 0 {
					rs = []string{resources[rng.IntN(3)]}
				}
				ttl := time.Duration(150+rng.IntN(300)) * time.Millisecond
				var l *redlock.Lock
				var err error
				if rng.IntN(2) == 0 {
					l, err = c.TryAcquire(ctx, rs, ttl, opts(w)...)
				} else {
					actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
					l, err = c.Acquire(actx, rs, ttl, append(opts(w), redlock.WithRetry(fastRetry))...)
					acancel()
				}
				if err != nil {
					continue
				}
				from := time.Now()
				for range rng.IntN(3) {
					time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
					_ = l.Extend(ctx, time.Duration(50+rng.IntN(400))*time.Millisecond)
				}
				time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
				to := time.Now()
				if u := l.Until(); u.Before(to) {
					to = u
				}
				mu.Lock()
				for _, r := range rs {
					holds[r] = append(holds[r], stressHold{from, to, w, l.FencingToken()})
				}
				mu.Unlock()
				_ = l.Release(context.Background())
			}
		})
	}
	wg.Wait()
	for _, hs := range holds {
		slices.SortFunc(hs, func(x, y stressHold) int { return x.from.Compare(y.from) })
	}
	return holds
}
