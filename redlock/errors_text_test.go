package redlock_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// The error texts are part of what a user reads in a log: these tests pin
// the texts of the common errors. Node addresses vary from run to run; a
// want text names node i's address as {i}.

// withAddrs replaces {i} in want by addrs[i].
func withAddrs(want string, addrs []string) string {
	for i, a := range addrs {
		want = strings.ReplaceAll(want, "{"+string(rune('0'+i))+"}", a)
	}
	return want
}

// addrsOf returns the addresses of go-redis clients.
func addrsOf(nodes []redis.UniversalClient) []string {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.(*redis.Client).Options().Addr)
	}
	return addrs
}

// checkText fails t unless err reads want exactly and matches sentinel.
func checkText(t *testing.T, what string, err, sentinel error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error, want %q", what, want)
	case !errors.Is(err, sentinel):
		t.Errorf("%s = %v, want an error matching %v", what, err, sentinel)
	case err.Error() != want:
		t.Errorf("%s reads\n%s\nwant\n%s", what, err, want)
	}
}

// checkPattern fails t unless err matches sentinel and its whole text
// matches the regular expression pattern.
func checkPattern(t *testing.T, what string, err, sentinel error, pattern string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: no error, want one matching %q", what, pattern)
	case !errors.Is(err, sentinel):
		t.Errorf("%s = %v, want an error matching %v", what, err, sentinel)
	case !regexp.MustCompile(`^(?:` + pattern + `)$`).MatchString(err.Error()):
		t.Errorf("%s reads\n%s\nwant it to match\n%s", what, err, pattern)
	}
}

func TestInvalidArgumentTexts(t *testing.T) {
	_, nodes := miniNodes(t, 1)
	c := newClient(t, nodes, redlock.WithNodeTimeout(100*time.Millisecond))
	ctx := context.Background()
	long := strings.Repeat("x", 300)
	tests := []struct {
		name      string
		resources []string
		ttl       time.Duration
		opts      []redlock.LockOption
		want      string
	}{
		{"zero TTL", []string{"a"}, 0, nil, "redlock: invalid argument: TTL 0s is below the minimum 5ms"},
		{"nanosecond TTL", []string{"a"}, time.Nanosecond, nil, "redlock: invalid argument: TTL 1ns is below the minimum 5ms"},
		{"TTL below drift", []string{"a"}, 3 * time.Millisecond, nil,
			"redlock: invalid argument: TTL 3ms is too short: after the clock drift allowance of 2.03ms, " +
				"less than the minimum validity (50% of the TTL, WithMinValidity) would remain; the shortest TTL accepted is 5ms, " +
				"but a round uses up part of it: at least 209ms keeps the minimum validity even when a round takes the whole 100ms node timeout"},
		{"no resources", nil, time.Second, nil, "redlock: invalid argument: no resources: name at least one"},
		{"empty resource", []string{"a", ""}, time.Second, nil, "redlock: invalid argument: resources[1] is empty"},
		{"duplicate resource", []string{"a", "b", "a"}, time.Second, nil,
			`redlock: invalid argument: resource "a" is listed twice (resources[0] and resources[2])`},
		{"NUL in resource", []string{"a\x00b"}, time.Second, nil, `redlock: invalid argument: resource "a\x00b" contains a NUL byte`},
		{"empty owner", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithOwner("")},
			"redlock: invalid argument: owner ID (WithOwner) is empty"},
		{"long owner", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithOwner(long)},
			"redlock: invalid argument: owner ID (WithOwner) is 300 bytes, more than the maximum 256"},
		{"long metadata", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithMetadata(strings.Repeat("x", 2000))},
			"redlock: invalid argument: metadata (WithMetadata) is 2000 bytes, more than the maximum 1024"},
		{"nil option", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithMetadata("m"), nil},
			"redlock: invalid argument: option 2 of 2 is nil"},
		{"zero node timeout", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithNodeTimeout(0)},
			"redlock: invalid argument: node timeout 0s (WithNodeTimeout) is not positive"},
		{"record and owner", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithRecord("r", time.Second), redlock.WithOwner("o")},
			"redlock: invalid argument: WithRecord cannot be combined with WithOwner"},
		{"record TTL", []string{"a"}, time.Second, []redlock.LockOption{redlock.WithRecord("r", 0)},
			`redlock: invalid argument: record "r" (WithRecord): TTL 0s is below the minimum 5ms`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.TryAcquire(ctx, tt.resources, tt.ttl, tt.opts...)
			checkText(t, "TryAcquire", err, redlock.ErrInvalidArgument, tt.want)
		})
	}
	var l *redlock.Lock
	checkText(t, "Extend on a nil Lock", l.Extend(ctx, time.Second), redlock.ErrInvalidArgument,
		"redlock: invalid argument: Extend called on a nil *Lock")
	checkText(t, "Do with a nil fn", c.Do(ctx, []string{"a"}, time.Second, nil), redlock.ErrInvalidArgument,
		"redlock: invalid argument: Do called with a nil fn")
}

