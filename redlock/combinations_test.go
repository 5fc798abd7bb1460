package redlock_test

import (
	"context"
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

// combo is one combination of the features whose layers go into one
// Lock's scripts.
type combo struct {
	gate      bool
	notices   bool
	owner     bool
	fencing   bool
	record    bool
	mark      bool
	oneOrMany int
}

func (k combo) String() string {
	return fmt.Sprintf("gate=%v notices=%v owner=%v fencing=%v record=%v mark=%v n=%d",
		k.gate, k.notices, k.owner, k.fencing, k.record, k.mark, k.oneOrMany)
}

// combos returns every combination the options allow (a record or a
// mark cannot go with an owner).
func combos() []combo {
	var out []combo
	for m := range 1 << 7 {
		k := combo{m&1 != 0, m&2 != 0, m&4 != 0, m&8 != 0, m&16 != 0, m&32 != 0, 1}
		if m&64 != 0 {
			k.oneOrMany = 3
		}
		if k.owner && (k.record || k.mark) {
			continue
		}
		out = append(out, k)
	}
	return out
}

// oddNames are resource names that a key layout must survive.
var oddNames = []string{"a b", "{tag}:x", "ü/ä:released", strings.Repeat("L", 300), "-", "T"}

// TestEveryLayerCombinationRunsClean: for every combination of layers the
// options allow, on one and on three resources with odd names and
// metadata of the maximum size, an acquisition, a rival's refusal, an
// extension, re-entries, releases with a log and an undo leave exactly
// the keys the features keep (counters, gate markers, records, marks,
// the log), with tokens rising.
func TestEveryLayerCombinationRunsClean(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	md := strings.Repeat("x\x00T-_t", redlock.MaxMetadata/6) + strings.Repeat("m", redlock.MaxMetadata%6)
	for i, k := range combos() {
		t.Run(k.String(), func(t *testing.T) {
			runCombo(t, cl, nodes, fmt.Sprintf("c%d:", i), k, md)
		})
	}
}

// comboRun is one combination's run: its Clients, resources and options.
type comboRun struct {
	t      *testing.T
	cl     redlocktest.Cluster
	prefix string
	k      combo
	md     string
	c      *redlock.Client // the holder's
	rival  *redlock.Client
	res    []string
	opts   []redlock.LockOption // the holder's
	ropts  []redlock.LockOption // the rival's
}

// comboMark is the high-water mark of the holder's acquisitions.
const comboMark = 1000

func runCombo(t *testing.T, cl redlocktest.Cluster, nodes []redis.UniversalClient, prefix string, k combo, md string) {
	r := &comboRun{t: t, cl: cl, prefix: prefix, k: k, md: md, res: oddNames[:k.oneOrMany]}
	if k.oneOrMany == 1 {
		r.res = oddNames[2:3]
	}
	// A generous node timeout: this test is about the scripts, and the
	// race detector on a loaded 2-core machine stretches round trips.
	copts := []redlock.Option{redlock.WithKeyPrefix(prefix), redlock.WithReleaseNotices(k.notices),
		redlock.WithNodeTimeout(2 * time.Second)}
	if k.gate {
		copts = append(copts, redlock.WithRestartGating(10*time.Second))
		for _, s := range cl { // the nodes are not new: no gate to wait for
			must(t, s.Client(t).Set(context.Background(), prefix+"\x00restart-gate", "0", 0).Err())
		}
	}
	r.c, r.rival = newClient(t, nodes, copts...), newClient(t, nodes, copts...)
	r.opts = []redlock.LockOption{redlock.WithMetadata(md), redlock.WithFencing(k.fencing)}
	r.ropts = []redlock.LockOption{redlock.WithFencing(k.fencing)}
	if k.owner {
		r.opts = append(r.opts, redlock.WithOwner("owner \x01"))
		r.ropts = append(r.ropts, redlock.WithOwner("rival"))
	}
	if k.record {
		r.opts = append(r.opts, redlock.WithRecord("rec", 5*time.Second))
	}
	if k.mark {
		r.opts = append(r.opts, redlock.WithHighWater("hw", comboMark, 20*time.Second))
	}
	locks := r.hold()
	last := r.releaseAll(locks)
	r.rivalAfter(last)
	r.undo()
}

// rivalRefused fails the test unless the rival's TryAcquire is refused.
func (r *comboRun) rivalRefused(when string) {
	r.t.Helper()
	if _, err := r.rival.TryAcquire(context.Background(), r.res, time.Second, r.ropts...); !errors.Is(err, redlock.ErrNotAcquired) {
		r.t.Fatalf("rival TryAcquire %s = %v, want ErrNotAcquired", when, err)
	}
}

// hold acquires, lets the rival fail (a TryAcquire and an Acquire that
// marks the keys), extends and, for an owner, re-enters; it returns the
// holds.
func (r *comboRun) hold() []*redlock.Lock {
	t, ctx := r.t, context.Background()
	l1, err := r.c.Acquire(ctx, r.res, 3*time.Second, r.opts...)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if (l1.FencingToken() != 0) != r.k.fencing {
		t.Errorf("fencing token %d with fencing %v", l1.FencingToken(), r.k.fencing)
	}
	if got, held, err := r.c.HolderMetadata(ctx, r.res[len(r.res)-1]); err != nil || !held || got != r.md {
		t.Errorf("HolderMetadata = %d bytes, %v, %v; want the metadata", len(got), held, err)
	}
	r.rivalRefused("while held")
	wctx, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
	_, err = r.rival.Acquire(wctx, r.res, time.Second, append(r.ropts, redlock.WithRetry(fastRetry))...)
	cancel()
	if !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("rival Acquire while held = %v, want ErrNotAcquired", err)
	}
	must(t, l1.Extend(ctx, 4*time.Second))
	if !r.k.owner {
		return []*redlock.Lock{l1}
	}
	l2, err := r.c.TryAcquire(ctx, r.res, 2*time.Second, r.opts...)
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	if l2.FencingToken() != l1.FencingToken() {
		t.Errorf("re-entry token %d, want the hold's %d", l2.FencingToken(), l1.FencingToken())
	}
	l3, err := r.c.Acquire(ctx, append([]string{"extra"}, r.res...), 2*time.Second, r.opts...)
	if err != nil {
		t.Fatalf("re-entry with a resource more: %v", err)
	}
	if r.k.fencing && l3.FencingToken() <= l1.FencingToken() {
		t.Errorf("larger re-entry token %d, want above %d", l3.FencingToken(), l1.FencingToken())
	}
	must(t, l2.Extend(ctx, time.Second))
	return []*redlock.Lock{l1, l2, l3}
}

