package redlock_test

// Regression tests for issue 29: no node stalled by a cleanup, locks that
// regain fault tolerance, Keep and Extend that agree, and answers a faulty
// node cannot fake. Each runs against real redis-server nodes.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
