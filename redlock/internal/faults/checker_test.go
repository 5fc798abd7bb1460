package faults

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// Tests of the checker and of the simulation themselves: a checker that
// cannot see a violation, or a simulated fault that does not happen,
// would make every scenario pass.

func TestCheckOverlaps(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name    string
		windows []Window
		want    int
	}{
		{"disjoint", []Window{
			{Lock: 1, Resource: "r", Start: at(0), End: at(10), Until: at(100)},
			{Lock: 2, Resource: "r", Start: at(10), End: at(20), Until: at(110)},
		}, 0},
		{"overlap", []Window{
			{Lock: 1, Resource: "r", Start: at(0), End: at(15), Until: at(100)},
			{Lock: 2, Resource: "r", Start: at(10), End: at(20), Until: at(110)},
		}, 1},
		{"other resource", []Window{
			{Lock: 1, Resource: "r", Start: at(0), End: at(15), Until: at(100)},
			{Lock: 2, Resource: "s", Start: at(10), End: at(20), Until: at(110)},
		}, 0},
		{"ends at Until", []Window{
			{Lock: 1, Resource: "r", Start: at(0), End: at(50), Until: at(10)},
			{Lock: 2, Resource: "r", Start: at(10), End: at(20), Until: at(110)},
		}, 0},
		{"ignores validity", []Window{
			{Lock: 1, Resource: "r", Start: at(0), End: at(50), Until: at(10), IgnoresValidity: true},
			{Lock: 2, Resource: "r", Start: at(10), End: at(20), Until: at(110)},
		}, 1},
		{"three at once", []Window{
			{Lock: 1, Resource: "r", Start: at(0), End: at(30), Until: at(100)},
			{Lock: 2, Resource: "r", Start: at(5), End: at(30), Until: at(100)},
			{Lock: 3, Resource: "r", Start: at(10), End: at(30), Until: at(100)},
		}, 3},
	}
	for _, tt := range tests {
		if got := Check(tt.windows, nil).Overlaps; got != tt.want {
			t.Errorf("%s: overlaps = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestCheckTokensAndLateWork(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ws := []Window{
		{Lock: 1, Resource: "r", Start: at(0), End: at(5), Until: at(100), Token: 3},
		{Lock: 2, Resource: "r", Start: at(10), End: at(15), Until: at(100), Token: 2},
		{Lock: 3, Resource: "r", Start: at(20), End: at(25), Until: at(100), Token: 4},
	}
	work := []Work{
		{Resource: "r", At: at(5), Until: at(10)},
		{Resource: "r", At: at(10), Until: at(10)},
	}
	v := Check(ws, work)
	if v.TokenViolations != 1 || v.LateWork != 1 || v.Overlaps != 0 || v.OK() {
		t.Errorf("Check = %v; want 1 token violation, 1 late action, not OK", v)
	}
}

func TestTallyAndPercentile(t *testing.T) {
	base := time.Unix(1000, 0)
	runs := []Run{{Tick: base.Add(time.Second)}, {Tick: base.Add(2 * time.Second)}, {Tick: base.Add(2 * time.Second)}}
	v := Tally(runs, time.Second, base, base.Add(4*time.Second))
	if v != (TickTally{Judged: 3, Duplicates: 1, Missed: 1}) {
		t.Errorf("Tally = %+v; want 3 judged, 1 duplicate, 1 missed", v)
	}
	ds := []time.Duration{5, 1, 4, 2, 3}
	if p := Percentile(ds, 50); p != 3 {
		t.Errorf("p50 = %v, want 3", p)
	}
	if p := Percentile(ds, 99); p != 5 {
		t.Errorf("p99 = %v, want 5", p)
	}
	if p := PercentileInt([]int{1, 1, 1, 9}, 75); p != 1 {
		t.Errorf("p75 = %v, want 1", p)
	}
}

func TestMonoClock(t *testing.T) {
	now := time.Now()
	back := MonoToTime(MonoOf(now))
	if d := back.Sub(now); d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("MonoToTime(MonoOf(t)) - t = %v", d)
	}
	if d := time.Since(MonoToTime(MonoNow())); d < 0 || d > time.Second {
		t.Errorf("MonoNow placed %v from now", d)
	}
}