func TestNewErrorTexts(t *testing.T) {
	a := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	sameAddr := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { a.Close(); sameAddr.Close() })
	tests := []struct {
		name  string
		nodes []redis.UniversalClient
		opts  []redlock.Option
		want  string
	}{
		{"no nodes", nil, nil, "redlock: invalid argument: no nodes: give New at least one Redis client"},
		{"nil node", []redis.UniversalClient{a, nil}, nil, "redlock: invalid argument: nodes[1] is nil"},
		{"same address twice", []redis.UniversalClient{a, sameAddr}, nil,
			"redlock: invalid argument: nodes[0] and nodes[1] are the same node (127.0.0.1:1): each must be a separate Redis server"},
		{"drift factor", []redis.UniversalClient{a}, []redlock.Option{redlock.WithDriftFactor(0.5)},
			"redlock: invalid argument: drift factor 0.5 (WithDriftFactor) must be at least 0 and below 0.5"},
		{"minimum validity", []redis.UniversalClient{a}, []redlock.Option{redlock.WithMinValidity(1)},
			"redlock: invalid argument: minimum validity 1 (WithMinValidity) must be at least 0 and below 1"},
		{"validity left for no TTL", []redis.UniversalClient{a}, []redlock.Option{redlock.WithMinValidity(0.99)},
			"redlock: invalid argument: drift factor 0.01 (WithDriftFactor) and minimum validity 0.99 (WithMinValidity) add up to 1 or more: no TTL would leave the minimum validity"},
		{"restart gate", []redis.UniversalClient{a}, []redlock.Option{redlock.WithRestartGating(time.Microsecond)},
			"redlock: invalid argument: restart gate 1µs (WithRestartGating) is below the minimum 1ms (0 turns gating off)"},
		{"nil option", []redis.UniversalClient{a}, []redlock.Option{nil}, "redlock: invalid argument: option 1 of 1 is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := redlock.New(tt.nodes, tt.opts...)
			checkText(t, "New", err, redlock.ErrInvalidArgument, tt.want)
		})
	}
}

