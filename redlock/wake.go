package redlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Wake on release. A contended Acquire does not only sleep out its retry
// delay: the release script publishes a notice on "<key>:released" on every
// node where it deletes the key and a waiter marked it (see releaseScript:
// the acquire script of an Acquire marks the key that refuses it), and an
// Acquire that lost a round waits for whichever comes first, its retry
// delay or a notice for one of its keys. The delay stays the fallback for what
// publishes nothing (a key that expires, a lost notice, a node whose
// subscription is down, a release of a key no waiter's round has met and
// marked yet), so waking changes no outcome, only when the next round
// starts. (Redisson does the same for its single-node locks.)
//
// One waker per Client holds the keys its Acquire calls wait for. While at
// least one key is wanted, each node has a subscriber: one goroutine that
// applies (UN)SUBSCRIBE and one that receives, on a PubSub connection of
// that node's client; they stop as soon as no Acquire waits any more, so a
// Client still starts nothing while it is not contended. A node that is
// down or stopped only delays its own subscriber; the receiving goroutine
// retries every wakeRetry, go-redis re-subscribing on the new connection.
//
// A Release reaches a waiter once per node, each notice carrying an ID of
// the released lock. The key counts as released once notices of one lock
// have come from a quorum of nodes: before that, a round would find the key
// still held on the others, lose and sleep. Each such release wakes one
// sleeping Acquire of this Client (first come, first woken), so that
// waiters in one process do not all race for the lock and split the nodes'
// votes; an Acquire whose round was running when the release came starts
// its next round at once instead of sleeping. Undo rounds publish nothing:
// the partial grants of a split vote are cleaned up on some nodes only, and
// counting them woke waiters for locks still held elsewhere; after a split
// vote the retry delays take over.

// recentReleases is how many released locks per key are remembered, to
// count the notices of one release from several nodes.
const recentReleases = 4

// releasedSuffix turns a lock key into the channel of its release notices.
const releasedSuffix = ":released"

// maxNoticeWait bounds how long a waiter relies on release notices alone
// (see sleep): the longest a lost notice can delay it.
const maxNoticeWait = time.Second

// wakeRetry is the pause of a node's subscriber after a failed receive
// (node down, connection lost), before go-redis reconnects; it doubles
// with each failure in a row, up to maxWakeRetry, so that a dead node is
// not dialled ten times a second.
const (
	wakeRetry    = 100 * time.Millisecond
	maxWakeRetry = 2 * time.Second
)

type waker struct {
	c     *Client
	mu    sync.Mutex
	keys  map[string]*keyWatch // by channel
	nodes []*nodeSub           // per node; nil when not running
}

// keyWatch is the state of one wanted channel.
type keyWatch struct {
	refs      int                         // Acquire calls waiting for it
	confirmed []bool                      // per node: the subscription is confirmed
	gen       uint64                      // releases seen
	recent    [recentReleases]releaseSeen // the last released locks
	next      int                         // where the next one goes in recent
	sleepers  []chan struct{}             // sleeping Acquire calls, first come first
}

// releaseSeen counts the nodes that sent the notice of one lock's release.
type releaseSeen struct {
	id    string
	nodes []bool
	fired bool // a quorum has been seen; later copies are ignored
}

// nodeSub subscribes one node's client to the wanted channels.
type nodeSub struct {
	kick chan struct{} // 1-buffered: the wanted channels changed
}

// watch registers an Acquire waiting for channels and returns the function
// that unregisters it. The first registration of a channel starts or kicks
// every node's subscriber.
func (w *waker) watch(channels []string) (unwatch func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = make(map[string]*keyWatch)
		w.nodes = make([]*nodeSub, len(w.c.nodes))
	}
	added := false
	for _, ch := range channels {
		kw := w.keys[ch]
		if kw == nil {
			kw = &keyWatch{}
			w.keys[ch] = kw
			added = true
		}
		kw.refs++
	}
	if added {
		w.kickLocked()
	}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		removed := false
		for _, ch := range channels {
			if kw := w.keys[ch]; kw != nil {
				if kw.refs--; kw.refs == 0 {
					delete(w.keys, ch)
					removed = true
				}
			}
		}
		if removed {
			w.kickLocked()
		}
	}
}

// kickLocked tells every node's subscriber that the wanted channels
// changed, starting those that are not running. w.mu must be held.
func (w *waker) kickLocked() {
	for i := range w.nodes {
		if w.nodes[i] == nil {
			if len(w.keys) == 0 {
				continue
			}
			s := &nodeSub{kick: make(chan struct{}, 1)}
			w.nodes[i] = s
			go w.subscribe(&w.c.nodes[i], s)
		}
		select {
		case w.nodes[i].kick <- struct{}{}:
		default:
		}
	}
}

// gen returns the number of releases seen so far on channels (0 for those
// no Acquire waits for).
func (w *waker) gen(channels []string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var g uint64
	for _, ch := range channels {
		if kw := w.keys[ch]; kw != nil {
			g += kw.gen
		}
	}
	return g
}

