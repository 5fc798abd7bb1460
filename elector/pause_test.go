package elector_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// pauseHelperEnv, when set to the nodes' addresses, makes
// TestPausedLeaderHelper the leader that TestPausedLeaderSeesItsLossAtOnce
// pauses.
const pauseHelperEnv = "SCHEDLOCK_PAUSED_LEADER_NODES"

// TestPausedLeaderSeesItsLossAtOnce: a leader whose process is paused
// (SIGSTOP) past its lease, once resumed, could read its leadership
// context as live while IsLeader already said no, until the renewal
// goroutine ran. The leader here runs in a child process whose task checks
// IsLeader in a loop; after the pause, the first "no" must come with a
// cancelled context, and another candidate leads meanwhile.
func TestPausedLeaderSeesItsLossAtOnce(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPausedLeaderHelper$")
		cmd.Env = append(os.Environ(), pauseHelperEnv+"="+strings.Join(cl.Addrs(), ","))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		next := func() string {
			if !lines.Scan() {
				t.Fatalf("round %d: the leader process ended: %v", round, lines.Err())
			}
			return lines.Text()
		}
		if l := next(); l != "leading" {
			t.Fatalf("round %d: leader process said %q", round, l)
		}
		_ = cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(400 * time.Millisecond) // past the lease's TTL
		// Another candidate of the same election takes over.
		w := &windows{}
		other := startCandidate(t, cl, "other", w, elector.WithLeaseTTL(300*time.Millisecond))
		waitLeader(t, []*candidate{other}, 5*time.Second)
		_ = cmd.Process.Signal(syscall.SIGCONT)
		if l := next(); l != "consistent" {
			t.Errorf("round %d: after the pause: %s", round, l)
		} else if l := next(); !pausedCause.MatchString(l) {
			t.Errorf("round %d: the leadership context ended with\n%s\nwant a line matching\n%s", round, l, pausedCause)
		}
		other.stop()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
}

// pausedCause matches the cause of the paused leader's context, as the
// helper prints it: IsLeader's, or the renewal's when it ran first (as a
// rule: "no extension reached a quorum before its validity ended 116ms ago
// (was the process paused?)"), and no monotonic clock reading ("m=+").
var pausedCause = regexp.MustCompile(`^cause: (?:elector: leadership of "test" lost: the lease's validity ended [0-9.]+m?s ago, ` +
	`before a renewal \(was the process paused\?\)|` +
	`redlock: lock "schedlock:elector:test" lost: [^=]+)$`)

// TestPausedLeaderHelper is the child process of
// TestPausedLeaderSeesItsLossAtOnce; it does nothing in a normal run.
func TestPausedLeaderHelper(t *testing.T) {
	addrs := os.Getenv(pauseHelperEnv)
	if addrs == "" {
		t.Skip("helper process of TestPausedLeaderSeesItsLossAtOnce")
	}
	var nodes []redis.UniversalClient
	for _, a := range strings.Split(addrs, ",") {
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: a}))
	}
	c, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	var e *elector.Elector
	e, err = elector.New(c, "test", elector.WithLeaseTTL(300*time.Millisecond),
		elector.OnStartedLeading(func(ctx context.Context) {
			fmt.Println("leading")
			for e.IsLeader(ctx) == nil {
				time.Sleep(50 * time.Microsecond)
			}
			if ctx.Err() == nil {
				fmt.Println("IsLeader said no while the leadership context was live")
			} else {
				fmt.Println("consistent")
				fmt.Println("cause:", context.Cause(ctx))
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Run(context.Background()) // killed by the parent
}