func TestSimFaults(t *testing.T) {
	RunSim(t, 1, func(t *testing.T, c *SimCluster) {
		ctx := context.Background()
		clients, links := c.Clients()
		rdb := clients[0]
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		// Latency is exact in fake time.
		links[0].SetLatency(30 * time.Millisecond)
		start := time.Now()
		if err := rdb.Get(ctx, "k").Err(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Errorf("GET with 30ms each way took %v, want 60ms", d)
		}
		// Keys expire with the fake clock.
		links[0].Heal()
		if err := rdb.Set(ctx, "ttl", "v", time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(999 * time.Millisecond)
		if n, _ := rdb.Exists(ctx, "ttl").Result(); n != 1 {
			t.Error("key expired early")
		}
		time.Sleep(2 * time.Millisecond)
		if n, _ := rdb.Exists(ctx, "ttl").Result(); n != 0 {
			t.Error("key did not expire after its TTL")
		}
		// Dropped replies: the command runs, the client times out (3 s).
		links[0].Partition(redlocktest.NodeToClient)
		err := rdb.Set(ctx, "late", "v", 0).Err()
		links[0].Heal()
		if err == nil {
			t.Error("SET with replies dropped succeeded")
		}
		if n, _ := rdb.Exists(ctx, "late").Result(); n != 1 {
			t.Error("the node did not run a command whose reply was dropped")
		}
		// A frozen node runs queued commands when it thaws.
		c.Nodes[0].Freeze()
		done := make(chan error, 1)
		go func() { done <- rdb.Set(ctx, "queued", "v", 0).Err() }()
		time.Sleep(time.Second)
		if len(c.Nodes[0].Keys()) != 2 {
			t.Errorf("keys while frozen = %q", c.Nodes[0].Keys())
		}
		c.Nodes[0].Thaw()
		if err := <-done; err != nil {
			t.Errorf("SET queued on a frozen node: %v", err)
		}
		// A killed node refuses connections; it restarts empty.
		c.Nodes[0].Kill()
		var ne interface{ Timeout() bool }
		if err := rdb.Get(ctx, "k").Err(); err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("GET on a killed node = %v, want a connection error", err)
		}
		c.Nodes[0].Restart()
		if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Errorf("DBSIZE after restart = %d, %v; want 0", n, err)
		}
		c.Nodes[0].SetPersistent(true)
		if err := rdb.Set(ctx, "kept", "v", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		c.Nodes[0].Restart()
		if n, err := rdb.Exists(ctx, "kept").Result(); n != 1 {
			t.Errorf("a persistent node lost its data on restart (%v)", err)
		}
	})
}

// TestLinearizableAgreesWithTheChecker: porcupine's verdict on the
// register of (holder, token) matches the checker on clean histories and
// on each kind of violation.
func TestLinearizableAgreesWithTheChecker(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	w := func(lock, start, end, until int, token uint64) Window {
		return Window{Lock: lock, Resource: "r", Attempt: at(start - 2), Start: at(start), End: at(end), Until: at(until), Token: token}
	}
	tests := []struct {
		name    string
		windows []Window
		work    []Work
		want    porcupine.CheckResult
	}{
		{"handoffs", []Window{w(1, 0, 10, 100, 1), w(2, 12, 20, 100, 2), w(3, 20, 30, 25, 3)},
			[]Work{{Lock: 1, Resource: "r", At: at(5), Until: at(100)}, {Lock: 3, Resource: "r", At: at(24), Until: at(25)}}, porcupine.Ok},
		{"concurrent attempts, one after the other", []Window{
			{Lock: 1, Resource: "r", Attempt: at(0), Start: at(10), End: at(20), Until: at(100)},
			{Lock: 2, Resource: "r", Attempt: at(1), Start: at(25), End: at(30), Until: at(100)},
		}, nil, porcupine.Ok},
		{"two resources", []Window{w(1, 0, 10, 100, 0), {Lock: 2, Resource: "s", Start: at(5), End: at(8), Until: at(100)}}, nil, porcupine.Ok},
		{"overlap", []Window{w(1, 0, 15, 100, 0), w(2, 10, 20, 100, 0)}, nil, porcupine.Illegal},
		{"token backwards", []Window{w(1, 0, 10, 100, 5), w(2, 12, 20, 100, 4)}, nil, porcupine.Illegal},
		{"late work", []Window{w(1, 0, 30, 10, 0)}, []Work{{Lock: 1, Resource: "r", At: at(12), Until: at(10)}}, porcupine.Illegal},
	}
	for _, tt := range tests {
		if got := linearizable(tt.windows, tt.work); got != tt.want {
			t.Errorf("%s: porcupine = %s, want %s", tt.name, got, tt.want)
		}
		v := Check(tt.windows, tt.work)
		v.Linearizable = tt.want
		if !v.Agree() {
			t.Errorf("%s: the checker (%v) disagrees with porcupine's %s", tt.name, v, tt.want)
		}
	}
}
