package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/schedlock/schedlock/redlock"
)

// Library names, in table order. floor is not a lock library: it is the
// plain parallel go-redis fan-out that bounds what a quorum lock can do.
const (
	libOurs      = "ours"
	libRedsync   = "redsync"
	libRedislock = "redislock"
	libRueidis   = "rueidislock"
	libFloor     = "floor"
)

var allLibs = []string{libOurs, libRedsync, libRedislock, libRueidis, libFloor}

// singleNode reports whether a library only works on one node.
func singleNode(name string) bool { return name == libRedislock || name == libRueidis }

// key is a lock name prepared once per goroutine, so that no adapter has to
// build a slice per call.
type key struct {
	name  string
	names []string
}

func newKey(name string) *key { return &key{name: name, names: []string{name}} }

// release ends a lock taken by acquire.
type release func(ctx context.Context) error

// lib is one lock library on a fixed set of nodes, used as its
// documentation shows.
type lib interface {
	// cycle takes k once, without waiting, and releases it.
	cycle(ctx context.Context, k *key) error
	// acquire takes k: once when wait is false, otherwise with the
	// library's own way of waiting (retry policy or notification) until it
	// holds k or ctx ends.
	acquire(ctx context.Context, k *key, wait bool) (release, error)
	// commands returns how many commands the library's clients have sent.
	commands() int64
	close()
}

// errNotSupported marks a workload a library does not take part in.
var errNotSupported = errors.New("not supported")

// ttl is the lock TTL for every library (the fairness setting).
const ttl = 10 * time.Second

// counter is a go-redis hook that counts the commands a client sends.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// goRedisClients returns one default go-redis client per address, all
// counted by cnt.
// clientCtxTimeout is -ctx-timeout: ContextTimeoutEnabled on every go-redis
// client of every library.
var clientCtxTimeout = true

func goRedisClients(addrs []string, cnt *counter) []*redis.Client {
	cs := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		cs[i] = redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: clientCtxTimeout})
		cs[i].AddHook(cnt)
	}
	return cs
}

func closeAll(cs []*redis.Client) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// newLib builds library name on addrs with fresh clients.
func newLib(name string, addrs []string) (lib, error) {
	if singleNode(name) && len(addrs) != 1 {
		return nil, errNotSupported
	}
	switch name {
	case libOurs:
		return newOurs(addrs)
	case libRedsync:
		return newRedsync(addrs), nil
	case libRedislock:
		return newRedislock(addrs[0]), nil
	case libRueidis:
		return newRueidis(addrs[0])
	case libFloor:
		return newFloor(addrs), nil
	}
	return nil, fmt.Errorf("unknown library %q", name)
}

// ours: redlock.New with default options; TryAcquire for one attempt,
// Acquire (default retry policy) to wait.
type ours struct {
	cnt counter
	rdb []*redis.Client
	c   *redlock.Client
}

func newOurs(addrs []string) (*ours, error) {
	o := &ours{}
	o.rdb = goRedisClients(addrs, &o.cnt)
	nodes := make([]redis.UniversalClient, len(o.rdb))
	for i, c := range o.rdb {
		nodes[i] = c
	}
	c, err := redlock.New(nodes)
	if err != nil {
		return nil, err
	}
	o.c = c
	return o, nil
}

func (o *ours) cycle(ctx context.Context, k *key) error {
	l, err := o.c.TryAcquire(ctx, k.names, ttl)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

func (o *ours) acquire(ctx context.Context, k *key, wait bool) (release, error) {
	var l *redlock.Lock
	var err error
	if wait {
		l, err = o.c.Acquire(ctx, k.names, ttl)
	} else {
		l, err = o.c.TryAcquire(ctx, k.names, ttl)
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return l.Release(ctx) }, nil
}

func (o *ours) commands() int64 { return o.cnt.n.Load() }
func (o *ours) close()          { closeAll(o.rdb) }

// redsyncLib: redsync.New over goredis/v9 pools; a new Mutex per lock, as
// its README shows. Default options but the TTL (WithExpiry). Waiting uses
// redsync's own retry policy (default: 32 tries, random 50-250 ms apart).
type redsyncLib struct {
	cnt  counter
	rdb  []*redis.Client
	rs   *redsync.Redsync
	opts []redsync.Option
}

func newRedsync(addrs []string) *redsyncLib {
	r := &redsyncLib{opts: []redsync.Option{redsync.WithExpiry(ttl)}}
	r.rdb = goRedisClients(addrs, &r.cnt)
	pools := make([]redsyncredis.Pool, len(r.rdb))
	for i, c := range r.rdb {
		pools[i] = goredis.NewPool(c)
	}
	r.rs = redsync.New(pools...)
	return r
}

func (r *redsyncLib) cycle(ctx context.Context, k *key) error {
	m := r.rs.NewMutex(k.name, r.opts...)
	if err := m.TryLockContext(ctx); err != nil {
		return err
	}
	return unlockRedsync(ctx, m)
}

func unlockRedsync(ctx context.Context, m *redsync.Mutex) error {
	ok, err := m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock not confirmed by a quorum")
	}
	return err
}

func (r *redsyncLib) acquire(ctx context.Context, k *key, wait bool) (release, error) {
	m := r.rs.NewMutex(k.name, r.opts...)
	var err error
	if wait {
		err = m.LockContext(ctx)
	} else {
		err = m.TryLockContext(ctx)
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return unlockRedsync(ctx, m) }, nil
}

