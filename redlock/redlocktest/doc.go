// Package redlocktest starts real redis-server processes for tests, in the
// spirit of net/http/httptest.
//
// Redlock and the packages built on it are only meaningful against real Redis
// servers that can be frozen, killed and restarted while a lock is held. This
// package gives every test its own independent redis-server child processes,
// each listening on a free port of 127.0.0.1 with its own temporary data
// directory, and removes them when the test ends. It is used by the tests of
// this module and is exported so that users can write the same kind of tests
// for their own code.
//
// # Requirements
//
// The redis-server binary (Redis 7.0 or newer) must be installed: it is looked
// up in PATH, or named by the REDIS_SERVER environment variable (a path or a
// command name). When it cannot be found, StartServer and Start fail the test
// with an install hint; they never skip it. Process control (Stop, Cont,
// Kill) uses POSIX signals, so the package is meant for Unix-like systems.
//
// # Usage
//
// A test starts as many servers as it needs, talks to them through go-redis
// clients and injects failures with Stop/Cont (SIGSTOP/SIGCONT: the process is
// frozen but its connections stay open), Kill (SIGKILL) and Restart (same port,
// same data directory):
//
//	func TestLockSurvivesOneFrozenServer(t *testing.T) {
//		cluster := redlocktest.Start(t, 3)
//		clients := cluster.Clients(t) // []redis.UniversalClient, closed at cleanup
//
//		cluster[0].Stop(t) // first server no longer answers
//		// ... acquire a lock through clients, expect success on a majority ...
//		cluster[0].Cont(t)
//
//		cluster[1].Kill(t)
//		cluster[1].Restart(t) // empty again: no persistence by default
//
//		if keys := cluster.Keys(t); len(keys[2]) != 1 {
//			t.Fatalf("server 2 keys = %q", keys[2])
//		}
//	}
//
// By default a server keeps nothing across Kill and Restart (--save ""
// --appendonly no). WithAppendOnlyFsyncAlways makes every acknowledged write
// durable, so data survives a Kill followed by Restart. WithArgs passes any
// other redis-server arguments. For faults on the links rather than the
// servers, a Proxy (NewProxy, Cluster.ProxiedClients) between a client and a
// server adds latency, black holes, one-way partitions and held replies.
//
// Every server, its clients and the goroutine that reaps its process are gone
// by the time the test's cleanup has finished, so the package can be used
// together with go.uber.org/goleak. The log of a server is written to
// redis.log in its data directory, and its tail is included in the failure
// message when a server does not start.
package redlocktest
