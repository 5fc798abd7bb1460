package redlock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// armedCut is a connection that, once armed, lets its next write reach
// the server and then fails every read with io.EOF: a connection lost
// before the reply, which go-redis (MaxRetries, 3 by default) answers by
// sending the command again on a new connection.
type armedCut struct {
	net.Conn
	armed *atomic.Bool
	fired *atomic.Bool
	dead  atomic.Bool
}

func (c *armedCut) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.armed.CompareAndSwap(true, false) {
		time.Sleep(30 * time.Millisecond) // the server runs the command
		c.dead.Store(true)
		c.fired.Store(true)
	}
	return n, err
}

func (c *armedCut) Read(b []byte) (int, error) {
	if c.dead.Load() {
		c.Conn.Close()
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// cutClient returns a go-redis client of the node at addr, with
// go-redis's default retries, whose next write after armed is set loses
// its reply (fired says that it did).
func cutClient(t *testing.T, addr string, armed, fired *atomic.Bool) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &armedCut{Conn: c, armed: armed, fired: fired}, nil
		}})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestResentNestedReleaseKeepsTheOtherHold: a nested hold's Release runs
// on the node (its field goes, the key stays for the other hold), its
// reply is lost, and go-redis sends it again: the second run finds no
// field of this Lock's, which is what a lapsed hold looks like too, so
// Release reports the node as no longer holding it (ErrLockLost), as it
// does for a plain lock's release that ran twice (docs/safety.md, "a
// reply is lost and the command is sent again"). The other hold is left
// as it was: another owner is refused, and its own Release deletes the
// keys.
func TestResentNestedReleaseKeepsTheOtherHold(t *testing.T) {
	cl := redlocktest.Start(t, 1)
	var armed, fired atomic.Bool
	rdb := cutClient(t, cl.Addrs()[0], &armed, &fired)
	c := newClient(t, []redis.UniversalClient{rdb}, redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	o := redlock.WithOwner("o")
	outer, err := c.TryAcquire(ctx, []string{"e"}, time.Minute, o)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.TryAcquire(ctx, []string{"e"}, time.Minute, o)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	armed.Store(true)
	err = inner.Release(ctx)
	if !fired.Load() {
		t.Fatal("no connection was cut after the release: the test tests nothing")
	}
	if !errors.Is(err, redlock.ErrLockLost) {
		t.Errorf("Release of a nested hold sent again by go-redis = %v, want ErrLockLost (the second run finds no hold of its own)", err)
	}
	if _, err := c.TryAcquire(ctx, []string{"e"}, time.Second, redlock.WithOwner("p")); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("owner p while o's outer hold lasts: %v, want ErrNotAcquired", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Errorf("Release of the outer hold: %v", err)
	}
	waitSettled(t, c)
	if keys := cl.Keys(t)[0]; len(keys) > 0 {
		t.Errorf("node keeps %q after both Releases", keys)
	}
}

// TestUndoOfFailedReentryKeepsTheHold: owner o
// holds r (fenced). Its re-entry of r and s is refused on nodes 0 and 1
// (another owner holds s there) and granted on node 2, whose undo then
// removes that attempt's hold only: o's first hold still releases with
// nil, and no lock key or holds hash is left.
func TestUndoOfFailedReentryKeepsTheHold(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	nodes := cl.Clients(t)
	c := newClient(t, nodes, redlock.WithNodeTimeout(2*time.Second))
	ctx := context.Background()
	o := redlock.WithOwner("o")
	outer, err := c.TryAcquire(ctx, []string{"r"}, time.Minute, o, redlock.WithFencing(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, rdb := range nodes[:2] {
		must(t, rdb.Set(ctx, "s", "another owner's value", time.Minute).Err())
	}
	if _, err := c.TryAcquire(ctx, []string{"r", "s"}, time.Minute, o, redlock.WithFencing(true)); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("re-entry with s held by another: %v, want ErrNotAcquired", err)
	}
	waitSettled(t, c)
	if n := nodes[2].Exists(ctx, "s", "s\x00holds").Val(); n != 0 {
		t.Errorf("node 2 keeps s or its holds after the undo (%d keys)", n)
	}
	if _, err := c.TryAcquire(ctx, []string{"r"}, time.Second, redlock.WithOwner("p")); !errors.Is(err, redlock.ErrNotAcquired) {
		t.Fatalf("owner p while o holds r: %v, want ErrNotAcquired", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Errorf("Release of o's hold after its failed re-entry: %v", err)
	}
	waitSettled(t, c)
	for i, rdb := range nodes {
		for _, k := range []string{"r", "r\x00holds"} {
			if rdb.Exists(ctx, k).Val() != 0 {
				t.Errorf("node %d keeps %q after the Release", i, k)
			}
		}
	}
}