// sleep waits until d has passed, a release on channels wakes this caller,
// or ctx ends; it returns at once when a release came after gen was read
// (the caller's round may have missed it). The caller must be watching
// channels.
//
// While every node has confirmed the subscription to every channel, a
// release will wake the caller, so the retry delay only stands in for what
// publishes nothing: the holder's key expiring (expires from now, 0 when
// unknown), a lost notice, or a release of a key that none of the caller's
// rounds met (so not marked: acquireScript). The delay is then stretched to
// that expiry, at most maxNoticeWait: a waiter that lost its round does not
// poll a lock that is held for a while (Redisson waits the same way). Every node, not a
// quorum: a lock held on a bare quorum whose node then dies is released on
// fewer than a quorum of nodes, and its notices never wake anyone; the dead
// node's subscription fails too, and the waiter polls again.
func (w *waker) sleep(ctx context.Context, channels []string, gen uint64, d, expires time.Duration) {
	wake := make(chan struct{}, 1)
	w.mu.Lock()
	var g uint64
	confirmed := true
	for _, ch := range channels {
		kw := w.keys[ch]
		g += kw.gen
		confirmed = confirmed && countTrue(kw.confirmed) == len(w.c.nodes)
	}
	if g != gen {
		w.mu.Unlock()
		return
	}
	if confirmed && expires > 0 {
		d = max(d, min(expires+driftConstant, maxNoticeWait))
	}
	for _, ch := range channels {
		kw := w.keys[ch]
		kw.sleepers = append(kw.sleepers, wake)
	}
	w.mu.Unlock()
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
	}
	t.Stop()
	w.mu.Lock()
	for _, ch := range channels {
		kw := w.keys[ch]
		if i := slices.Index(kw.sleepers, wake); i >= 0 {
			kw.sleepers = slices.Delete(kw.sleepers, i, i+1)
		}
	}
	w.mu.Unlock()
}

// notify handles a release notice from node i for the lock id: once a
// quorum of nodes have sent it, the key counts as released and the
// longest-sleeping Acquire waiting for the channel wakes.
func (w *waker) notify(i int, channel, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[channel]; kw != nil {
		kw.seen(id, i, w.c)
	}
}

// released handles a Release of this Client confirmed by a quorum: its
// waiters need not wait for the notices, whose copies are then ignored.
func (w *waker) released(l *Lock, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.keys) == 0 {
		return // nobody waits: no allocation on the uncontended path
	}
	for _, ch := range l.releaseChannels() {
		if kw := w.keys[ch]; kw != nil {
			kw.seen(id, -1, w.c)
		}
	}
}

// seen records that node i (-1: a quorum at once) released lock id, and
// wakes the longest-sleeping Acquire when this makes a quorum. w.mu must be
// held.
func (kw *keyWatch) seen(id string, i int, c *Client) {
	var r *releaseSeen
	for j := range kw.recent {
		if kw.recent[j].id == id && kw.recent[j].nodes != nil {
			r = &kw.recent[j]
		}
	}
	if r == nil {
		r = &kw.recent[kw.next]
		kw.next = (kw.next + 1) % len(kw.recent)
		*r = releaseSeen{id: id, nodes: make([]bool, len(c.nodes))}
	}
	if i < 0 {
		for j := range r.nodes {
			r.nodes[j] = true
		}
	} else {
		r.nodes[i] = true
	}
	if r.fired || countTrue(r.nodes) < c.quorum {
		return
	}
	r.fired = true
	kw.gen++
	if len(kw.sleepers) > 0 {
		wake := kw.sleepers[0]
		kw.sleepers = kw.sleepers[1:]
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// subscribe keeps n's subscriptions equal to the wanted channels until none
// is wanted. It runs in its own goroutine, started by kickLocked, with a
// second one that receives (all I/O, even the first dial, happens here:
// never in an Acquire).
func (w *waker) subscribe(n *node, s *nodeSub) {
	var ps *redis.PubSub
	received, stop := make(chan struct{}), make(chan struct{})
	have := map[string]bool{}
	ctx := context.Background()
	for range s.kick {
		w.mu.Lock()
		if len(w.keys) == 0 {
			w.nodes[n.idx] = nil // a later watch starts a new subscriber
			w.mu.Unlock()
			break
		}
		var add, drop []string
		for ch := range w.keys {
			if !have[ch] {
				add = append(add, ch)
			}
		}
		for ch := range have {
			if w.keys[ch] == nil {
				drop = append(drop, ch)
			}
		}
		w.mu.Unlock()
		if ps == nil && len(add) > 0 {
			// Subscribe with a channel: a Ring needs one to pick a shard.
			ps = n.rdb.Subscribe(ctx, add...)
			go w.receive(n, ps, stop, received)
		} else if len(add) > 0 {
			_ = ps.Subscribe(ctx, add...) // on error, recorded: go-redis re-subscribes on reconnect
		}
		if len(drop) > 0 && ps != nil {
			_ = ps.Unsubscribe(ctx, drop...)
		}
		for _, ch := range add {
			have[ch] = true
		}
		for _, ch := range drop {
			delete(have, ch)
		}
	}
	if ps != nil {
		close(stop)
		_ = ps.Close()
		<-received
	}
}

// receive delivers the release notices of ps until stop is closed.
func (w *waker) receive(n *node, ps *redis.PubSub, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	ctx := context.Background()
	pause := wakeRetry
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			select {
			case <-stop:
				return
			default:
			}
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			w.c.log.Debug("redlock: release notices: receive failed; retrying", "node", n.addr, "err", err)
			w.unconfirm(n.idx) // go-redis subscribes again on its new connection
			t := time.NewTimer(pause)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			pause = min(2*pause, maxWakeRetry)
			continue
		}
		pause = wakeRetry
		switch m := msg.(type) {
		case *redis.Message:
			w.notify(n.idx, m.Channel, m.Payload)
		case *redis.Subscription:
			w.confirm(n.idx, m.Channel, m.Kind == "subscribe")
		}
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// confirm records node i's answer to (UN)SUBSCRIBE channel.
func (w *waker) confirm(i int, channel string, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw := w.keys[channel]; kw != nil {
		if kw.confirmed == nil {
			kw.confirmed = make([]bool, len(w.c.nodes))
		}
		kw.confirmed[i] = on
	}
}

// unconfirm forgets node i's subscriptions: its connection failed.
func (w *waker) unconfirm(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, kw := range w.keys {
		if kw.confirmed != nil {
			kw.confirmed[i] = false
		}
	}
}
