package redlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

func TestReentrantHoldsCount(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithFencing(true))
	ctx := context.Background()
	a := redlock.WithOwner("owner-a")
	var holds []*redlock.Lock
	for i := range 3 {
		l, err := c.TryAcquire(ctx, []string{"r"}, 5*time.Second, a)
		if err != nil {
			t.Fatalf("acquisition %d by owner A: %v", i+1, err)
		}
		holds = append(holds, l)
	}
	if t0, t2 := holds[0].FencingToken(), holds[2].FencingToken(); t0 == 0 || t0 != t2 {
		t.Errorf("fencing tokens %d then %d: want the same non-zero token on reentry", t0, t2)
	}
	b := redlock.WithOwner("owner-b")
	for i, l := range holds[:2] {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i+1, err)
		}
		if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second, b); !errors.Is(err, redlock.ErrNotAcquired) {
			t.Fatalf("owner B after %d of 3 releases = %v, want ErrNotAcquired", i+1, err)
		}
	}
	if err := holds[2].Release(ctx); err != nil {
		t.Fatalf("last release: %v", err)
	}
	lb, err := c.TryAcquire(ctx, []string{"r"}, time.Second, b)
	if err != nil {
		t.Fatalf("owner B after A's last release: %v", err)
	}
	if lb.FencingToken() <= holds[0].FencingToken() {
		t.Errorf("B's token %d does not exceed A's %d", lb.FencingToken(), holds[0].FencingToken())
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	for i, keys := range cl.Keys(t) {
		for _, k := range keys {
			if k != "r\x00fencing" {
				t.Errorf("node %d keeps %q after every hold was released", i, k)
			}
		}
	}
}

func TestReentryNeverShortensTheTTL(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	long, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second, redlock.WithOwner("o"))
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithOwner("o"))
	if err != nil {
		t.Fatal(err)
	}
	if err := short.Extend(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	// A node that the first TryAcquire did not wait for (a loaded machine:
	// its call may come after the round, or never) may lack the key, or
	// have it from the extension's regain, with its TTL: a quorum keeps
	// the first hold's.
	kept, ttls := 0, make([]time.Duration, len(cl))
	for i, s := range cl {
		if ttls[i] = s.Client(t).PTTL(ctx, "r").Val(); ttls[i] >= 5*time.Second {
			kept++
		}
	}
	if kept < c.Quorum() {
		t.Errorf("PTTLs %v after a shorter reentry and extension: want the first hold's 10s kept on a quorum", ttls)
	}
	_ = short.Release(ctx)
	_ = long.Release(ctx)
}

func TestEmptyOwnerIsRejected(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	c := newClient(t, cl.Clients(t))
	if _, err := c.TryAcquire(context.Background(), []string{"r"}, time.Second, redlock.WithOwner("")); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("WithOwner(\"\") = %v, want ErrInvalidArgument", err)
	}
}