// releaseAll releases the holds, each with a log entry: the rival stays
// out until the last; only the features' keys remain. It returns the
// largest token.
func (r *comboRun) releaseAll(locks []*redlock.Lock) (last uint64) {
	t, ctx := r.t, context.Background()
	for i, l := range locks {
		last = max(last, l.FencingToken())
		if err := l.Release(ctx, redlock.WithReleaseLog("log", 5, 10*time.Second, fmt.Sprint("e", i))); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
		if i < len(locks)-1 {
			r.rivalRefused(fmt.Sprintf("after release %d of %d", i+1, len(locks)))
		}
	}
	waitSettled(t, r.c)
	waitSettled(t, r.rival)
	checkOnlyKept(t, r.cl, r.prefix, r.res, r.k, "after the releases")
	for i, s := range r.cl {
		if n, err := s.Client(t).LLen(ctx, r.prefix+"log").Result(); err != nil || n != int64(len(locks)) {
			t.Errorf("node %d: log length %d (%v), want %d", i, n, err, len(locks))
		}
	}
	return last
}

// rivalAfter: the rival takes the lock now, with a larger token.
func (r *comboRun) rivalAfter(last uint64) {
	ctx := context.Background()
	lr, err := r.rival.Acquire(ctx, r.res, time.Second, r.ropts...)
	if err != nil {
		r.t.Fatalf("rival after the releases: %v", err)
	}
	if r.k.fencing && lr.FencingToken() <= last {
		r.t.Errorf("rival's token %d, want above %d", lr.FencingToken(), last)
	}
	must(r.t, lr.Release(ctx))
	waitSettled(r.t, r.rival)
}

