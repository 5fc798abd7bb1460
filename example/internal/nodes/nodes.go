// Package nodes gives the example programs their Redis nodes: the ones a
// -redis flag names, or three embedded miniredis nodes, so that the
// examples run on a machine without Redis.
package nodes

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Set is the Redis nodes of one example run.
type Set struct {
	// Addrs are the nodes' "host:port" addresses.
	Addrs    []string
	embedded []*miniredis.Miniredis // nil for nodes given by -redis
}

// ParseAddrs parses a -redis list ("host:port,host:port,..."); "" gives
// none. Errors name the list and the bad entry: a missing or bad port, an
// empty host, a node listed twice (Redlock needs independent nodes).
func ParseAddrs(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var addrs []string
	seen := make(map[string]bool)
	for a := range strings.SplitSeq(list, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("-redis %q: node %q: %w", list, a, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("-redis %q: node %q: port %q is not a number from 1 to 65535", list, a, port)
		}
		if host == "" {
			return nil, fmt.Errorf("-redis %q: node %q: empty host", list, a)
		}
		if seen[a] {
			return nil, fmt.Errorf("-redis %q: node %q is listed twice; Redlock needs independent nodes", list, a)
		}
		seen[a] = true
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// Start returns the nodes of addrs, or three new miniredis nodes when addrs
// is empty. Embedded nodes expire keys with the wall clock, as Redis does
// (miniredis keeps TTLs frozen unless told otherwise; a crashed holder's
// lock would then never expire). Close stops them.
func Start(addrs []string) (*Set, error) {
	if len(addrs) > 0 {
		return &Set{Addrs: addrs}, nil
	}
	s := &Set{}
	for range 3 {
		m := miniredis.NewMiniRedis()
		if err := m.Start(); err != nil {
			s.Close()
			return nil, fmt.Errorf("start miniredis: %w", err)
		}
		m.ClockTTL(true)
		s.embedded = append(s.embedded, m)
		s.Addrs = append(s.Addrs, m.Addr())
	}
	return s, nil
}

// Embedded reports whether the nodes are embedded miniredis nodes.
func (s *Set) Embedded() bool { return len(s.embedded) > 0 }

// Close stops the embedded nodes; nodes given by -redis are left alone.
func (s *Set) Close() {
	for _, m := range s.embedded {
		m.Close()
	}
}

// Ping fails early, naming the node, when a node does not answer PING
// within 2 s.
func (s *Set) Ping(ctx context.Context) error {
	for _, a := range s.Addrs {
		rdb := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		_ = rdb.Close()
		if err != nil {
			return fmt.Errorf("redis node %s does not answer PING: %w", a, err)
		}
	}
	return nil
}