func TestNotAcquiredTexts(t *testing.T) {
	ms, nodes := miniNodes(t, 3)
	addrs := addrsOf(nodes)
	c := newClient(t, nodes, redlock.WithNodeTimeout(time.Second))
	ctx := context.Background()
	if _, err := c.TryAcquire(ctx, []string{"a"}, time.Second, redlock.WithMetadata("worker-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, []string{"m"}, time.Second, redlock.WithMetadata("worker-1")); err != nil {
		t.Fatal(err)
	}
	// Another program's keys on two nodes: no metadata to show.
	for _, m := range ms[:2] {
		if err := m.Set("b", "foreign"); err != nil {
			t.Fatal(err)
		}
	}
	waitSettled(t, c)

	_, err := c.TryAcquire(ctx, []string{"a"}, time.Second)
	checkText(t, "contended TryAcquire", err, redlock.ErrNotAcquired, withAddrs(
		`redlock: lock "a" not acquired: 0 of 3 nodes granted, quorum is 2: `+
			`{0} held by "worker-1"; {1} held by "worker-1"; {2} held by "worker-1"`, addrs))

	_, err = c.TryAcquire(ctx, []string{"b"}, time.Second)
	checkText(t, "TryAcquire held on two nodes", err, redlock.ErrNotAcquired, withAddrs(
		`redlock: lock "b" not acquired: 1 of 3 nodes granted, quorum is 2: `+
			`{0} held by another owner; {1} held by another owner; {2} granted (released again)`, addrs))

	_, err = c.TryAcquire(ctx, []string{"m", "n"}, time.Second)
	checkText(t, "contended TryAcquire of two resources", err, redlock.ErrNotAcquired, withAddrs(
		`redlock: lock "m", "n" not acquired: 0 of 3 nodes granted, quorum is 2: `+
			`{0} "m" held by "worker-1" for another 1s; {1} "m" held by "worker-1" for another 1s; {2} "m" held by "worker-1" for another 1s`, addrs))

	// Acquire's rounds are decided as soon as two nodes refused: the third
	// answer may come after that, or be cut short when ctx ends.
	node := `(?:held by "worker-1" for another 1s|not waited for: the other nodes' answers had decided the outcome|` +
		`cut short by the caller's context \(context deadline exceeded\))`
	all3 := `{0} ` + node + `; {1} ` + node + `; {2} ` + node
	stop := redlock.WithRetry(func() backoff.BackOff { return &backoff.StopBackOff{} })
	_, err = c.Acquire(ctx, []string{"m"}, time.Second, stop)
	checkPattern(t, "Acquire whose retry policy gave up", err, redlock.ErrNotAcquired, withAddrs(
		`redlock: lock "m" not acquired: the retry policy \(WithRetry\) gave up; the attempt: 0 of 3 nodes granted, quorum is 2: `+all3,
		quoteAll(addrs)))

	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Acquire(dctx, []string{"m"}, time.Second, redlock.WithRetry(fastRetry))
	checkPattern(t, "Acquire until ctx ended", err, context.DeadlineExceeded, withAddrs(
		`redlock: lock "m" not acquired after \d+ attempts: context deadline exceeded; last attempt: 0 of 3 nodes granted, quorum is 2: `+all3,
		quoteAll(addrs)))
	if !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("Acquire until ctx ended = %v, want it to match ErrNotAcquired too", err)
	}
}

// duration matches a printed time.Duration of at least a millisecond.
const duration = `[0-9.]+m?s`

// quoteAll returns the addresses quoted for a regular expression.
func quoteAll(addrs []string) []string {
	q := make([]string, len(addrs))
	for i, a := range addrs {
		q[i] = regexp.QuoteMeta(a)
	}
	return q
}