func (r *redsyncLib) commands() int64 { return r.cnt.n.Load() }
func (r *redsyncLib) close()          { closeAll(r.rdb) }

// redislockLib: redislock.New on one go-redis client. Obtain has no retry by
// default; waiting uses its ExponentialBackoff(16 ms, 1 s) strategy (16 ms
// is the minimum its doc recommends; 1 s matches our default cap), a fresh
// one per call since the strategy keeps state.
type redislockLib struct {
	cnt counter
	rdb *redis.Client
	c   *redislock.Client
}

func newRedislock(addr string) *redislockLib {
	r := &redislockLib{}
	r.rdb = goRedisClients([]string{addr}, &r.cnt)[0]
	r.c = redislock.New(r.rdb)
	return r
}

func (r *redislockLib) cycle(ctx context.Context, k *key) error {
	l, err := r.c.Obtain(ctx, k.name, ttl, nil)
	if err != nil {
		return err
	}
	return l.Release(ctx)
}

func (r *redislockLib) acquire(ctx context.Context, k *key, wait bool) (release, error) {
	var opt *redislock.Options
	if wait {
		opt = &redislock.Options{RetryStrategy: redislock.ExponentialBackoff(16*time.Millisecond, time.Second)}
	}
	l, err := r.c.Obtain(ctx, k.name, ttl, opt)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (r *redislockLib) commands() int64 { return r.cnt.n.Load() }
func (r *redislockLib) close()          { _ = r.rdb.Close() }

// rueidisLib: rueidislock.NewLocker as its README shows for one Redis
// (KeyMajority 1, NoLoopTracking on Redis >= 7.0.5), KeyValidity = TTL.
// TryWithContext takes once; WithContext waits for client-side-caching
// invalidations (and local releases). The returned cancel releases.
type rueidisLib struct {
	cnt    atomic.Int64
	locker rueidislock.Locker
}

func newRueidis(addr string) (*rueidisLib, error) {
	r := &rueidisLib{}
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption:   rueidis.ClientOption{InitAddress: []string{addr}},
		KeyMajority:    1,
		NoLoopTracking: true,
		KeyValidity:    ttl,
		ClientBuilder: func(opt rueidis.ClientOption) (rueidis.Client, error) {
			c, err := rueidis.NewClient(opt)
			if err != nil {
				return nil, err
			}
			return &countingRueidis{Client: c, n: &r.cnt}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	r.locker = l
	return r, nil
}

func (r *rueidisLib) cycle(ctx context.Context, k *key) error {
	_, cancel, err := r.locker.TryWithContext(ctx, k.name)
	if err != nil {
		return err
	}
	cancel()
	return nil
}

func (r *rueidisLib) acquire(ctx context.Context, k *key, wait bool) (release, error) {
	var cancel context.CancelFunc
	var err error
	if wait {
		_, cancel, err = r.locker.WithContext(ctx, k.name)
	} else {
		_, cancel, err = r.locker.TryWithContext(ctx, k.name)
	}
	if err != nil {
		return nil, err
	}
	return func(context.Context) error { cancel(); return nil }, nil
}

func (r *rueidisLib) commands() int64 { return r.cnt.Load() }
func (r *rueidisLib) close()          { r.locker.Close() }

// countingRueidis counts the commands rueidislock sends through its client.
type countingRueidis struct {
	rueidis.Client
	n *atomic.Int64
}

func (c *countingRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c *countingRueidis) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.n.Add(int64(len(cmds)))
	return c.Client.DoMulti(ctx, cmds...)
}

func (c *countingRueidis) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	c.n.Add(1)
	return c.Client.DoCache(ctx, cmd, ttl)
}

func (c *countingRueidis) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	c.n.Add(int64(len(multi)))
	return c.Client.DoMultiCache(ctx, multi...)
}

// floor is the plain parallel go-redis fan-out: one goroutine per node
// sends SET NX PX and the caller waits for all; then one goroutine per node
// runs a compare-and-delete script (EVALSHA). No validity computation, no
// per-node timeout, no late-reply handling: the cost of two parallel round
// trips and nothing else.
type floor struct {
	cnt    counter
	rdb    []*redis.Client
	quorum int
}

var floorDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

var errFloorNotAcquired = errors.New("floor: not acquired")

func newFloor(addrs []string) *floor {
	f := &floor{quorum: len(addrs)/2 + 1}
	f.rdb = goRedisClients(addrs, &f.cnt)
	return f
}

func (f *floor) cycle(ctx context.Context, k *key) error {
	var b [16]byte
	_, _ = rand.Read(b[:])
	val := base64.StdEncoding.EncodeToString(b[:])
	var ok atomic.Int32
	var wg sync.WaitGroup
	for _, c := range f.rdb {
		wg.Go(func() {
			if set, err := c.SetNX(ctx, k.name, val, ttl).Result(); err == nil && set {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	for _, c := range f.rdb {
		wg.Go(func() { _ = floorDelete.Run(ctx, c, k.names, val).Err() })
	}
	wg.Wait()
	if int(ok.Load()) < f.quorum {
		return errFloorNotAcquired
	}
	return nil
}

func (f *floor) acquire(context.Context, *key, bool) (release, error) { return nil, errNotSupported }
func (f *floor) commands() int64                                      { return f.cnt.n.Load() }
func (f *floor) close()                                               { closeAll(f.rdb) }