// undo: with a foreign key on the last resource of nodes 1 and 2, node 0
// grants (a new record, a higher mark) and is undone: its keys go, the
// mark is put back.
func (r *comboRun) undo() {
	t, ctx := r.t, context.Background()
	last := r.prefix + r.res[len(r.res)-1]
	for _, s := range r.cl[1:] {
		must(t, s.Client(t).Set(ctx, last, strings.Repeat("f", 32)+"-foreign", 10*time.Second).Err())
	}
	uopts := append([]redlock.LockOption(nil), r.opts...)
	if r.k.record {
		uopts = append(uopts, redlock.WithRecord("rec2", 5*time.Second))
	}
	if r.k.mark {
		uopts = append(uopts, redlock.WithHighWater("hw", comboMark+1, 20*time.Second))
	}
	if _, err := r.c.TryAcquire(ctx, r.res, time.Second, uopts...); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire against a foreign majority = %v, want ErrNotAcquired", err)
	}
	waitSettled(t, r.c)
	for _, s := range r.cl[1:] {
		must(t, s.Client(t).Del(ctx, last).Err())
	}
	checkOnlyKept(t, r.cl, r.prefix, r.res, r.k, "after the undo")
	if !r.k.mark {
		return
	}
	for i, s := range r.cl {
		if m, err := s.Client(t).HGet(ctx, r.prefix+"hw", "m").Result(); err != nil || m != fmt.Sprint(comboMark) {
			t.Errorf("node %d: mark %q (%v) after the undo, want %d", i, m, err, comboMark)
		}
	}
}

// checkOnlyKept fails unless every key under prefix on every node is
// one the features keep after their locks are gone.
func checkOnlyKept(t *testing.T, cl redlocktest.Cluster, prefix string, res []string, k combo, when string) {
	t.Helper()
	kept := map[string]bool{prefix + "log": true}
	if k.gate {
		kept[prefix+"\x00restart-gate"] = true
	}
	if k.record {
		kept[prefix+"rec"] = true
	}
	if k.mark {
		kept[prefix+"hw"] = true
	}
	if k.fencing {
		for _, r := range append([]string{"extra"}, res...) {
			kept[prefix+r+"\x00fencing"] = true
		}
	}
	for i, keys := range cl.Keys(t) {
		for _, key := range keys {
			if strings.HasPrefix(key, prefix) && !kept[key] {
				t.Errorf("node %d keeps %q %s", i, key, when)
			}
		}
	}
}

// grantSeen is one grant of a resource, for the checks of
// TestStressLayersUnderFaults.
type grantSeen struct {
	at    time.Time
	token uint64
	owner string
}

// holdSeen is one live hold of a resource.
type holdSeen struct {
	owner string
	until time.Time
}

type stressChecker struct {
	mu     sync.Mutex
	holds  map[string]map[*redlock.Lock]holdSeen
	grants map[string][]grantSeen
	errs   []string
	n      int // grants seen
}

// granted checks a grant returned at ret for an acquisition that
// started at start.
func (s *stressChecker) granted(l *redlock.Lock, owner string, start, ret time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	tk := l.FencingToken()
	for _, r := range l.Resources() {
		for h, hs := range s.holds[r] {
			if h != l && (hs.owner != owner || owner == "") && ret.Before(hs.until) {
				s.errs = append(s.errs, fmt.Sprintf("%s: owner %q granted at %v while %q holds until %v", r, owner, ret, hs.owner, hs.until))
			}
		}
		for _, g := range s.grants[r] {
			if !g.at.Before(start) || g.owner == owner && owner != "" {
				continue // the promise is across owners (WithOwner)
			}
			if tk <= g.token {
				s.errs = append(s.errs, fmt.Sprintf("%s: owner %q got token %d after %q's %d", r, owner, tk, g.owner, g.token))
			}
		}
		if s.holds[r] == nil {
			s.holds[r] = map[*redlock.Lock]holdSeen{}
		}
		s.holds[r][l] = holdSeen{owner: owner, until: l.Until()}
		s.grants[r] = append(s.grants[r], grantSeen{at: ret, token: tk, owner: owner})
	}
}