func TestLockLostTexts(t *testing.T) {
	ms, nodes := miniNodes(t, 1)
	addrs := addrsOf(nodes)
	c := newClient(t, nodes)
	ctx := context.Background()

	// The keys expired on the node, the local validity has not ended.
	l, err := c.TryAcquire(ctx, []string{"a"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ms[0].FastForward(11 * time.Second)
	checkText(t, "Extend of an expired lock", l.Extend(ctx, 10*time.Second), redlock.ErrLockLost, withAddrs(
		`redlock: lock "a" lost: 0 of 1 node extended, quorum is 1: {0} no longer held this lock (its keys are set there again)`, addrs))
	checkText(t, "Extend of a lost lock", l.Extend(ctx, 10*time.Second), redlock.ErrLockLost,
		`redlock: lock "a" was already lost`)
	waitSettled(t, c)
	// Its validity has not ended: the release says what happened before.
	checkText(t, "Release after a failed Extend", l.Release(ctx), redlock.ErrLockLost, withAddrs(
		`redlock: lock "a" was already lost (an Extend found too few nodes still holding it); the release deleted its keys on the nodes that answered and still held them: `+
			`0 of 1 node released, quorum is 1: {0} no longer holds this lock`, addrs))
	if ms[0].Exists("a") {
		t.Error(`key "a" that the losing extension set again is still there`)
	}

	// The local validity has ended. (A 20 ms TTL failed under load: its
	// grant had to leave 10 ms of validity.)
	l, err = c.TryAcquire(ctx, []string{"b"}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(l.Until()) + 10*time.Millisecond)
	checkPattern(t, "Extend after Until", l.Extend(ctx, time.Second), redlock.ErrLockLost,
		`redlock: lock "b" lost: its validity ended `+duration+` ago`)

	l, err = c.TryAcquire(ctx, []string{"c"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("second Release = %v, want nil", err)
	}
	checkText(t, "Extend after Release", l.Extend(ctx, time.Second), redlock.ErrLockLost, `redlock: lock "c" was already released`)
}

func TestClosedTexts(t *testing.T) {
	_, nodes := miniNodes(t, 1)
	c, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"a"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	closeClient(t, c)
	_, err = c.TryAcquire(ctx, []string{"b"}, time.Second)
	checkText(t, "TryAcquire after Close", err, redlock.ErrClosed, `redlock: lock "b" not acquired: the client is closed`)
	checkText(t, "Extend after Close", l.Extend(ctx, time.Second), redlock.ErrClosed, `redlock: lock "a" not extended: the client is closed`)
	checkText(t, "Release after Close", l.Release(ctx), redlock.ErrClosed,
		`redlock: lock "a" not released: the client is closed; its keys expire with their TTL`)
	_, _, err = c.HolderMetadata(ctx, "a")
	checkText(t, "HolderMetadata after Close", err, redlock.ErrClosed, `redlock: holder of "a" unknown: the client is closed`)
}

// TestUnavailableTexts freezes two of three real Redis servers: their
// calls time out.
func TestUnavailableTexts(t *testing.T) {
	cl := redlocktest.Start(t, 3)
	addrs := cl.Addrs()
	c := newClient(t, cl.Clients(t), redlock.WithNodeTimeout(100*time.Millisecond))
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, []string{"k"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitSettled(t, c)
	for _, s := range cl[1:] {
		s.Stop(t)
		t.Cleanup(func() { s.Cont(t) }) // before the Client's Close
	}
	const down = `{1} no answer within the 100ms node timeout; {2} no answer within the 100ms node timeout`

	_, err = c.TryAcquire(ctx, []string{"a"}, time.Second)
	checkText(t, "TryAcquire with 2 of 3 nodes down", err, redlock.ErrUnavailable, withAddrs(
		`redlock: lock "a" not acquired: 1 of 3 nodes granted, quorum is 2, too many nodes failed: {0} granted (released again); `+down, addrs))
	if !errors.Is(err, redlock.ErrNotAcquired) {
		t.Errorf("TryAcquire with 2 of 3 nodes down = %v, want it to match ErrNotAcquired too", err)
	}

	_, _, err = c.HolderMetadata(ctx, "a")
	checkText(t, "HolderMetadata with 2 of 3 nodes down", err, redlock.ErrUnavailable, withAddrs(
		`redlock: holder of "a" unknown: 1 of 3 nodes answered, quorum is 2, too many nodes failed: {0} answered; `+down, addrs))

	// Keep gives up a tenth of the TTL before the validity ends, with or
	// without an extension still waiting for the nodes; with a 1 s TTL and
	// a 100 ms node timeout, extensions have failed before that.
	kctx, stopKeep := l.Keep(ctx)
	<-kctx.Done()
	lost := stopKeep()
	checkPattern(t, "Keep's loss", lost, redlock.ErrLockLost, withAddrs(
		`redlock: lock "k" lost: (?:no extension reached a quorum|an extension was still waiting for the nodes) `+
			`(?:and its validity ends in `+duration+`|before its validity ended `+duration+` ago); `+
			`the last extension failed: 1 of 3 nodes extended, quorum is 2, too many nodes failed: {0} extended; `+down,
		quoteAll(addrs)))
	if cause := context.Cause(kctx); cause != lost {
		t.Errorf("Keep's context ended with %v, want its loss %v", cause, lost)
	}
}

// TestQuorumErrorTexts pins the words for every outcome, on QuorumErrors
// built from their exported fields.
func TestQuorumErrorTexts(t *testing.T) {
	tests := []struct {
		name string
		err  *redlock.QuorumError
		want string
	}{
		{"the doc example", &redlock.QuorumError{Op: "acquire", Resources: []string{"a"}, Quorum: 2, Nodes: []redlock.NodeResult{
			{Node: 0, Addr: "10.0.0.1:6379", Outcome: redlock.OutcomeOK},
			{Node: 1, Addr: "10.0.0.2:6379", Outcome: redlock.OutcomeHeld, Holder: "worker-2", Resource: "a", HolderTTL: 850 * time.Millisecond},
			{Node: 2, Addr: "10.0.0.3:6379", Outcome: redlock.OutcomeTimeout, Err: context.DeadlineExceeded},
		}}, `redlock: lock "a" not acquired: 1 of 3 nodes granted, quorum is 2: 10.0.0.1:6379 granted (released again); ` +
			`10.0.0.2:6379 held by "worker-2" for another 850ms; 10.0.0.3:6379 no answer in time (context deadline exceeded)`},
		{"pending, error and gated", &redlock.QuorumError{Op: "extend", Resources: []string{"a", "b"}, Quorum: 2, Nodes: []redlock.NodeResult{
			{Node: 0, Addr: "10.0.0.1:6379", Outcome: redlock.OutcomeHeld},
			{Node: 1, Addr: "10.0.0.2:6379", Outcome: redlock.OutcomeError, Err: errors.New("ERR boom")},
			{Node: 2, Addr: "10.0.0.3:6379", Outcome: redlock.OutcomeGated},
			{Node: 3, Outcome: redlock.OutcomePending},
		}}, `redlock: lock "a", "b" not extended: 0 of 4 nodes extended, quorum is 2: 10.0.0.1:6379 no longer holds this lock; ` +
			`10.0.0.2:6379 failed: ERR boom; 10.0.0.3:6379 not voting yet: it has no restart-gate marker (a new node, or one that lost its data) and waits out its restart gate (WithRestartGating); ` +
			`node 3 not waited for: the other nodes' answers had decided the outcome`},
		{"fencing", &redlock.QuorumError{Op: "fence", Resources: []string{"a"}, Quorum: 1, Nodes: []redlock.NodeResult{
			{Node: 0, Addr: "10.0.0.1:6379", Outcome: redlock.OutcomeHeld},
		}}, `redlock: lock "a" not acquired: 0 of 1 node recorded the fencing token, quorum is 1: ` +
			`10.0.0.1:6379 has a larger fencing token from another acquisition`},
	}
	granted := []redlock.NodeResult{{Node: 0, Addr: "10.0.0.1:6379", Outcome: redlock.OutcomeOK}}
	weak := &redlock.QuorumError{Op: "acquire", Resources: []string{"a"}, Quorum: 1, Nodes: granted}
	redlock.SetWeakGrant(weak, 1200*time.Microsecond, 500*time.Millisecond)
	late := &redlock.QuorumError{Op: "acquire", Resources: []string{"a"}, Quorum: 1, Nodes: granted}
	redlock.SetWeakGrant(late, -3*time.Millisecond, 500*time.Millisecond)
	tests = append(tests, []struct {
		name string
		err  *redlock.QuorumError
		want string
	}{
		{"too little validity", weak, `redlock: lock "a" not acquired: 1 of 1 node granted, quorum is 1, but only 1.2ms of validity remained, ` +
			`below the minimum 500ms (use a longer TTL or a lower WithMinValidity): 10.0.0.1:6379 granted (released again)`},
		{"no validity", late, `redlock: lock "a" not acquired: 1 of 1 node granted, quorum is 1, but no validity remained, ` +
			`the minimum is 500ms (use a longer TTL or a lower WithMinValidity): 10.0.0.1:6379 granted (released again)`},
	}...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() reads\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}
