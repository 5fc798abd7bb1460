package redlock_test

// Regression tests for issue 29: no node stalled by a cleanup, locks that
// regain fault tolerance, Keep and Extend that agree, and answers a faulty
// node cannot fake. Each runs against real redis-server nodes.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestLongNamesAreCutInErrorTexts: an error text quotes at most the first
// bytes of a name and gives its length (a refused acquisition of a 1 MiB
// resource name returned a 1 MiB text).
func TestLongNamesAreCutInErrorTexts(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	a, b := newClient(t, cl.Clients(t)), newClient(t, cl.Clients(t))
	ctx := context.Background()
	long := strings.Repeat("x", 1<<20)
	l, err := a.TryAcquire(ctx, []string{long}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	const limit = 2048
	_, err = b.TryAcquire(ctx, []string{long, "y"}, 10*time.Second)
	errs := map[string]error{"refused TryAcquire": err}
	_, errs["NUL in a long name"] = b.TryAcquire(ctx, []string{long + "\x00"}, time.Second)
	_, errs["a long name twice"] = b.TryAcquire(ctx, []string{long, long}, time.Second)
	_, errs["a long key prefix with a NUL"] = redlock.New(cl.Clients(t), redlock.WithKeyPrefix(long+"\x00"))
	for what, err := range errs {
		switch {
		case err == nil:
			t.Errorf("%s: no error", what)
		case len(err.Error()) > limit:
			t.Errorf("%s: error text of %d bytes, want at most %d", what, len(err.Error()), limit)
		case !strings.Contains(err.Error(), `"`+strings.Repeat("x", 64)+`"... (1048576 bytes)`) &&
			!strings.Contains(err.Error(), "(1048577 bytes)"):
			t.Errorf("%s reads %.300q, want the name's first 64 bytes quoted and its length", what, err)
		}
	}
	if !errors.Is(errs["refused TryAcquire"], redlock.ErrNotAcquired) {
		t.Errorf("refused TryAcquire = %.200v, want ErrNotAcquired", errs["refused TryAcquire"])
	}
}

// fakeReplies is a go-redis hook that stands for a faulty proxy in front
// of a node: the node runs every command, and the hook replaces the
// reply of each script and SET with reply (nil: a nil reply).
type fakeReplies struct {
	reply any
	off   atomic.Bool // replies pass unchanged
}

func (h *fakeReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *fakeReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		_ = next(ctx, cmd)
		return h.fake(cmd)
	}
}

