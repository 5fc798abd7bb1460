package readme

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
	"github.com/schedlock/schedlock/tracing"
)

// integrationsDoc is the page whose claims these tests check.
func integrationsDoc(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "docs", "integrations.md")
}

// docACL returns the arguments of every "ACL SETUSER" line of the page at
// path, in order, and the user name and password they set.
func docACL(t *testing.T, path string) (cmds [][]any, user, password string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[0] != "ACL" || fields[1] != "SETUSER" {
			continue
		}
		if user != "" && fields[2] != user {
			t.Fatalf("%s: ACL SETUSER lines for users %q and %q: want one user", path, user, fields[2])
		}
		user = fields[2]
		cmd := make([]any, len(fields))
		for i, f := range fields {
			cmd[i] = f
			if p, ok := strings.CutPrefix(f, ">"); ok {
				password = p
			}
		}
		cmds = append(cmds, cmd)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(cmds) == 0 || password == "" {
		t.Fatalf("%s: no ACL SETUSER line with a password (>...)", path)
	}
	return cmds, user, password
}

// hasClientSetInfo reports whether the node has CLIENT SETINFO (Redis 7.2
// or later; Valkey reports a redis_version of 7.2.4).
func hasClientSetInfo(t *testing.T, admin redis.UniversalClient) bool {
	t.Helper()
	info, err := admin.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			var major, minor int
			if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
				t.Fatalf("redis_version %q: %v", v, err)
			}
			return major > 7 || major == 7 && minor >= 2
		}
	}
	t.Fatalf("INFO server has no redis_version:\n%s", info)
	return false
}

