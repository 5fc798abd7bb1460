package redlock

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestAcquireIsIdempotent: a key that already holds the lock's own value
// (a grant whose reply was lost) counts as granted and gets its TTL
// refreshed, so a retry never blocks itself (issue: behaviour 5).
func TestAcquireIsIdempotent(t *testing.T) {
	c, ms := newMiniClient(t)
	l, err := c.newLock(context.Background(), []string{"r"}, 10*time.Second, acquireConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Our own value on nodes 0 and 1 with a short TTL, as an earlier
	// attempt whose replies were lost would have left it.
	for _, m := range ms[:2] {
		if err := m.Set("r", l.value); err != nil {
			t.Fatal(err)
		}
		m.SetTTL("r", time.Second)
	}
	// As Acquire (TryAcquire sends SET NX GET, which no key can match).
	if qerr := c.attempt(context.Background(), l, 1, false); qerr != nil {
		t.Fatalf("attempt over our own keys = %v, want granted", qerr)
	}
	// The round decided early: let the last node's script land, whichever
	// it was.
	eventually(t, func() bool {
		for _, m := range ms {
			if m.TTL("r") < 9*time.Second {
				return false
			}
		}
		return true
	})
	for i, m := range ms {
		if got := m.TTL("r"); got < 9*time.Second {
			t.Errorf("node %d: TTL = %v, want refreshed to about 10s", i, got)
		}
		if v, _ := m.Get("r"); v != l.value {
			t.Errorf("node %d: key does not hold the lock's value", i)
		}
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRetriedReentrantAcquireCountsOnce: a reentrant acquisition whose
// script runs twice (a retry after a lost reply) adds one hold, not two.
func TestRetriedReentrantAcquireCountsOnce(t *testing.T) {
	c, ms := newMiniClient(t)
	ctx := context.Background()
	l, err := c.newLock(ctx, []string{"r"}, 5*time.Second, acquireConfig{owner: "o", ownerSet: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the same acquisition, sent twice
		if qerr := c.attempt(ctx, l, 1, false); qerr != nil {
			t.Fatal(qerr)
		}
	}
	eventually(t, func() bool { return ms[0].Exists("r:holds") && ms[1].Exists("r:holds") && ms[2].Exists("r:holds") })
	for i, m := range ms {
		if fields, _ := m.HKeys("r:holds"); len(fields) != 1 {
			t.Errorf("node %d: holds = %v, want exactly one", i, fields)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx); err != nil { // Release returns on a quorum
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.Exists("r") || m.Exists("r:holds") {
			t.Errorf("node %d: keys %v remain after the only hold was released", i, m.Keys())
		}
	}
}

// newMiniClient returns a Client over three fresh miniredis nodes, with a
// node timeout of 2 s: its tests are about what the scripts leave, and
// under -race on a loaded 2-core machine a round on three nodes has taken
// more than the default 100 ms (a Release timed out on every node).
func newMiniClient(t *testing.T) (*Client, []*miniredis.Miniredis) {
	t.Helper()
	var nodes []redis.UniversalClient
	var ms []*miniredis.Miniredis
	for range 3 {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { rdb.Close() })
		nodes, ms = append(nodes, rdb), append(ms, m)
	}
	c, err := New(nodes, WithNodeTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return c, ms
}

// eventually polls cond every millisecond for at most 5 s.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}

// TestWaitMarkedValues: a value whose byte after the owner token a waiter
// marked (acquireScript) still gives its trace context and metadata, and
// unmarked restores the value its owner wrote; other values pass as they are.
func TestWaitMarkedValues(t *testing.T) {
	token := bytes.Repeat([]byte{0xaa}, tokenLen/2)
	tp := "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"
	for _, v := range []string{buildValue(token, "", "md"), buildValue(token, tp, "md")} {
		wantTP, wantMD, _ := splitValue(v)
		marked := []byte(v)
		marked[tokenLen] = map[byte]byte{'-': '_', 'T': 't'}[v[tokenLen]]
		gotTP, gotMD, ok := splitValue(string(marked))
		if !ok || gotTP != wantTP || gotMD != wantMD {
			t.Errorf("splitValue(%q) = %q, %q, %v; want %q, %q, true", marked, gotTP, gotMD, ok, wantTP, wantMD)
		}
		if got := unmarked(string(marked)); got != v {
			t.Errorf("unmarked(%q) = %q, want %q", marked, got, v)
		}
		if got := unmarked(v); got != v {
			t.Errorf("unmarked(%q) = %q, want it unchanged", v, got)
		}
	}
	hexToken := strings.Repeat("a", tokenLen)
	for _, v := range []string{"", "short", hexToken, hexToken + "x"} {
		if got := unmarked(v); got != v {
			t.Errorf("unmarked(%q) = %q, want it unchanged", v, got)
		}
	}
}

// TestRoundCtx: a round's node context keeps the caller's values and
// deadline but not its cancellation, and context.Cause reports the round's
// own end (roundCtx.Value hides the caller's cancellable context).
func TestRoundCtx(t *testing.T) {
	if cancelCtxKey == nil {
		t.Fatal("cancelCtxKey not found: context.Cause no longer asks Value for it")
	}
	type key struct{}
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	defer cancel(nil)
	end := time.Now().Add(time.Hour)

	var rc roundCtx
	rc.init(parent, end, false)
	if got := rc.Value(key{}); got != "v" {
		t.Errorf("Value = %v, want the caller's v", got)
	}
	if d, ok := rc.Deadline(); !ok || !d.Equal(end) {
		t.Errorf("Deadline = %v, %v; want %v, true", d, ok, end)
	}
	rc.stop(context.DeadlineExceeded, context.DeadlineExceeded)
	if err := context.Cause(&rc); err != context.DeadlineExceeded {
		t.Errorf("Cause after stop = %v, want the round's DeadlineExceeded (caller still live)", err)
	}
	select {
	case <-rc.Done():
	default:
		t.Error("Done not closed after stop")
	}

	var live roundCtx
	live.init(parent, end, false)
	boom := errors.New("boom")
	cancel(boom)
	if err, cause := live.Err(), context.Cause(&live); err != nil || cause != nil {
		t.Errorf("after the caller's cancel: Err = %v, Cause = %v; want nil, nil (round stops it itself)", err, cause)
	}
	live.stop(context.DeadlineExceeded, context.DeadlineExceeded)
	if err := context.Cause(&live); err != context.DeadlineExceeded {
		t.Errorf("Cause after stop = %v, want the round's DeadlineExceeded, not the caller's cause", err)
	}

	early := time.Now().Add(time.Minute)
	dctx, dcancel := context.WithDeadline(context.Background(), early)
	defer dcancel()
	for _, detach := range []bool{false, true} {
		var d roundCtx
		d.init(dctx, end, detach)
		want := early
		if detach {
			want = end
		}
		if got, _ := d.Deadline(); !got.Equal(want) {
			t.Errorf("detach=%v: Deadline = %v, want %v", detach, got, want)
		}
		d.stop(context.Canceled, context.Canceled)
	}

	var timed roundCtx
	timed.init(context.Background(), time.Now().Add(time.Millisecond), false)
	timed.arm()
	select {
	case <-timed.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed at the deadline")
	}
	if err := timed.Err(); err != context.DeadlineExceeded {
		t.Errorf("Err at the deadline = %v, want DeadlineExceeded", err)
	}
}

// TestRoundTimers: a round's timer closes Done at its deadline, the
// caller's when that is earlier, and a stopped round's timer never fires;
// stop with a nil error still closes Done once, and a second stop does
// nothing.
func TestRoundTimers(t *testing.T) {
	callerCtx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	var early roundCtx
	early.init(callerCtx, time.Now().Add(time.Hour), false)
	early.arm()
	select {
	case <-early.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed at the caller's earlier deadline")
	}

	// Rounds with an hour to go stay live among rounds that end after a
	// millisecond and rounds stopped at once.
	const n = 200
	var short, long [n]roundCtx
	for i := range n {
		var stopped roundCtx
		stopped.init(context.Background(), time.Now().Add(time.Millisecond), false)
		stopped.arm()
		stopped.stop(context.Canceled, nil)
		long[i].init(context.Background(), time.Now().Add(time.Hour), false)
		long[i].arm()
		short[i].init(context.Background(), time.Now().Add(time.Millisecond), false)
		short[i].arm()
	}
	for i := range short {
		select {
		case <-short[i].Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("short round %d: Done not closed at its deadline", i)
		}
	}
	time.Sleep(10 * time.Millisecond) // any stale callback has run by now
	for i := range long {
		if err := long[i].Err(); err != nil {
			t.Fatalf("round %d with an hour to go ended: %v", i, err)
		}
		long[i].stop(context.Canceled, nil)
		long[i].stop(context.DeadlineExceeded, nil)
		if err := long[i].Err(); err != context.Canceled {
			t.Fatalf("round %d: Err after two stops = %v, want the first, Canceled", i, err)
		}
	}
	var nilErr roundCtx
	nilErr.init(context.Background(), time.Now().Add(time.Hour), false)
	nilErr.stop(nil, nil)
	nilErr.stop(nil, nil) // must not close Done twice
	if err := nilErr.Err(); err != context.Canceled {
		t.Errorf("Err after stop(nil) = %v, want Canceled", err)
	}
}

// TestRoundCtxAfterFunc: contexts derived from a round's context hook to
// it through AfterFunc, with no goroutine each, end when it stops, and
// unregister when they end first.
func TestRoundCtxAfterFunc(t *testing.T) {
	var rc roundCtx
	rc.init(context.Background(), time.Now().Add(time.Hour), false)
	before := runtime.NumGoroutine()
	var children []context.Context
	for range 50 {
		child, cancel := context.WithTimeout(&rc, time.Hour)
		defer cancel()
		children = append(children, child)
	}
	if n := runtime.NumGoroutine() - before; n >= 25 {
		t.Errorf("%d goroutines started for 50 derived contexts, want none (AfterFunc)", n)
	}
	_, cancel := context.WithCancel(&rc)
	cancel()
	rc.mu.Lock()
	registered := len(rc.afters)
	rc.mu.Unlock()
	if registered != 50 {
		t.Errorf("%d functions registered, want 50 (a cancelled child unregisters)", registered)
	}
	rc.stop(context.Canceled, nil)
	for i, child := range children {
		select {
		case <-child.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("child %d not done after the round's context stopped", i)
		}
		if err := child.Err(); err != context.Canceled {
			t.Fatalf("child %d: Err = %v, want Canceled", i, err)
		}
	}
	late, cancel := context.WithCancel(&rc) // derived after the stop: done at once
	defer cancel()
	if late.Err() == nil {
		t.Error("a context derived from a stopped round's context is not done")
	}
}