// TestReentrantFencedGatedLock: every option that adds keys to a lock at
// once (holds hashes, fencing counters, the gate marker), on real servers.
func TestReentrantFencedGatedLock(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	const gate = 500 * time.Millisecond
	c := newClient(t, cl.Clients(t), redlock.WithFencing(true), redlock.WithRestartGating(gate))
	ctx := context.Background()
	_, _ = c.TryAcquire(ctx, []string{"arm"}, gate)
	time.Sleep(gate + 100*time.Millisecond)
	owner := redlock.WithOwner("o")
	first, err := c.TryAcquire(ctx, []string{"a"}, gate, owner)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.TryAcquire(ctx, []string{"a"}, gate, owner)
	if err != nil {
		t.Fatalf("reentry: %v", err)
	}
	if first.FencingToken() != again.FencingToken() || first.FencingToken() == 0 {
		t.Errorf("tokens %d and %d, want the same non-zero token", first.FencingToken(), again.FencingToken())
	}
	for i, s := range cl {
		for _, k := range s.Keys(t) {
			if k == "\x00restart-gate" {
				continue
			}
			switch k {
			case "a", "a\x00holds", "a\x00fencing", "arm\x00fencing":
			default:
				t.Errorf("node %d has unexpected key %q", i, k)
			}
		}
	}
	if err := again.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStaleReentrantHoldGetsANewToken: a hold whose release did not reach
// one node stays there until its TTL. Another owner then takes the lock
// (its fence must not note its token in that stale hold), and the first
// owner's next acquisition finds its stale hold on that node only (here
// one of the two nodes that answer): it is a new hold, not a re-entry, and
// its fencing token exceeds the other owner's (a re-entry would reuse the
// stale token, or the other owner's).
func TestStaleReentrantHoldGetsANewToken(t *testing.T) {
	cl, nodes, c, a, a1 := fencedHold(t)
	ctx, z := context.Background(), redlock.WithOwner("owner-z")
	// Node 2's copy of a1's hold, put back after its release: a release
	// that did not reach node 2 (or ran there out of order).
	stale := map[string]string{}
	for _, k := range []string{"r", "r\x00holds"} {
		v, err := nodes[2].Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("DUMP %s on node 2: %v", k, err)
		}
		stale[k] = v
	}
	if err := a1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	for k, v := range stale {
		if err := nodes[2].Restore(ctx, k, time.Minute, v).Err(); err != nil {
			t.Fatalf("RESTORE %s on node 2: %v", k, err)
		}
	}
	lz, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, z) // nodes 0 and 1
	if err != nil {
		t.Fatal(err)
	}
	if err := lz.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	// Node 0 stopped: the quorum is nodes 1 (fresh) and 2 (the stale hold).
	cl[0].Stop(t)
	a2, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a)
	cl[0].Cont(t)
	if err != nil {
		t.Fatal(err)
	}
	if a2.FencingToken() <= lz.FencingToken() {
		t.Errorf("owner A's token %d after owner Z's %d (A's stale hold had %d): want it larger", a2.FencingToken(), lz.FencingToken(), a1.FencingToken())
	}
	if err := a2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNestedHoldKeepsItsTokenWithAStoppedNode: a nested hold whose grants
// come from one node that reports the owner's hold and one that lost it
// (here the third node is stopped) is a re-entry all the same: no other
// owner has recorded a larger token, so it keeps the outer hold's token,
// and the outer hold's writes stay valid.
func TestNestedHoldKeepsItsTokenWithAStoppedNode(t *testing.T) {
	cl, nodes, c, a, a1 := fencedHold(t)
	ctx := context.Background()
	// Node 0 loses the hold (its fencing counter stays); node 1 stops.
	if err := nodes[0].Del(ctx, "r", "r\x00holds").Err(); err != nil {
		t.Fatal(err)
	}
	cl[1].Stop(t)
	a2, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a)
	cl[1].Cont(t)
	if err != nil {
		t.Fatal(err)
	}
	if a2.FencingToken() != a1.FencingToken() {
		t.Errorf("nested hold's token %d, outer hold's %d: want the same", a2.FencingToken(), a1.FencingToken())
	}
	for _, l := range []*redlock.Lock{a2, a1} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedFenceLeavesNoToken: a new reentrant hold whose record round
