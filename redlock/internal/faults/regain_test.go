package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

// TestRedisBareQuorumHoldSurvivesANode: a holder granted by a bare quorum
// (its link to one node cut while it acquires) regains the missing key at
// its next extension, so that its hold survives one more node of three
// cut off for 2 TTLs, as a hold granted by every node does; contenders
// meanwhile never hold the resource with it (the checker).
func TestRedisBareQuorumHoldSurvivesANode(t *testing.T) {
	sc := newScenario(t, "bare-quorum hold, then one more node cut for 2 TTLs", "redis", false)
	const ttl = time.Second
	var survived, seeds counter
	sc.seeds(2, 20, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 3)
		// ContextTimeoutEnabled: without it, the acquire dropped on the
		// cut link holds that node's later calls for go-redis's 5 s read
		// timeout, and nothing reaches it within a TTL.
		var clients []redis.UniversalClient
		var links []*redlocktest.Proxy
		for _, s := range w.cl {
			p := redlocktest.NewProxy(t, s.Addr())
			rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			clients, links = append(clients, rdb), append(links, p)
		}
		holder := newLocks(t, clients)
		warmUp(t, holder, ttl)
		missing := r.IntN(3)
		cut := (missing + 1 + r.IntN(2)) % 3 // a node of the bare quorum
		h := &History{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		links[missing].Partition(redlocktest.BothDirections)
		lost := runHolder(t, ctx, holder, h, "bare", ttl, &wg)
		// The holder's acquire to the cut node ends at the node timeout:
		// heal only after it has surely gone into the black hole.
		time.Sleep(5 * holder.NodeTimeout())
		links[missing].Heal()
		key := keyPrefix + "bare"
		if n := w.cl[missing].Client(t).Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("node %d has the key: the hold was not granted by a bare quorum", missing)
		}
		regained := waitFor(ttl, func() bool { return w.cl[missing].Client(t).Exists(ctx, key).Val() == 1 })
		stats := &contenderStats{}
		var cs []*contender
		for i := range 2 {
			cs = append(cs, &contender{name: fmt.Sprintf("c%d", i), locks: newLocks(t, w.clients()), h: h,
				resource: "bare", ttl: ttl, pause: 10 * time.Millisecond, stats: stats,
				hold: func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(5)) * time.Millisecond }})
		}
		cr := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		wg.Go(func() { runContenders(ctx, cr, cs) })
		links[cut].Partition(redlocktest.BothDirections)
		var loss *holderLoss
		select {
		case l := <-lost:
			loss = &l
		case <-time.After(2 * ttl):
		}
		links[cut].Heal()
		cancel()
		wg.Wait()
		sc.add(stats.snapshot().grants+1, 2, 0)
		seeds.Add(1)
		switch {
		case !regained:
			t.Errorf("node %d never regained the hold's key within a TTL", missing)
		case loss != nil:
			t.Errorf("the hold (missing node %d regained) ended with node %d cut: %v", missing, cut, loss.cause)
		default:
			survived.Add(1)
		}
		requireOK(t, sc.checkHistory(t, h))
	})
	sc.metric("holds that survived the cut node", "%d of %d", survived.Load(), seeds.Load())
}
