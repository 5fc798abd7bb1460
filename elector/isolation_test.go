package elector_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestTakeoverAfterBackToBackIsolations: the leader's links are cut (all
// of them black holes), the other candidate takes over; the first one's
// links heal as the second's are cut, and it takes over in turn. Each
// takeover stays within docs/election.md's figure for a crash (TTL +
// retry period + 0.7 s). The resignation of a leader that lost its
// links went into the black hole and held its nodes' later commands for
// go-redis's 5 s read timeout after they healed, so the second takeover
// took about 3.5 s.
func TestTakeoverAfterBackToBackIsolations(t *testing.T) {
	t.Parallel()
	cl := redlocktest.Start(t, 3)
	const ttl, retry = time.Second, 100 * time.Millisecond
	const margin = 700 * time.Millisecond // loaded 2-core CI machine, as in election.md
	w := &windows{}
	opts := []elector.Option{elector.WithLeaseTTL(ttl), elector.WithRetryPeriod(retry)}
	cands := map[*candidate][]*redlocktest.Proxy{}
	var all []*candidate
	for _, id := range []string{"a", "b"} {
		var clients []redis.UniversalClient
		var proxies []*redlocktest.Proxy
		for _, s := range cl {
			p := redlocktest.NewProxy(t, s.Addr())
			clients = append(clients, redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true}))
			proxies = append(proxies, p)
		}
		c := startCandidateOn(t, clients, id, w, opts...)
		cands[c], all = proxies, append(all, c)
	}
	cut := func(c *candidate, on bool) {
		for _, p := range cands[c] {
			p.Blackhole(on)
		}
	}
	leader := waitLeader(t, all, 3*time.Second)
	var took []time.Duration
	for range 4 {
		other := all[0]
		if other == leader {
			other = all[1]
		}
		cut(other, false) // back to back: the last one cut heals as this one is cut
		cut(leader, true)
		start := time.Now()
		waitLeader(t, []*candidate{other}, 10*time.Second)
		d := time.Since(start)
		took = append(took, d.Round(time.Millisecond))
		if d > ttl+retry+margin {
			t.Errorf("takeover after the leader's isolation took %v, want within TTL %v + retry %v + %v", d, ttl, retry, margin)
		}
		leader = other
	}
	cut(all[0], false)
	cut(all[1], false)
	t.Logf("takeovers: %v", took)
	checkNoOverlap(t, w.list())
}