// reaches only a minority fails and is undone, and its token, handed to
// nobody, must not become the token of the owner's next re-entry: every
// token handed out is recorded on a majority. (The record round noted its
// token in the holds before it knew it had a majority; now the holds get
// it only after.)
func TestFailedFenceLeavesNoToken(t *testing.T) {
	cl, nodes, c, a, a1 := fencedHold(t)
	ctx := context.Background()
	failing := newRejectHook(func(a []any) bool { return len(a) > 3 && a[3] == "r\x00fencing" }, errors.New("injected failure"))
	failing.on.Store(false)
	for _, rdb := range nodes[1:] {
		rdb.(*redis.Client).AddHook(failing)
	}
	// Counters above the outer hold's token on nodes 0 and 1 (a device:
	// every quorum then sees one) make A's next acquisition a new hold,
	// whose record round fails on nodes 1 and 2.
	for _, rdb := range nodes[:2] {
		if err := rdb.Set(ctx, "r\x00fencing", a1.FencingToken()+5, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	failing.on.Store(true)
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("acquisition whose record round reached one node: %v, want ErrNotAcquired", err)
	}
	failing.on.Store(false)
	waitSettled(t, c)
	// Node 1 stopped: node 0, where the failed round recorded its token,
	// is one of the two that answer.
	cl[1].Stop(t)
	a3, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a)
	cl[1].Cont(t)
	if err != nil {
		t.Fatal(err)
	}
	recorded := 0
	for _, rdb := range nodes {
		if n, _ := rdb.Get(ctx, "r\x00fencing").Uint64(); n >= a3.FencingToken() {
			recorded++
		}
	}
	// (Token 6 again is fine: the failed round handed it to nobody.)
	if recorded < 2 {
		t.Errorf("token %d is recorded on %d of 3 nodes, want a majority (the outer hold had %d)", a3.FencingToken(), recorded, a1.FencingToken())
	}
	for _, l := range []*redlock.Lock{a3, a1} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// fencedHold starts 3 nodes and a Client with fencing (and opts), and returns them
// with owner A's option and A's settled hold of "r".
func fencedHold(t *testing.T, opts ...redlock.Option) (redlocktest.Cluster, []redis.UniversalClient, *redlock.Client, redlock.LockOption, *redlock.Lock) {
	t.Helper()
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, nodes, append(opts, redlock.WithFencing(true))...)
	a := redlock.WithOwner("owner-a")
	a1, err := c.TryAcquire(context.Background(), []string{"r"}, time.Minute, a)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	return cl, nodes, c, a, a1
}

// TestReentryCheckedAfterItsGrants: a re-entry that would keep its
// owner's token is checked after its grants. Here node 0 reports the
// owner's hold before another owner, P, records token 2 on nodes 0 and 1
// (P's hold overlapping the round), and node 2 grants after that: no node
// of the round shows P's token, yet the re-entry must not keep token 1
// after P's 2. The check round sees P's counters and makes it a new hold.
func TestReentryCheckedAfterItsGrants(t *testing.T) {
	// A generous node timeout: node 2's answer waits for node 0's.
	cl, nodes, c, a, a1 := fencedHold(t, redlock.WithNodeTimeout(2*time.Second))
	p := a1.FencingToken() + 1 // P's token
	ctx := context.Background()
	direct := cl.Clients(t)
	// The owner's hold stays on node 0 only; P holds r on node 1.
	for _, rdb := range direct[1:] {
		if err := rdb.Del(ctx, "r", "r\x00holds").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := direct[1].Set(ctx, "r", "ppppppppppppppppppppppppppppppppTp", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	isAcquire := func(a []any) bool { return len(a) > 3 && a[0] == "evalsha" && a[3] == "r" }
	answered := make(chan struct{})
	var once, recorded sync.Once
	nodes[0].(*redis.Client).AddHook(afterHook{match: isAcquire, fn: func() { once.Do(func() { close(answered) }) }})
	nodes[2].(*redis.Client).AddHook(beforeHook{match: isAcquire, fn: func() {
		recorded.Do(func() {
			select {
			case <-answered:
			case <-time.After(5 * time.Second):
				t.Error("node 0 never answered the re-entry")
			}
			for _, rdb := range direct[:2] { // P records its token
				if err := rdb.Set(ctx, "r\x00fencing", p, time.Minute).Err(); err != nil {
					t.Error(err)
				}
			}
		})
	}})
	a2, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a)
	if err != nil {
		t.Fatal(err)
	}
	if a2.FencingToken() <= p {
		t.Errorf("re-entry's token %d after P's %d (recorded on nodes 0 and 1 during the round): want it larger", a2.FencingToken(), p)
	}
}

// afterHook and beforeHook are go-redis hooks that call fn after (before)
// a command or pipeline with a command whose arguments match.
type afterHook struct {
	match func(args []any) bool
	fn    func()
}

func (h afterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.match(cmd.Args()) {
			h.fn()
		}
		return err
	}
}

