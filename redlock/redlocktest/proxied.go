package redlocktest

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// ProxiedClients starts one Proxy in front of each server, in order, and
// returns a new go-redis client per server that connects through its
// proxy, with the same options as Server.Client (go-redis defaults except
// Addr), together with the proxies, so that a test can inject faults on
// the links of this one client set: latency, black holes, one-way
// partitions, held replies. Server faults (Stop, Kill, Restart) still
// apply; a proxy in front of a killed server closes the connections it
// accepts until the server is back. The clients are closed, then the
// proxies, when the test ends. It must be called from the test's goroutine.
func (c Cluster) ProxiedClients(t testing.TB) ([]redis.UniversalClient, []*Proxy) {
	t.Helper()
	clients := make([]redis.UniversalClient, len(c))
	proxies := make([]*Proxy, len(c))
	for i, s := range c {
		proxies[i] = NewProxy(t, s.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: proxies[i].Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		clients[i] = rdb
	}
	return clients, proxies
}