func (h *fakeReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		_ = next(ctx, cmds)
		var first error
		for _, cmd := range cmds {
			if err := h.fake(cmd); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
}

// fake replaces cmd's reply if it is a script or a SET.
func (h *fakeReplies) fake(cmd redis.Cmder) error {
	c, ok := cmd.(*redis.Cmd)
	if h.off.Load() {
		return cmd.Err()
	}
	if name := strings.ToLower(fmt.Sprint(cmd.Args()[0])); !ok || (name != "eval" && name != "evalsha" && name != "set") {
		return cmd.Err()
	}
	c.SetVal(h.reply)
	c.SetErr(nil)
	if h.reply == nil {
		c.SetErr(redis.Nil)
	}
	return c.Err()
}

// fakedClient returns a client of s whose script and SET replies are
// reply.
func fakedClient(t *testing.T, addr string, reply any) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	rdb.AddHook(&fakeReplies{reply: reply})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestRepliesRedisNeverSendsAreNodeErrors: a reply outside a command's
// contract is the node's error on every path, never a grant, a
// confirmation or a refusal: nil to the acquire script counted as a grant
// (as SET NX GET's nil does), and integers out of range as refusals.
func TestRepliesRedisNeverSendsAreNodeErrors(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	ctx := context.Background()
	tok := strings.Repeat("0", 32) + "-"
	for _, reply := range []any{nil, "OK", tok, int64(1), int64(7), []any{}, []any{int64(1), "x"}, []any{int64(0)},
		[]any{int64(0), "v", int64(10), int64(5)}, []any{int64(2)}, []any{int64(9)}} {
		c := newClient(t, []redis.UniversalClient{fakedClient(t, cl[0].Addr(), reply)})
		paths := map[string]func() error{
			"Acquire (the script)": func() error {
				_, err := c.TryAcquire(ctx, []string{"a", "b"}, time.Minute)
				return err
			},
			"Acquire with fencing": func() error {
				_, err := c.TryAcquire(ctx, []string{"f"}, time.Minute, redlock.WithFencing(true))
				return err
			},
		}
		if _, value := reply.(string); reply != nil && !value { // nil (set) and values (held) are SET NX GET's
			paths["TryAcquire (SET NX GET)"] = func() error {
				_, err := c.TryAcquire(ctx, []string{"s"}, time.Minute)
				return err
			}
		}
		for what, try := range paths {
			err := try()
			var q *redlock.QuorumError
			switch {
			case err == nil:
				t.Errorf("reply %#v: %s granted", reply, what)
			case !errors.As(err, &q) || q.Nodes[0].Outcome != redlock.OutcomeError:
				t.Errorf("reply %#v: %s = %v, want the node's OutcomeError", reply, what, err)
			}
		}
	}

	// Extend and Release, of a lock granted before the replies went bad.
	for _, reply := range []any{nil, "OK", int64(2), int64(-1), []any{int64(1)}} {
		h := &fakeReplies{reply: reply}
		h.off.Store(true)
		rdb := redis.NewClient(&redis.Options{Addr: cl[0].Addr()})
		rdb.AddHook(h)
		t.Cleanup(func() { _ = rdb.Close() })
		c := newClient(t, []redis.UniversalClient{rdb})
		l, err := c.TryAcquire(ctx, []string{"e"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		h.off.Store(false)
		for what, err := range map[string]error{"Extend": l.Extend(ctx, time.Minute), "Release": l.Release(ctx)} {
			var q *redlock.QuorumError
			switch {
			case err == nil || errors.Is(err, redlock.ErrLockLost):
				t.Errorf("reply %#v: %s = %v, want the node's error", reply, what, err)
			case !errors.As(err, &q) || q.Nodes[0].Outcome != redlock.OutcomeError:
				t.Errorf("reply %#v: %s = %v, want the node's OutcomeError", reply, what, err)
			}
		}
		h.off.Store(true)
		_ = rdb.Del(ctx, "e")
	}
}

// TestNilAnsweringNodeGivesNoSecondHolder: one node behind a faulty proxy
// that answers nil to every script, and one partitioned link per Client:
// counting the nil as a grant gave both Clients the lock at once.
func TestNilAnsweringNodeGivesNoSecondHolder(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	clients := func(cut int) []redis.UniversalClient {
		nodes, proxies := ctxTimeoutProxied(t, cl, 0)
		nodes[0].(*redis.Client).AddHook(&fakeReplies{})
		proxies[cut].Blackhole(true)
		return nodes
	}
	a, b := newClient(t, clients(2)), newClient(t, clients(1))
	once := redlock.WithRetry(func() backoff.BackOff { return &backoff.StopBackOff{} })
	la, errA := a.Acquire(ctx, []string{"r"}, time.Minute, once)
	lb, errB := b.Acquire(ctx, []string{"r"}, time.Minute, once)
	if errA == nil && errB == nil {
		t.Fatalf("both Clients hold r (Until %v and %v away)", time.Until(la.Until()), time.Until(lb.Until()))
	}
	if errA == nil {
		t.Errorf("Client a holds r with one real grant: node 0's nil counted")
	}
}

// ctxTimeoutProxied returns a client per server of cl through a proxy
// each, with ContextTimeoutEnabled and readTimeout, and the proxies.
func ctxTimeoutProxied(t *testing.T, cl redlocktest.Cluster, readTimeout time.Duration) ([]redis.UniversalClient, []*redlocktest.Proxy) {
	t.Helper()
	var nodes []redis.UniversalClient
	var proxies []*redlocktest.Proxy
	for _, s := range cl {
		p := redlocktest.NewProxy(t, s.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, ReadTimeout: readTimeout})
		t.Cleanup(func() { _ = rdb.Close() })
		nodes, proxies = append(nodes, rdb), append(proxies, p)
	}
	return nodes, proxies
}

// TestCleanupInABlackHoleStallsNoNode: a Release sent into a 200 ms black
// hole on 2 of 3 links held those nodes' later calls until go-redis's read
// timeout (here 10 s), even with ContextTimeoutEnabled: cleanups had no
// deadline. Every lock of the Client failed meanwhile. Now a cleanup
// waits at most the node timeout for its reply once sent, and the nodes
// take new locks about a node timeout after the links heal.
func TestCleanupInABlackHoleStallsNoNode(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := ctxTimeoutProxied(t, cl, 10*time.Second)
	c := newClient(t, nodes)
	ctx := context.Background()
	for _, op := range []string{"release", "undo"} {
		t.Run(op, func(t *testing.T) {
			l, err := c.Acquire(ctx, []string{op}, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			proxies[0].Blackhole(true)
			proxies[1].Blackhole(true)
			if op == "release" {
				_ = l.Release(ctx) // fails: 2 nodes in the black hole
			} else {
				// A failed attempt (the lock is held): its undo goes out.
				_, _ = c.TryAcquire(ctx, []string{op, op + "2"}, time.Second)
			}
			time.Sleep(200 * time.Millisecond)
			proxies[0].Blackhole(false)
			proxies[1].Blackhole(false)
			healed := time.Now()
			for {
				l2, err := c.TryAcquire(ctx, []string{op + "-after"}, time.Second)
				if err == nil {
					_ = l2.Release(ctx)
					break
				}
				if time.Since(healed) > 20*time.Second {
					t.Fatalf("no lock 20s after the links healed: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			stall := time.Since(healed)
			t.Logf("first lock %v after the links healed (node timeout %v)", stall.Round(time.Millisecond), c.NodeTimeout())
			if stall > 3*time.Second {
				t.Errorf("first lock %v after the links healed, want about the node timeout %v (well under go-redis's 10s read timeout)",
					stall.Round(time.Millisecond), c.NodeTimeout())
			}
			if op == "release" {
				return
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release after the links healed: %v", err)
			}
		})
	}
}

// TestKeepUsesTheHoldersLastExtend: Keep's extension that fires while an
// Extend of the holder's is in its round waits behind it and then
// extends by the TTL the holder set, not the one it read before (it ran
// after the holder's Extend with the old TTL, and TTL() read the long
// value again). Slow links make every round overlap Keep's 10 ms period.
func TestKeepUsesTheHoldersLastExtend(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := ctxTimeoutProxied(t, cl, 0)
	for _, p := range proxies {
		p.SetLatency(10 * time.Millisecond)
	}
	c := newClient(t, nodes, redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	const long, short = 6 * time.Second, 2 * time.Second
	l, err := c.Acquire(ctx, []string{"r"}, long)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	kctx, stop := l.Keep(ctx, redlock.ExtendEvery(10*time.Millisecond))
	defer stop()
	for i := range 10 {
		if err := l.Extend(ctx, long); err != nil {
			t.Fatalf("try %d: Extend(%v): %v", i, long, err)
		}
		if err := l.Extend(ctx, short); err != nil {
			t.Fatalf("try %d: Extend(%v): %v", i, short, err)
		}
		time.Sleep(150 * time.Millisecond) // several of Keep's extensions
		if got := l.TTL(); got != short {
			t.Fatalf("try %d: TTL() = %v after the holder's Extend(%v) and Keep's extensions, want %v", i, got, short, short)
		}
		if left := time.Until(l.Until()); left > short {
			t.Fatalf("try %d: Until is %v away after the holder's Extend(%v)", i, left.Round(time.Millisecond), short)
		}
	}
	if kctx.Err() != nil {
		t.Errorf("kept context ended: %v", context.Cause(kctx))
	}
}

// TestShorteningExtendIsPlainAndReleaseOfLiveKeysIsNil: Extend to a
// shorter TTL moves Until and TTL() but cannot shorten the keys, which
// expire within the longest TTL after the last extend (doc.go); a Release
// after the short Until that still deletes the live keys on a quorum
// returns nil (it returned ErrLockLost).
func TestShorteningExtendIsPlainAndReleaseOfLiveKeysIsNil(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	c := newClient(t, cl.Clients(t))
	ctx := context.Background()
	const long, short = 6 * time.Second, 500 * time.Millisecond
	l, err := c.Acquire(ctx, []string{"r"}, long)
	if err != nil {
		t.Fatal(err)
	}
	extended := time.Now()
	if err := l.Extend(ctx, short); err != nil {
		t.Fatal(err)
	}
	if got, left := l.TTL(), time.Until(l.Until()); got != short || left > short {
		t.Errorf("after Extend(%v): TTL() = %v, Until %v away; want %v and at most that", short, got, left, short)
	}
	waitSettled(t, c)
	for i, at := range nodesExpiry(t, cl, "r") {
		if limit := extended.Add(long + 100*time.Millisecond); at.After(limit) {
			t.Errorf("node %d: key expires %v after the Extend, want within the longest TTL %v", i, at.Sub(extended), long)
		}
	}
	time.Sleep(short + 100*time.Millisecond)
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release of keys still live on every node after Until = %v, want nil", err)
	}
	if n := totalKeys(t, cl); n != 0 {
		t.Errorf("%d keys left after Release", n)
	}
}

// TestReleaseThatCouldNotRunIsNotNil: a node whose user may SET but not
// EVAL answers the release with NOPERM. Release returned nil once the two
// other nodes (400 ms slower here, so the NOPERM comes first) had deleted their
// keys, while the first node kept its key for its TTL. Now it names that
// node and says how long the key may stay; with every node refusing, the
// error says so too.
func TestReleaseThatCouldNotRunIsNotNil(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	for _, s := range cl {
		if err := s.Client(t).Do(ctx, "ACL", "SETUSER", "noeval", "reset", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha").Err(); err != nil {
			t.Fatal(err)
		}
	}
	noEval := func(addr string) redis.UniversalClient {
		rdb := redis.NewClient(&redis.Options{Addr: addr, Username: "noeval", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	nodes, proxies := ctxTimeoutProxied(t, cl, 0)
	proxies[1].SetLatency(200 * time.Millisecond)
	proxies[2].SetLatency(200 * time.Millisecond)
	nodes[0] = noEval(cl[0].Addr())
	c := newClient(t, nodes, redlock.WithNodeTimeout(2*time.Second))
	l, err := c.TryAcquire(ctx, []string{"r"}, time.Minute) // SET NX GET: allowed
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	err = l.Release(ctx)
	var q *redlock.QuorumError
	switch {
	case err == nil:
		t.Fatalf("Release = nil with node 0 answering NOPERM (node 0 keys: %q)", cl[0].Keys(t))
	case !errors.As(err, &q) || q.Nodes[0].Outcome != redlock.OutcomeError:
		t.Errorf("Release = %v, want a *QuorumError with node 0's error", err)
	case !strings.Contains(err.Error(), cl[0].Addr()+", where the release could not run") || !regexp.MustCompile(`its keys stay there until their TTL runs out, at most (1m)?[0-9.]+s from now`).MatchString(err.Error()):
		t.Errorf("Release reads %q, want it to name node 0 and how long its key may stay", err)
	}
	if errors.Is(err, redlock.ErrLockLost) || errors.Is(err, redlock.ErrUnavailable) {
		t.Errorf("Release = %v: released on a quorum, want neither ErrLockLost nor ErrUnavailable", err)
	}

	all := newClient(t, []redis.UniversalClient{noEval(cl[0].Addr()), noEval(cl[1].Addr()), noEval(cl[2].Addr())})
	l, err = all.TryAcquire(ctx, []string{"s"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	err = l.Release(ctx)
	// NOPERM is the operator's to fix (issue 30): ErrMisconfigured, not
	// an outage.
	if !errors.Is(err, redlock.ErrMisconfigured) || errors.Is(err, redlock.ErrUnavailable) ||
		!strings.Contains(err.Error(), "its keys stay until their TTL runs out, at most") {
		t.Errorf("Release with every node answering NOPERM = %v, want ErrMisconfigured (not ErrUnavailable) saying how long the keys stay", err)
	}
}

// TestBareQuorumLockRegainsItsKeys: a lock granted by 2 of 3 nodes (the
// third link dropped the acquire) gets its missing key back at its next
// extension, so that it then survives the loss of one more node of three,
// as a freshly granted lock does. Extensions never recreated a key: the
// lock lived on 2 nodes for good, and one frozen node ended it.
func TestBareQuorumLockRegainsItsKeys(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes, proxies := ctxTimeoutProxied(t, cl, 0)
	c := newClient(t, nodes)
	ctx := context.Background()
	proxies[2].Blackhole(true)
	l, err := c.Acquire(ctx, []string{"r"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Node 2's acquire goes out beside the others' and ends at the node
	// timeout: heal only after it has surely gone into the black hole.
	time.Sleep(5 * c.NodeTimeout())
	proxies[2].Blackhole(false)
	if n := cl[2].Client(t).Exists(ctx, "r").Val(); n != 0 {
		t.Fatal("node 2 has the key: the lock was not granted by a bare quorum")
	}
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	if v := cl[2].Client(t).Get(ctx, "r").Val(); v == "" || v != cl[0].Client(t).Get(ctx, "r").Val() {
		t.Errorf("node 2's key after an Extend = %q, want the lock's value as on node 0", v)
	}
	if pttl := cl[2].Client(t).PTTL(ctx, "r").Val(); pttl < 9*time.Second {
		t.Errorf("node 2's key PTTL = %v after Extend(10s)", pttl)
	}
	proxies[0].Blackhole(true)
	defer proxies[0].Blackhole(false)
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Errorf("Extend with node 0 unreachable, after the lock regained node 2: %v", err)
	}
	rival := newClient(t, cl.Clients(t))
	if _, err := rival.TryAcquire(ctx, []string{"r"}, time.Second); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("rival TryAcquire = %v, want ErrNotAcquired", err)
	}
}

// TestRegainRespectsOwnersAndTheRestartGate: an extension sets a missing
// key only where no key of the lock is another owner's, and not on a node
// within its restart gate (it answers gated and sets nothing).
func TestRegainRespectsOwnersAndTheRestartGate(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	ctx := context.Background()
	const gate = 2 * time.Second
	c := newClient(t, cl.Clients(t), redlock.WithRestartGating(gate))
	// Let every node's gate pass: a new node waits out its gate too.
	_, _ = c.TryAcquire(ctx, []string{"warm"}, time.Second)
	time.Sleep(gate + 100*time.Millisecond)
	l, err := c.Acquire(ctx, []string{"a", "b"}, gate)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)

	// Node 0: "b" missing, "a" another owner's: nothing set.
	n0 := cl[0].Client(t)
	n0.Del(ctx, "b")
	n0.Set(ctx, "a", strings.Repeat("f", 32)+"-other", time.Minute)
	// Node 1 loses its data (a restart without persistence): gated.
	cl[1].Kill(t)
	cl[1].Restart(t)
	err = l.Extend(ctx, gate)
	var q *redlock.QuorumError
	if !errors.As(err, &q) || q.Nodes[0].Outcome != redlock.OutcomeHeld || q.Nodes[1].Outcome != redlock.OutcomeGated {
		t.Fatalf("Extend = %v, want node 0 held by another owner and node 1 gated", err)
	}
	if n := n0.Exists(ctx, "b").Val(); n != 0 {
		t.Errorf("node 0: %q regained beside another owner's %q", "b", "a")
	}
	if keys := cl[1].Keys(t); slices.ContainsFunc(keys, func(k string) bool { return k == "a" || k == "b" }) {
		t.Errorf("node 1 within its restart gate has lock keys %q", keys)
	}
}
