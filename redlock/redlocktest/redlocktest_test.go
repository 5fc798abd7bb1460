package redlocktest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartSetGet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := Start(t, 3)
	if len(c) != 3 {
		t.Fatalf("Start(3) returned %d servers", len(c))
	}
	checkDistinctServers(t, c)

	clients := c.Clients(t)
	if len(clients) != 3 {
		t.Fatalf("Clients returned %d clients", len(clients))
	}
	for i, cl := range clients {
		if err := cl.Set(ctx, fmt.Sprintf("key-%d", i), fmt.Sprintf("value-%d", i), 0).Err(); err != nil {
			t.Fatalf("SET on server %d: %v", i, err)
		}
	}
	checkOwnKeyOnly(t, clients)
	keys := c.Keys(t)
	for i := range c {
		if want := []string{fmt.Sprintf("key-%d", i)}; !slices.Equal(keys[i], want) {
			t.Fatalf("Keys()[%d] = %q, want %q", i, keys[i], want)
		}
	}
}

// checkDistinctServers fails the test unless the servers of c have
// loopback addresses, as Addrs lists them, and distinct pids and addresses.
func checkDistinctServers(t *testing.T, c Cluster) {
	t.Helper()
	addrs := c.Addrs()
	pids := map[int]bool{}
	for i, s := range c {
		if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || s.Addr() != addrs[i] {
			t.Fatalf("server %d: Addr() = %q, Addrs()[%d] = %q", i, s.Addr(), i, addrs[i])
		}
		if s.PID() <= 0 || pids[s.PID()] {
			t.Fatalf("server %d: PID() = %d, want a new positive pid", i, s.PID())
		}
		pids[s.PID()] = true
	}
	if len(slices.Compact(slices.Sorted(slices.Values(addrs)))) != 3 {
		t.Fatalf("addresses not distinct: %q", addrs)
	}
}

// checkOwnKeyOnly fails the test unless client i's server has key-i =
// value-i and no other key: the servers are independent.
func checkOwnKeyOnly(t *testing.T, clients []redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	for i, cl := range clients {
		got, err := cl.Get(ctx, fmt.Sprintf("key-%d", i)).Result()
		if err != nil || got != fmt.Sprintf("value-%d", i) {
			t.Fatalf("GET on server %d = %q, %v", i, got, err)
		}
		if n, err := cl.DBSize(ctx).Result(); err != nil || n != 1 {
			t.Fatalf("DBSIZE on server %d = %d, %v; want 1", i, n, err)
		}
	}
}

func TestDefaultConfiguration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t)
	cl := s.Client(t)
	want := map[string]string{
		"bind":                 "127.0.0.1",
		"save":                 "",
		"appendonly":           "no",
		"daemonize":            "no",
		"enable-debug-command": "local",
		"port":                 s.Addr()[len("127.0.0.1:"):],
		"dir":                  s.Dir(),
		"logfile":              filepath.Join(s.Dir(), "redis.log"),
	}
	for name, w := range want {
		got, err := cl.ConfigGet(ctx, name).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", name, err)
		}
		if got[name] != w {
			t.Errorf("CONFIG GET %s = %q, want %q", name, got[name], w)
		}
	}
	def := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer def.Close()
	if got, want := cl.Options(), def.Options(); got.ContextTimeoutEnabled || got.Addr != want.Addr ||
		got.ReadTimeout != want.ReadTimeout || got.MaxRetries != want.MaxRetries || got.PoolSize != want.PoolSize {
		t.Errorf("client options are not go-redis defaults: got %+v", got)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "redis.log")); err != nil {
		t.Errorf("redis.log: %v", err)
	}
	if keys := s.Keys(t); len(keys) != 0 {
		t.Errorf("Keys() of a new server = %q, want none", keys)
	}
}

func TestWithArgs(t *testing.T) {
	t.Parallel()
	s := StartServer(t, WithArgs("--maxmemory", "12345678", "--databases", "4"))
	cl := s.Client(t)
	for name, want := range map[string]string{"maxmemory": "12345678", "databases": "4"} {
		got, err := cl.ConfigGet(context.Background(), name).Result()
		if err != nil || got[name] != want {
			t.Errorf("CONFIG GET %s = %q, %v; want %q", name, got[name], err, want)
		}
	}
}

func TestStopCont(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t)
	slow := redis.NewClient(&redis.Options{
		Addr:        s.Addr(),
		ReadTimeout: 200 * time.Millisecond,
		MaxRetries:  -1,
	})
	defer slow.Close()
	if err := slow.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	pid := s.PID()

	s.Stop(t)
	s.Stop(t) // no-op
	if s.PID() != pid {
		t.Fatalf("PID changed by Stop: %d -> %d", pid, s.PID())
	}
	start := time.Now()
	got, err := slow.Get(ctx, "k").Result()
	elapsed := time.Since(start)
	var netErr net.Error
	if err == nil || !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("GET on stopped server = %q, %v; want a timeout", got, err)
	}
	if elapsed < 150*time.Millisecond || elapsed > 3*time.Second {
		t.Fatalf("GET on stopped server failed after %v, want about 200ms", elapsed)
	}

	s.Cont(t)
	s.Cont(t) // no-op
	got, err = slow.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET after Cont = %q, %v; want %q", got, err, "v")
	}
	if keys := s.Keys(t); !slices.Equal(keys, []string{"k"}) {
		t.Fatalf("Keys() after Cont = %q", keys)
	}
}