func (h afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return h.match(c.Args()) }) {
			h.fn()
		}
		return err
	}
}

type beforeHook afterHook

func (h beforeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd.Args()) {
			h.fn()
		}
		return next(ctx, cmd)
	}
}

func (h beforeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return h.match(c.Args()) }) {
			h.fn()
		}
		return next(ctx, cmds)
	}
}

// TestUncheckedReentryFails: a re-entry whose check round a majority
// does not answer fails (and may be retried) instead of becoming a new
// hold, whose new token would fence off the outer hold's writes.
func TestUncheckedReentryFails(t *testing.T) {
	_, nodes, c, a, a1 := fencedHold(t)
	ctx := context.Background()
	failing := newRejectHook(func(a []any) bool { return len(a) > 3 && a[3] == "r\x00fencing" }, errors.New("injected failure"))
	for _, rdb := range nodes[1:] {
		rdb.(*redis.Client).AddHook(failing)
	}
	_, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a)
	var qerr *redlock.QuorumError
	if !errors.As(err, &qerr) || qerr.Op != "check" || !errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("re-entry whose check reached one node: %v, want a check round's *QuorumError matching ErrUnavailable", err)
	}
	failing.on.Store(false)
	waitSettled(t, c)
	a2, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, a)
	if err != nil {
		t.Fatal(err)
	}
	if a2.FencingToken() != a1.FencingToken() {
		t.Errorf("re-entry's token %d, outer hold's %d: want the same", a2.FencingToken(), a1.FencingToken())
	}
}

// TestReentryWithMoreResourcesGetsANewToken: a re-entry that adds a
// resource is a new hold with a larger token (one token covers every
// resource of a lock, and the added resource's counter may be above the
// outer hold's token); a re-entry of resources already held keeps the
// token. docs/fencing.md and WithOwner say so.
func TestReentryWithMoreResourcesGetsANewToken(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t), redlock.WithFencing(true))
	ctx := context.Background()
	owner := redlock.WithOwner("o")
	outer, err := c.TryAcquire(ctx, []string{"a"}, 10*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	same, err := c.TryAcquire(ctx, []string{"a"}, 10*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	wider, err := c.TryAcquire(ctx, []string{"a", "b"}, 10*time.Second, owner)
	if err != nil {
		t.Fatal(err)
	}
	if same.FencingToken() != outer.FencingToken() {
		t.Errorf("re-entry of {a}: token %d, want the outer hold's %d", same.FencingToken(), outer.FencingToken())
	}
	if wider.FencingToken() <= outer.FencingToken() {
		t.Errorf("re-entry of {a, b}: token %d, want above the outer hold's %d", wider.FencingToken(), outer.FencingToken())
	}
	for _, l := range []*redlock.Lock{wider, same, outer} {
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release %q: %v", l.Resources(), err)
		}
	}
}

// TestExpiredHoldReleaseIsLost: a reentrant Lock whose hold expired, when
// its owner holds the resources again by another acquisition, did not
// hold them throughout: its Release reports ErrLockLost (it returned nil:
// the owner token matched, and the other hold kept the keys), and it
// leaves the other acquisition's hold alone.
func TestExpiredHoldReleaseIsLost(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	a := redlock.WithOwner("owner-a")
	old, err := c.TryAcquire(ctx, []string{"r"}, 200*time.Millisecond, a)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the keys and the holds expire
	now, err := c.TryAcquire(ctx, []string{"r"}, 10*time.Second, a)
	if err != nil {
		t.Fatalf("owner A again after its hold expired: %v", err)
	}
	if err := old.Release(ctx); !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Release of the expired hold = %v, want ErrLockLost", err)
	}
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithOwner("owner-b")); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("owner B after the expired hold's Release = %v, want ErrNotAcquired: the new hold must stay", err)
	}
	if err := now.Release(ctx); err != nil {
		t.Fatalf("Release of the live hold: %v", err)
	}
	waitSettled(t, c)
	for i, keys := range cl.Keys(t) {
		if len(keys) > 0 {
			t.Errorf("node %d keeps %q after both Releases", i, keys)
		}
	}
}