// extended checks an extension returned now: the hold's new Until
// must not overlap another owner's hold.
func (s *stressChecker) extended(l *redlock.Lock, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, r := range l.Resources() {
		for h, hs := range s.holds[r] {
			if h != l && (hs.owner != owner || owner == "") && now.Before(hs.until) {
				s.errs = append(s.errs, fmt.Sprintf("%s: owner %q extended at %v while %q holds until %v", r, owner, now, hs.owner, hs.until))
			}
		}
		s.holds[r][l] = holdSeen{owner: owner, until: l.Until()}
	}
}

func (s *stressChecker) releasing(l *redlock.Lock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range l.Resources() {
		delete(s.holds[r], l)
	}
}

// TestStressLayersUnderFaults: workers with fencing, restart gating,
// shared reentrant owners and nested re-entries take random sets of
// resources while nodes are frozen, and killed and restarted empty: no
// two owners hold a resource at once, tokens rise from one owner to the
// next, and no key is left without a TTL but the gate marker.
func TestStressLayersUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("stress")
	}
	cl := redlocktest.Start(t, 3)
	for _, s := range cl { // the nodes are not new: no gate to wait for
		must(t, s.Client(t).Set(context.Background(), "\x00restart-gate", "0", 0).Err())
	}
	chk := &stressChecker{holds: map[string]map[*redlock.Lock]holdSeen{}, grants: map[string][]grantSeen{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		c := newClient(t, cl.Clients(t), redlock.WithRestartGating(stressGate), redlock.WithRetry(fastRetry),
			redlock.WithNodeTimeout(300*time.Millisecond))
		r := rand.New(rand.NewPCG(uint64(w), 32))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					stressCycle(c, r, chk)
				}
			}
		})
	}
	injectFaults(t, cl, 15*time.Second)
	close(stop)
	wg.Wait()
	chk.mu.Lock()
	for _, e := range chk.errs[:min(len(chk.errs), 20)] {
		t.Error(e)
	}
	t.Logf("%d grants", chk.n)
	chk.mu.Unlock()
	for i, s := range cl {
		rdb := s.Client(t)
		for _, k := range s.Keys(t) {
			if d, err := rdb.PTTL(context.Background(), k).Result(); err == nil && d == -1 && k != "\x00restart-gate" {
				t.Errorf("node %d: key %q has no TTL", i, k)
			}
		}
	}
}

// stressGate is the restart gate of TestStressLayersUnderFaults, and its
// locks' TTL.
const stressGate = 1500 * time.Millisecond

// stressCycle takes one random lock (a random owner or none, one to three
// of four resources), maybe re-enters part of it and extends it, and
// releases it, telling chk.
func stressCycle(c *redlock.Client, r *rand.Rand, chk *stressChecker) {
	ctx := context.Background()
	owner := ""
	if r.IntN(2) == 0 {
		owner = fmt.Sprint("o", r.IntN(2))
	}
	var res []string
	for _, i := range r.Perm(4)[:1+r.IntN(3)] {
		res = append(res, fmt.Sprint("r", i))
	}
	opts := []redlock.LockOption{redlock.WithFencing(true)}
	if owner != "" {
		opts = append(opts, redlock.WithOwner(owner))
	}
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	l, err := c.Acquire(actx, res, stressGate, opts...)
	if err != nil {
		return
	}
	chk.granted(l, owner, start, time.Now())
	if owner != "" && r.IntN(3) == 0 {
		start := time.Now()
		if l2, err := c.TryAcquire(ctx, res[:1+r.IntN(len(res))], time.Second, opts...); err == nil {
			chk.granted(l2, owner, start, time.Now())
			chk.releasing(l2)
			_ = l2.Release(ctx)
		}
	}
	time.Sleep(time.Duration(r.IntN(3)) * time.Millisecond)
	if r.IntN(4) == 0 && l.Extend(ctx, stressGate) == nil {
		chk.extended(l, owner)
	}
	chk.releasing(l)
	_ = l.Release(ctx)
}

// injectFaults freezes (SIGSTOP, 50-450 ms) or restarts empty a random
// node of cl now and then, one at a time, for d.
func injectFaults(t *testing.T, cl redlocktest.Cluster, d time.Duration) {
	fr := rand.New(rand.NewPCG(7, 7))
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		s := cl[fr.IntN(len(cl))]
		switch fr.IntN(3) {
		case 0:
			s.Stop(t)
			time.Sleep(time.Duration(50+fr.IntN(400)) * time.Millisecond)
			s.Cont(t)
		case 1:
			s.Restart(t)
		}
		time.Sleep(time.Duration(300+fr.IntN(700)) * time.Millisecond)
	}
}