// waitSubscribers waits up to 10 s until channel has want subscribers on
// every node.
func waitSubscribers(t *testing.T, admins []redis.UniversalClient, channel string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i, a := range admins {
		for {
			n, err := a.PubSubNumSub(context.Background(), channel).Result()
			if err != nil {
				t.Fatalf("node %d: PUBSUB NUMSUB: %v", i, err)
			}
			if n[channel] == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: %d subscribers of %s after 10 s, want %d", i, n[channel], channel, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// aclLog returns the entries of each node's ACL LOG, as text.
func aclLog(t *testing.T, admins []redis.UniversalClient) []string {
	t.Helper()
	var out []string
	for i, a := range admins {
		entries, err := a.ACLLog(context.Background(), 100).Result()
		if err != nil {
			t.Fatalf("node %d: ACL LOG: %v", i, err)
		}
		for _, e := range entries {
			out = append(out, fmt.Sprintf("node %d: %s denied %s %q (context %s, %d times)", i, e.Username, e.Reason, e.Object, e.Context, e.Count))
		}
	}
	return out
}

// TestIntegrationsACL runs every feature under the ACL user that
// docs/integrations.md creates (its ACL SETUSER lines, applied as written)
// on three real redis-server nodes: Acquire, Extend and Release of a plain
// lock, TryAcquire, HolderMetadata, a fenced lock, a reentrant lock, a
// waiting Acquire woken by the release notices, a gated Client, Eval through
// ReleaseAbandoned, a scheduler run with its run record read back, and a
// leader election. Each must succeed, and no node may have denied anything
// (ACL LOG is empty), not even what the library tolerates (a release
// notice's PUBLISH). A Client without a key prefix under the same user is
// refused, as the page says.
func TestIntegrationsACL(t *testing.T) {
	cmds, user, password := docACL(t, integrationsDoc(t))
	cl := redlocktest.Start(t, 3)
	admins := cl.Clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, a := range admins {
		for _, cmd := range cmds {
			if strings.Contains(fmt.Sprint(cmd...), "client|setinfo") && !hasClientSetInfo(t, a) {
				continue // Redis 7.0 and 7.1 have no CLIENT SETINFO, and refuse the line
			}
			if err := a.Do(ctx, cmd...).Err(); err != nil {
				t.Fatalf("node %d: %v: %v", i, cmd, err)
			}
		}
	}
	var nodes []redis.UniversalClient
	for _, addr := range cl.Addrs() {
		c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		nodes = append(nodes, c)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	locks, err := redlock.New(nodes, redlock.WithKeyPrefix("app:"), redlock.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locks.Close(context.Background()) })

	t.Run("locks", func(t *testing.T) {
		l, err := locks.Acquire(ctx, []string{"invoice:42", "invoice:43"}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l, err = locks.TryAcquire(ctx, []string{"invoice:42"}, 10*time.Second, redlock.WithMetadata("worker-1"))
		if err != nil {
			t.Fatal(err)
		}
		if md, held, err := locks.HolderMetadata(ctx, "invoice:42"); err != nil || !held || md != "worker-1" {
			t.Errorf("HolderMetadata = %q, %v, %v; want \"worker-1\", true, nil", md, held, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("fencing", func(t *testing.T) {
		l, err := locks.Acquire(ctx, []string{"ledger"}, 10*time.Second, redlock.WithFencing(true))
		if err != nil {
			t.Fatal(err)
		}
		if l.FencingToken() == 0 {
			t.Error("FencingToken() = 0, want a token")
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("reentrant", func(t *testing.T) {
		a, err := locks.Acquire(ctx, []string{"import"}, 10*time.Second, redlock.WithOwner("importer"), redlock.WithFencing(true))
		if err != nil {
			t.Fatal(err)
		}
		b, err := locks.Acquire(ctx, []string{"import"}, 10*time.Second, redlock.WithOwner("importer"), redlock.WithFencing(true))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("release notices", func(t *testing.T) {
		// Two waiters, on two locks: the first one's channel is dropped
		// (UNSUBSCRIBE) while the second one's is still wanted. Their retry
		// delay (5 s) leaves only the notices to wake them within the test.
		waiter, err := redlock.New(nodes, redlock.WithKeyPrefix("app:"), redlock.WithTracerProvider(tp),
			redlock.WithRetry(func() backoff.BackOff { return backoff.NewConstantBackOff(5 * time.Second) }))
		if err != nil {
			t.Fatal(err)
		}
		defer waiter.Close(context.Background())
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		type result struct {
			l   *redlock.Lock
			err error
		}
		var held []*redlock.Lock
		var got []chan result
		for _, res := range []string{"report", "export"} {
			l, err := locks.Acquire(ctx, []string{res}, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
			ch := make(chan result, 1)
			got = append(got, ch)
			go func() {
				l, err := waiter.Acquire(wctx, []string{res}, 10*time.Second)
				ch <- result{l, err}
			}()
			waitSubscribers(t, admins, "app:"+res+":released", 1) // a holder refused it
		}
		for i, h := range held {
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-got[i]
			if r.err != nil {
				t.Fatalf("waiting Acquire %d: %v", i, r.err)
			}
			if err := r.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				waitSubscribers(t, admins, "app:report:released", 0)
			}
		}
		woken := 0
		for _, s := range rec.Ended() {
			for _, a := range s.Attributes() {
				if a.Key == tracing.WaitEndedBy && a.Value.AsString() == tracing.WaitEndedByNotice {
					woken++
				}
			}
		}
		if woken < 2 {
			t.Errorf("%d wait spans ended by %q, want 2: the release notices did not wake both waiters", woken, tracing.WaitEndedByNotice)
		}
	})

	t.Run("restart gating", func(t *testing.T) {
		gated, err := redlock.New(nodes, redlock.WithKeyPrefix("app:"), redlock.WithRestartGating(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer gated.Close(context.Background())
		l, err := gated.Acquire(ctx, []string{"gated"}, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("eval", func(t *testing.T) {
		if _, err := locks.ReleaseAbandoned(ctx, "abandoned", "worker-9", "abandoned-mark"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("scheduler", func(t *testing.T) { runSchedulerOnce(ctx, t, locks) })
	t.Run("elector", func(t *testing.T) { electOnce(ctx, t, locks) })

	if denied := aclLog(t, admins); len(denied) > 0 {
		t.Errorf("the nodes denied commands, keys or channels to the documented ACL:\n%s", strings.Join(denied, "\n"))
	}

	t.Run("no key prefix", func(t *testing.T) {
		bare, err := redlock.New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		defer bare.Close(context.Background())
		if l, err := bare.TryAcquire(ctx, []string{"invoice:42"}, 10*time.Second); err == nil {
			_ = l.Release(ctx)
			t.Fatal("TryAcquire of a key outside the ACL's patterns succeeded")
		}
		denied := aclLog(t, admins)
		if len(denied) == 0 || !strings.Contains(strings.Join(denied, "\n"), `"invoice:42"`) {
			t.Errorf("ACL LOG = %q, want the key invoice:42 denied", denied)
		}
	})
}

// startClusterNode starts a cluster-mode redis-server that serves every
// hash slot alone, and returns a ClusterClient of it.
func startClusterNode(t *testing.T) *redis.ClusterClient {
	t.Helper()
	srv := redlocktest.StartServer(t, redlocktest.WithArgs("--cluster-enabled", "yes"))
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := admin.ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "cluster_state:ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster is not ok after 10 s:\n%s", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestIntegrationsCluster checks docs/integrations.md's "Redis Cluster and
// hash tags" on a cluster-mode redis-server used as a Redlock node: locks
// with keys in several slots are refused with CROSSSLOT; a hash tag in the
// Client's key prefix makes every feature work; tags in the resource names
// make a multi-resource fenced lock work.
func TestIntegrationsCluster(t *testing.T) {
	cc := startClusterNode(t)
	nodes := []redis.UniversalClient{cc}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newClient := func(opts ...redlock.Option) *redlock.Client {
		c, err := redlock.New(nodes, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}

	bare := newClient()
	for _, tc := range []struct {
		name      string
		resources []string
		opts      []redlock.LockOption
	}{
		{"two resources", []string{"invoice:42", "invoice:43"}, nil},
		{"fenced", []string{"ledger"}, []redlock.LockOption{redlock.WithFencing(true)}},
	} {
		l, err := bare.TryAcquire(ctx, tc.resources, 10*time.Second, tc.opts...)
		if err == nil {
			_ = l.Release(ctx)
			t.Errorf("%s, without a hash tag: acquired, want CROSSSLOT", tc.name)
		} else if !strings.Contains(err.Error(), "CROSSSLOT") {
			t.Errorf("%s, without a hash tag: %v, want CROSSSLOT", tc.name, err)
		}
	}

	l, err := bare.TryAcquire(ctx, []string{"{order:42}:lines", "{order:42}:total"}, 10*time.Second, redlock.WithFencing(true))
	if err != nil {
		t.Errorf("resources tagged {order:42}: %v", err)
	} else if err := l.Release(ctx); err != nil {
		t.Error(err)
	}
	// The scheduler and the elector under a Client without a tag, each
	// with a tagged prefix of its own.
	runSchedulerOnce(ctx, t, bare, scheduler.WithKeyPrefix("{schedlock}:"))
	electOnce(ctx, t, bare, elector.WithKeyPrefix("{schedlock}:elector:"))

	gated := newClient(redlock.WithKeyPrefix("{app}:"), redlock.WithRestartGating(50*time.Millisecond))
	if l, err := gated.Acquire(ctx, []string{"gated"}, 50*time.Millisecond); err != nil {
		t.Errorf("gated, with the prefix {app}: %v", err)
	} else if err := l.Release(ctx); err != nil {
		t.Error(err)
	}

	tagged := newClient(redlock.WithKeyPrefix("{app}:"))
	for _, tc := range []struct {
		name      string
		resources []string
		opts      []redlock.LockOption
	}{
		{"plain", []string{"invoice:42"}, nil},
		{"two resources", []string{"invoice:42", "invoice:43"}, nil},
		{"fenced", []string{"ledger", "journal"}, []redlock.LockOption{redlock.WithFencing(true)}},
		{"reentrant", []string{"import"}, []redlock.LockOption{redlock.WithOwner("importer")}},
	} {
		l, err := tagged.Acquire(ctx, tc.resources, 5*time.Second, tc.opts...)
		if err != nil {
			t.Errorf("%s, with the prefix {app}: %v", tc.name, err)
			continue
		}
		if err := l.Extend(ctx, 5*time.Second); err != nil {
			t.Errorf("%s, with the prefix {app}: Extend: %v", tc.name, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("%s, with the prefix {app}: Release: %v", tc.name, err)
		}
	}
	runSchedulerOnce(ctx, t, tagged)
	electOnce(ctx, t, tagged)
}

// runSchedulerOnce runs a per-second job of a Scheduler over locks until
// it has run once, then reads its run record back.
func runSchedulerOnce(ctx context.Context, t *testing.T, locks *redlock.Client, opts ...scheduler.LockerOption) {
	t.Helper()
	s, err := scheduler.New(locks, scheduler.WithLockerOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	var once sync.Once
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func(ctx context.Context) {
		if _, ok := scheduler.TickFromContext(s.RunContext(ctx)); ok {
			once.Do(func() { close(ran) })
		}
	}), gocron.WithName("report"))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Error("the scheduler's job did not run within 10 s")
	}
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	runs, err := s.History(ctx, "report", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) == 0 || runs[0].Outcome != "ok" {
		t.Errorf("History = %+v, want the run, ok", runs)
	}
}

// electOnce runs an Elector over locks until it leads, then stops it.
func electOnce(ctx context.Context, t *testing.T, locks *redlock.Client, opts ...elector.Option) {
	t.Helper()
	led := make(chan struct{})
	e, err := elector.New(locks, "billing-worker", append(opts, elector.OnStartedLeading(func(ctx context.Context) {
		close(led)
		<-ctx.Done()
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(ectx) }()
	select {
	case <-led:
	case <-time.After(10 * time.Second):
		t.Error("no leadership within 10 s")
	}
	cancel()
	<-done
}

// writeTLSFiles writes a CA and a certificate it signed for 127.0.0.1, for
// both server and client use, as PEM files in dir; it returns the paths and
// the client's tls.Config.
func writeTLSFiles(t *testing.T, dir string) (caFile, certFile, keyFile string, cfg *tls.Config) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "schedlock test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caFile = write("ca.crt", "CERTIFICATE", caDER)
	certFile = write("node.crt", "CERTIFICATE", der)
	keyFile = write("node.key", "EC PRIVATE KEY", keyDER)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return caFile, certFile, keyFile, &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, Certificates: []tls.Certificate{cert}}
}

// TestIntegrationsTLS checks docs/integrations.md's "TLS": locks over
// go-redis clients with a TLSConfig, on three redis-server nodes whose TLS
// ports require client certificates (Redis's default); a client without a
// certificate is refused.
func TestIntegrationsTLS(t *testing.T) {
	caFile, certFile, keyFile, cfg := writeTLSFiles(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var nodes []redis.UniversalClient
	var addrs []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0") // a free port for TLS; the plain one is redlocktest's
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		redlocktest.StartServer(t, redlocktest.WithArgs("--tls-port", strconv.Itoa(port),
			"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile))
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		addrs = append(addrs, addr)
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, TLSConfig: cfg})
		t.Cleanup(func() { _ = c.Close() })
		nodes = append(nodes, c)
	}
	locks, err := redlock.New(nodes, redlock.WithKeyPrefix("app:"))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close(context.Background())
	l, err := locks.Acquire(ctx, []string{"invoice:42"}, 10*time.Second, redlock.WithFencing(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	anon := redis.NewClient(&redis.Options{Addr: addrs[0], MaxRetries: -1,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: cfg.RootCAs}})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil {
		t.Error("a client without a certificate was let in")
	}
}
