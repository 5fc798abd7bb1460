package node_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock/internal/node"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hook counts what go-redis sends (commands alone, pipelines, commands by
// name) and can hold the next command sent alone until released, so that
// calls queue up behind it.
type hook struct {
	mu               sync.Mutex
	alone, pipelines int
	names            map[string]int
	hold             chan struct{} // the next command alone waits for it
}

func newHook() *hook { return &hook{names: map[string]int{}} }

// holdNext makes the next command sent alone wait until release is called.
func (h *hook) holdNext() (release func()) {
	ch := make(chan struct{})
	h.mu.Lock()
	h.hold = ch
	h.mu.Unlock()
	return func() { close(ch) }
}

func (h *hook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.alone++
		h.names[cmd.Name()]++
		hold := h.hold
		h.hold = nil
		h.mu.Unlock()
		if hold != nil {
			<-hold
		}
		return next(ctx, cmd)
	}
}
func (h *hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		if cmds[0].Name() != "client" { // not go-redis's connection setup
			h.pipelines++
		}
		for _, c := range cmds {
			h.names[c.Name()]++
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// count returns how many commands named name went out.
func (h *hook) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.names[name]
}

// busy holds n's sender in a PING until the returned release is called.
func busy(t *testing.T, n *node.Node, h *hook) (release func()) {
	t.Helper()
	unhold := h.holdNext()
	held := call(t, n, context.Background(), nil, []string{"busy"}, "ping")
	time.Sleep(20 * time.Millisecond) // the sender takes the PING and waits
	return func() { unhold(); <-held }
}

// start returns a node on a fresh redis-server, its direct client and the
// hook on the node's client; the node is closed at the end.
func start(t *testing.T) (*node.Node, *redis.Client, *hook) {
	t.Helper()
	s := redlocktest.StartServer(t)
	rdb := s.Client(t)
	h := newHook()
	rdb.AddHook(h)
	n := node.New(rdb)
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	return n, s.Client(t), h
}

// call sends args to n and returns a channel with the reply.
func call(t *testing.T, n *node.Node, ctx context.Context, script *node.Script, keys []string, args ...any) <-chan *redis.Cmd {
	t.Helper()
	out := make(chan *redis.Cmd, 1)
	c := &node.Call{Ctx: ctx, Keys: keys, Args: args, Script: script, Done: func(_ *node.Call, r *redis.Cmd) { out <- r }}
	if script != nil {
		c.Args = script.Command(keys, args...)
	}
	if err := n.Send(c); err != nil {
		t.Fatalf("Send: %v", err)
	}
	return out
}

// TestConcurrentCallsShareAPipeline: calls queued while the sender is busy
// go out together, in queue order, and each gets its own reply.
func TestConcurrentCallsShareAPipeline(t *testing.T) {
	n, _, h := start(t)
	ctx := context.Background()
	<-call(t, n, ctx, nil, []string{"k"}, "set", "k", "0")
	release := busy(t, n, h)
	var replies []<-chan *redis.Cmd
	for i := range 50 {
		replies = append(replies, call(t, n, ctx, nil, []string{"k"}, "set", "k", fmt.Sprint(i+1), "get"))
	}
	release()
	for i, r := range replies {
		if got, err := (<-r).Text(); err != nil || got != fmt.Sprint(i) {
			t.Errorf("call %d: SET GET = %q, %v; want %q (the previous call's value: queue order)", i, got, err, fmt.Sprint(i))
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pipelines != 1 {
		t.Errorf("the 50 queued calls went in %d pipelines, want 1", h.pipelines)
	}
}

// TestEndedCallIsNotSent: a call whose ctx has ended when its turn comes
// gets ctx's cause and never reaches the node.
func TestEndedCallIsNotSent(t *testing.T) {
	n, _, h := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (<-call(t, n, ctx, nil, []string{"k"}, "set", "k", "v")).Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("call on an ended ctx = %v, want context.Canceled", err)
	}
	if got := h.count("set"); got != 0 {
		t.Errorf("go-redis sent %d SETs, want none", got)
	}
}

// TestScriptsAfterFlush: a script goes as EVAL the first time, then as
// EVALSHA; after SCRIPT FLUSH the NOSCRIPT reply is answered with EVAL,
// alone and in a pipeline, and the caller sees the script's reply.
func TestScriptsAfterFlush(t *testing.T) {
	n, direct, h := start(t)
	ctx := context.Background()
	s := node.NewScript(`return redis.call('INCR', KEYS[1])`)
	want := int64(0)
	check := func(what string, r <-chan *redis.Cmd) {
		t.Helper()
		want++
		if got, err := (<-r).Int64(); err != nil || got != want {
			t.Errorf("%s: %d, %v; want %d", what, got, err, want)
		}
	}
	check("first use", call(t, n, ctx, s, []string{"c"}))
	check("second use", call(t, n, ctx, s, []string{"c"}))
	if e, sha := h.count("eval"), h.count("evalsha"); e != 1 || sha != 1 {
		t.Errorf("EVAL %d, EVALSHA %d times; want 1 and 1", e, sha)
	}
	direct.ScriptFlush(ctx)
	check("alone after a flush", call(t, n, ctx, s, []string{"c"}))
	direct.ScriptFlush(ctx)
	release := busy(t, n, h)
	a, b := call(t, n, ctx, s, []string{"c"}), call(t, n, ctx, s, []string{"c"})
	release()
	check("first of a pipeline after a flush", a)
	check("second of a pipeline after a flush", b)
}

// TestNoscriptKeptOutBeforeALaterCallOnItsKeys: after NOSCRIPT, a call is
// sent again behind the rest of its batch only if no later call there
// names one of its keys, or if it is Reorderable: running it after that
// later call could change what the later call did.
func TestNoscriptKeptOutBeforeALaterCallOnItsKeys(t *testing.T) {
	n, direct, h := start(t)
	ctx := context.Background()
	set := node.NewScript(`return redis.call('SET', KEYS[1], ARGV[1])`)
	for _, reorderable := range []bool{false, true} {
		<-call(t, n, ctx, set, []string{"warm"}, "x") // the node knows the script
		direct.ScriptFlush(ctx)
		release := busy(t, n, h)
		out := make(chan *redis.Cmd, 1)
		c := &node.Call{Ctx: ctx, Script: set, Keys: []string{"k"}, Args: set.Command([]string{"k"}, "script"),
			Reorderable: reorderable, Done: func(_ *node.Call, r *redis.Cmd) { out <- r }}
		if err := n.Send(c); err != nil {
			t.Fatal(err)
		}
		later := call(t, n, ctx, nil, []string{"k"}, "set", "k", "later")
		release()
		err := (<-out).Err()
		<-later
		v := direct.Get(ctx, "k").Val()
		switch {
		case !reorderable && (!redis.HasErrorPrefix(err, "NOSCRIPT") || v != "later"):
			t.Errorf("kept out: reply %v, k = %q; want NOSCRIPT and the later call's value", err, v)
		case reorderable && (err != nil || v != "script"):
			t.Errorf("reorderable: reply %v, k = %q; want it sent again after the later call", err, v)
		}
	}
}

// TestCloseDrainsThenRefuses: Close lets the queued calls go out, then
// refuses new ones, and returns once the sender has ended (goleak checks
// at the end that no sender is left, idle or not).
func TestCloseDrainsThenRefuses(t *testing.T) {
	n, _, h := start(t)
	ctx := context.Background()
	release := busy(t, n, h)
	queued := call(t, n, ctx, nil, []string{"k"}, "set", "k", "v")
	closed := make(chan error, 1)
	go func() { closed <- n.Close(ctx) }()
	time.Sleep(20 * time.Millisecond)
	if err := n.Send(&node.Call{Ctx: ctx, Args: []any{"ping"}, Done: func(*node.Call, *redis.Cmd) {}}); !errors.Is(err, node.ErrClosed) {
		t.Errorf("Send after Close = %v, want ErrClosed", err)
	}
	release()
	if err := (<-queued).Err(); err != nil {
		t.Errorf("a call queued before Close: %v, want it sent", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestCloseGivesUpAtItsDeadline: a Close whose ctx ends cancels the calls
// still queued (ErrClosed) and returns ctx's cause once the sender ended.
func TestCloseGivesUpAtItsDeadline(t *testing.T) {
	n, _, h := start(t)
	ctx := context.Background()
	release := busy(t, n, h)
	queued := call(t, n, ctx, nil, []string{"k"}, "set", "k", "v")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- n.Close(short) }()
	time.Sleep(100 * time.Millisecond)
	release()
	if err := <-closed; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close past its deadline = %v, want DeadlineExceeded", err)
	}
	if err := (<-queued).Err(); !errors.Is(err, node.ErrClosed) {
		t.Errorf("a call still queued when Close gave up: %v, want ErrClosed", err)
	}
}

// TestFlushWaitsForEarlierCalls: Flush returns after the calls queued
// before it were answered.
func TestFlushWaitsForEarlierCalls(t *testing.T) {
	n, _, h := start(t)
	ctx := context.Background()
	release := h.holdNext()
	held := call(t, n, ctx, nil, []string{"x"}, "ping")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := n.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Flush while a call is held = %v, want DeadlineExceeded", err)
	}
	release()
	if err := n.Flush(ctx); err != nil {
		t.Errorf("Flush: %v", err)
	}
	select {
	case <-held:
	default:
		t.Error("Flush returned before the earlier call was answered")
	}
}

// TestWaitBoundsACallFromItsSend: a call without a deadline but with Wait
// is sent however long it queued (longer than Wait here), and once sent
// to a frozen node it holds the node's later calls at most about Wait
// (with ContextTimeoutEnabled), not go-redis's read timeout.
func TestWaitBoundsACallFromItsSend(t *testing.T) {
	n, direct, h := start(t)
	ctx := context.Background()
	release := busy(t, n, h)
	queued := make(chan *redis.Cmd, 1)
	if err := n.Send(&node.Call{Ctx: ctx, Keys: []string{"w"}, Args: []any{"set", "w", "1"}, Wait: 50 * time.Millisecond,
		Done: func(_ *node.Call, r *redis.Cmd) { queued <- r }}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // three times its Wait in the queue
	release()
	if err := (<-queued).Err(); err != nil {
		t.Errorf("call queued longer than its Wait = %v, want it sent", err)
	}
	if v := direct.Get(ctx, "w").Val(); v != "1" {
		t.Errorf("w = %q, want the queued call's 1", v)
	}

	s := redlocktest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	frozen := node.New(rdb)
	t.Cleanup(func() { _ = frozen.Close(context.Background()) })
	<-call(t, frozen, ctx, nil, nil, "ping") // connected
	s.Stop(t)
	start := time.Now()
	stuck := make(chan *redis.Cmd, 1)
	if err := frozen.Send(&node.Call{Ctx: ctx, Args: []any{"ping"}, Wait: 100 * time.Millisecond,
		Done: func(_ *node.Call, r *redis.Cmd) { stuck <- r }}); err != nil {
		t.Fatal(err)
	}
	err := (<-stuck).Err()
	took := time.Since(start)
	s.Cont(t)
	if err == nil || took > 3*time.Second {
		t.Errorf("call to a frozen node with Wait 100ms = %v after %v, want a timeout well before the 10s read timeout", err, took)
	}
}

// TestInlineCall: an Inline call to an idle node is sent by its caller
// (Done has run when Send returns); calls queued meanwhile go out after it,
// in queue order, on a sender started afterwards; an Inline call to a busy
// node is queued like any other.
func TestInlineCall(t *testing.T) {
	n, _, h := start(t)
	ctx := context.Background()
	inline := func(args ...any) (sent chan error, reply chan *redis.Cmd) {
		sent, reply = make(chan error, 1), make(chan *redis.Cmd, 1)
		c := &node.Call{Ctx: ctx, Keys: []string{"k"}, Args: args, Inline: true,
			Done: func(_ *node.Call, r *redis.Cmd) { reply <- r }}
		go func() { sent <- n.Send(c) }()
		return sent, reply
	}

	sent, reply := inline("set", "k", "0")
	if err := <-sent; err != nil {
		t.Fatalf("Send: %v", err)
	}
	select {
	case r := <-reply:
		if r.Err() != nil {
			t.Fatalf("inline SET: %v", r.Err())
		}
	default:
		t.Fatal("Send of an Inline call to an idle node returned before Done ran")
	}

	unhold := h.holdNext()
	sent, reply = inline("set", "k", "1", "get")
	time.Sleep(20 * time.Millisecond) // the caller sends it and waits in the hook
	var queued []<-chan *redis.Cmd
	for i := range 5 {
		queued = append(queued, call(t, n, ctx, nil, []string{"k"}, "set", "k", fmt.Sprint(i+2), "get"))
	}
	select {
	case err := <-sent:
		t.Fatalf("Send of the held Inline call returned (%v) before its reply", err)
	default:
	}
	unhold()
	if err := <-sent; err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got, err := (<-reply).Text(); err != nil || got != "0" {
		t.Errorf("inline SET GET = %q, %v; want \"0\"", got, err)
	}
	for i, r := range queued {
		if got, err := (<-r).Text(); err != nil || got != fmt.Sprint(i+1) {
			t.Errorf("queued call %d: SET GET = %q, %v; want %q (queue order after the inline call)", i, got, err, fmt.Sprint(i+1))
		}
	}

	release := busy(t, n, h)
	sent, reply = inline("get", "k")
	if err := <-sent; err != nil {
		t.Fatalf("Send: %v", err)
	}
	select {
	case <-reply:
		t.Error("an Inline call to a busy node was answered before the busy call")
	default:
	}
	release()
	if got, err := (<-reply).Text(); err != nil || got != "6" {
		t.Errorf("GET after the busy call = %q, %v; want \"6\"", got, err)
	}
}