// TestManyResources: a lock on 2000 resources with every layer of a
// reentrant fenced gated lock acquires, re-enters, extends and releases.
func TestManyResources(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	for _, s := range cl {
		must(t, s.Client(t).Set(ctx, "\x00restart-gate", "0", 0).Err())
	}
	c := newClient(t, cl.Clients(t), redlock.WithRestartGating(10*time.Second), redlock.WithNodeTimeout(2*time.Second))
	var res []string
	for i := range 2000 {
		res = append(res, fmt.Sprint("res-", i))
	}
	opts := []redlock.LockOption{redlock.WithOwner("o"), redlock.WithFencing(true), redlock.WithMetadata(strings.Repeat("m", redlock.MaxMetadata))}
	l1, err := c.Acquire(ctx, res, 5*time.Second, opts...)
	must(t, err)
	l2, err := c.TryAcquire(ctx, res[1000:], 5*time.Second, opts...)
	must(t, err)
	if l2.FencingToken() != l1.FencingToken() {
		t.Errorf("tokens %d, %d", l1.FencingToken(), l2.FencingToken())
	}
	must(t, l1.Extend(ctx, 6*time.Second))
	must(t, l1.Release(ctx))
	if _, err := c.TryAcquire(ctx, res[1999:], time.Second, redlock.WithOwner("p")); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("other owner while l2 holds: %v", err)
	}
	if _, err := c.TryAcquire(ctx, res[:1], time.Second, redlock.WithOwner("p")); err != nil {
		t.Fatalf("other owner on a resource l1 released: %v", err)
	}
	must(t, l2.Release(ctx))
	waitSettled(t, c)
}

// ownerHolds is goroutine g of TestConcurrentHoldsOfOneOwner: 40 holds
// of owner "o" on "r" (and every third time on a resource of its own),
// counted in live while they are held.
func ownerHolds(t *testing.T, c *redlock.Client, g int, live *atomic.Int32) {
	ctx := context.Background()
	for i := range 40 {
		opts := []redlock.LockOption{redlock.WithOwner("o"), redlock.WithFencing(true), redlock.WithRetry(fastRetry)}
		res := []string{"r"}
		if (g+i)%3 == 0 {
			res = append(res, fmt.Sprint("s", g))
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := c.Acquire(actx, res, 3*time.Second, opts...)
		cancel()
		if err != nil {
			t.Errorf("owner o: %v", err)
			return
		}
		live.Add(1)
		if i%4 == 0 {
			_ = l.Extend(ctx, 3*time.Second) // may time out on a loaded machine
		}
		live.Add(-1) // before the Release: the keys go after
		// A release that no quorum confirmed in time (ErrUnavailable)
		// still runs on the nodes; the key check at the end catches any
		// that did not.
		if err := l.Release(ctx); err != nil && !errors.Is(err, redlock.ErrUnavailable) {
			t.Errorf("Release: %v", err)
		}
	}
}

// TestConcurrentHoldsOfOneOwner: many goroutines of one owner take and
// release holds of one resource at once, with fencing and notices, while
// another owner tries: the other owner never gets in while a hold is
// live, and the last release leaves no key but the counter.
func TestConcurrentHoldsOfOneOwner(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
	other := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(2*time.Second))
	var live atomic.Int32
	var bad atomic.Int32
	stop := make(chan struct{})
	var wg, og sync.WaitGroup
	for g := range 8 {
		wg.Go(func() { ownerHolds(t, c, g, &live) })
	}
	for range 2 {
		og.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := other.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithOwner("p"), redlock.WithFencing(true))
				if err == nil {
					if live.Load() > 0 {
						bad.Add(1)
					}
					_ = l.Release(ctx)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	og.Wait()
	if bad.Load() > 0 {
		t.Errorf("the other owner got in %d times while owner o held", bad.Load())
	}
	waitSettled(t, c)
	waitSettled(t, other)
	for i, keys := range cl.Keys(t) {
		for _, k := range keys {
			if !strings.HasSuffix(k, "\x00fencing") {
				t.Errorf("node %d keeps %q", i, k)
			}
		}
	}
}