func TestKillRestartLosesData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t)
	cl := s.Client(t)
	addr, pid := s.Addr(), s.PID()
	if err := cl.Set(ctx, "lost", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	s.Kill(t)
	if s.PID() != 0 {
		t.Fatalf("PID() after Kill = %d, want 0", s.PID())
	}
	s.Kill(t) // no-op
	s.Cont(t) // no-op
	s.Stop(t) // no-op
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("port %s still accepts connections after Kill", addr)
	}

	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("Addr() after Restart = %q, want %q", s.Addr(), addr)
	}
	if s.PID() == 0 || s.PID() == pid {
		t.Fatalf("PID() after Restart = %d, old %d", s.PID(), pid)
	}
	if err := cl.Get(ctx, "lost").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Kill+Restart = %v, want redis.Nil", err)
	}
	if keys := s.Keys(t); len(keys) != 0 {
		t.Fatalf("Keys() after Kill+Restart = %q, want none", keys)
	}
}

func TestAppendOnlyFsyncAlwaysSurvivesKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t, WithAppendOnlyFsyncAlways())
	cl := s.Client(t)
	for name, want := range map[string]string{"appendonly": "yes", "appendfsync": "always"} {
		got, err := cl.ConfigGet(ctx, name).Result()
		if err != nil || got[name] != want {
			t.Fatalf("CONFIG GET %s = %q, %v; want %q", name, got[name], err, want)
		}
	}
	if err := cl.Set(ctx, "kept", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	s.Kill(t)
	s.Restart(t)
	got, err := cl.Get(ctx, "kept").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET after Kill+Restart = %q, %v; want %q", got, err, "v")
	}
	if keys := s.Keys(t); !slices.Equal(keys, []string{"kept"}) {
		t.Fatalf("Keys() after Kill+Restart = %q", keys)
	}
}

func TestKillAndRestartStoppedServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := StartServer(t)
	cl := s.Client(t)

	// Restart of a stopped server kills it first.
	s.Stop(t)
	old := s.PID()
	s.Restart(t)
	if s.PID() == old || s.PID() == 0 {
		t.Fatalf("PID() after Restart = %d, old %d", s.PID(), old)
	}
	if err := cl.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart of a stopped server: %v", err)
	}

	// Restart of a running server kills it first.
	old = s.PID()
	s.Restart(t)
	if s.PID() == old || s.PID() == 0 {
		t.Fatalf("PID() after Restart = %d, old %d", s.PID(), old)
	}

	// Kill of a stopped server.
	s.Stop(t)
	s.Kill(t)
	if s.PID() != 0 {
		t.Fatalf("PID() after Kill of a stopped server = %d", s.PID())
	}
	s.Restart(t)
	if err := cl.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}

	// The test ends with the server stopped: cleanup must still end it.
	s.Stop(t)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := Start(t, 2)
	clients := c.Clients(t)
	var want []string
	for i := range 2500 { // more than one SCAN batch
		want = append(want, fmt.Sprintf("k:%05d", i))
	}
	pipe := clients[0].Pipeline()
	for _, k := range want {
		pipe.Set(ctx, k, "x", 0)
	}
	pipe.HSet(ctx, "hash", "f", "v")
	pipe.RPush(ctx, "list", "a")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	want = append(want, "hash", "list")
	slices.Sort(want)

	keys := c.Keys(t)
	if !slices.Equal(keys[0], want) {
		t.Fatalf("Keys()[0] has %d keys, want %d sorted keys", len(keys[0]), len(want))
	}
	if keys[1] == nil || len(keys[1]) != 0 {
		t.Fatalf("Keys()[1] = %q, want an empty list", keys[1])
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the calling goroutine, like testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFatal runs fn with a fatalRecorder and returns the Fatalf message, or ""
// if fn returned normally.
func runFatal(t *testing.T, fn func(tb testing.TB)) string {
	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(rec)
	}()
	<-done
	return rec.msg
}

func TestMissingBinary(t *testing.T) {
	t.Setenv("REDIS_SERVER", filepath.Join(t.TempDir(), "no-such-redis-server"))
	for name, fn := range map[string]func(testing.TB){
		"StartServer": func(tb testing.TB) { StartServer(tb) },
		"Start":       func(tb testing.TB) { Start(tb, 2) },
	} {
		msg := runFatal(t, fn)
		if !strings.Contains(msg, notFoundHint) {
			t.Errorf("%s without redis-server: Fatalf message %q, want it to contain %q", name, msg, notFoundHint)
		}
	}
}

func TestStartFailureReportsLog(t *testing.T) {
	t.Parallel()
	msg := runFatal(t, func(tb testing.TB) { StartServer(tb, WithArgs("--no-such-option", "1")) })
	if !strings.Contains(msg, "redlocktest:") || !strings.Contains(msg, "no-such-option") {
		t.Fatalf("Fatalf message %q, want the failure and the log tail naming the bad option", msg)
	}
}

func TestPortTakenRetries(t *testing.T) {
	t.Parallel()
	bin := lookupRedis(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	// Always the taken port: fails with errPortInUse after portAttempts.
	calls := 0
	_, err = startServer(bin, t.TempDir(), config{}, func() (int, error) { calls++; return takenPort, nil })
	if !errors.Is(err, errPortInUse) || calls != portAttempts {
		t.Fatalf("startServer on a taken port: err %v after %d picks; want errPortInUse after %d", err, calls, portAttempts)
	}
	t.Logf("error on a taken port: %v", err)

	// The taken port first, then a free one: the retry succeeds.
	calls = 0
	s, err := startServer(bin, t.TempDir(), config{}, func() (int, error) {
		calls++
		if calls == 1 {
			return takenPort, nil
		}
		return freePort()
	})
	if err != nil {
		t.Fatalf("startServer with one taken port: %v", err)
	}
	t.Cleanup(s.cleanup)
	if calls != 2 || s.Addr() == taken.Addr().String() {
		t.Fatalf("startServer picked %d ports and listens on %s", calls, s.Addr())
	}
	if err := s.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
}
