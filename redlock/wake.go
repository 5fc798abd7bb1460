package redlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/tracing"
)

// Wake on release (WithReleaseNotices). An Acquire that a holder refused
// marks the holder's key (scripts/acquire.lua), and the holder's Release
// then publishes a notice on "<key>:released" on every node where it
// deletes the key. The waiting Acquire starts its next round when notices
// of one release have come from a quorum of nodes, instead of sleeping out
// its retry delay, which stays the fallback for what publishes nothing (a
// key that expires, a lost notice). Waking changes no outcome, only when
// the next round starts. Each release wakes one sleeping Acquire of this
// Client, first come first woken, so that waiters in one process do not
// split the nodes' votes between them.
//
// Only a quorum that reports one holder makes a waiter rely on notices:
// its delay is then stretched to that holder's expiry (at most
// maxNoticeWait) once every node has confirmed the subscription. After a
// split vote (contenders that each won a minority, and undo their partial
// grants without a notice) the retry delay alone paces the next round.
//
// From the first Acquire that waits until Close, each node has one
// subscriber: a PubSub connection of the node's client with one pattern
// subscription, "<prefix>*:released", and a goroutine that receives on it.
// Notices of keys that no Acquire of this Client waits for are dropped.

const (
	// maxNoticeWait bounds how long a waiter relies on notices alone: the
	// longest a lost notice can delay it.
	maxNoticeWait = time.Second
	// wakeRetry is a subscriber's pause after a failed receive (node down,
	// connection lost); it doubles with each failure in a row, up to
	// maxWakeRetry.
	wakeRetry    = 100 * time.Millisecond
	maxWakeRetry = 2 * time.Second
	// maxNotices bounds the releases remembered per watched key, to count
	// the notices of one release from several nodes.
	maxNotices = 16
)

type waker struct {
	c       *Client
	off     bool
	pattern string // the subscribers' pattern

	mu      sync.Mutex
	keys    map[string]*keyWatch // by channel
	ready   []bool               // per node: the subscription is confirmed
	subs    []*redis.PubSub      // per node, once its subscriber has one
	started bool
	closed  bool
	stop    chan struct{} // closed by close
	wg      sync.WaitGroup
}

// keyWatch is the state of one watched channel.
type keyWatch struct {
	refs     int             // Acquire calls watching it
	gen      uint64          // releases seen
	notices  map[string]int  // per release: nodes that sent its notice
	sleepers []chan struct{} // sleeping Acquire calls, first come first
}

func newWaker(c *Client) *waker {
	return &waker{c: c, off: c.cfg.noWake, pattern: globEscape(c.cfg.keyPrefix) + "*" + releasedSuffix,
		keys: map[string]*keyWatch{}, ready: make([]bool, len(c.peers)), subs: make([]*redis.PubSub, len(c.peers)),
		stop: make(chan struct{})}
}

// globEscape escapes the bytes that Redis glob patterns give a meaning to
// (a key prefix is any bytes, not necessarily UTF-8).
func globEscape(s string) string {
	var b strings.Builder
	for i := range len(s) {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// noticeID returns the payload of a release notice of value, the same on
// every node, which says nothing about the owner token; "" with notices
// off (the release then publishes nothing).
func (w *waker) noticeID(value string) string {
	if w.off {
		return ""
	}
	sum := sha256.Sum256([]byte(value))
	return hex.EncodeToString(sum[:8])
}

// waiter is one Acquire's use of release notices.
type waiter struct {
	w        *waker
	l        *Lock
	channels []string // nil until it watches
	gen      uint64   // releases seen before the current attempt
}

func (w *waker) waiter(l *Lock) *waiter { return &waiter{w: w, l: l} }

// beforeAttempt records the releases seen so far, so that sleep returns at
// once for a release that came during the attempt.
func (wt *waiter) beforeAttempt() {
	if wt.channels != nil {
		wt.gen = wt.w.gen(wt.channels)
	}
}

// sleep waits after a failed attempt q: d, or until a release of the keys
// wakes it, or until ctx ends, in a wait span. It starts watching the keys
// the first time a holder refused.
func (wt *waiter) sleep(ctx context.Context, q *QuorumError, d time.Duration) {
	w := wt.w
	if !w.off && wt.channels == nil && q.Count(OutcomeHeld) > 0 {
		wt.channels = make([]string, wt.l.n)
		for i, k := range wt.l.keys[:wt.l.n] {
			wt.channels[i] = k + releasedSuffix
		}
		// Only releases from now on wake this waiter: the channels may have
		// seen releases for another waiter of this Client before.
		wt.gen = w.watch(wt.channels)
	}
	if wt.channels == nil {
		wt.wait(ctx, q, d, nil, false)
		return
	}
	wake := make(chan struct{}, 1)
	w.mu.Lock()
	var g uint64
	for _, ch := range wt.channels {
		kw := w.keys[ch]
		g += kw.gen
		kw.sleepers = append(kw.sleepers, wake)
	}
	released := g != wt.gen // a release came during the attempt
	if released {
		d = 0
	} else if expires, ok := oneHolder(q); ok && !slices.Contains(w.ready, false) {
		d = max(d, min(expires+driftConstant, maxNoticeWait))
	}
	w.mu.Unlock()
	wt.wait(ctx, q, d, wake, released)
	w.mu.Lock()
	for _, ch := range wt.channels {
		kw := w.keys[ch]
		if i := slices.Index(kw.sleepers, wake); i >= 0 {
			kw.sleepers = slices.Delete(kw.sleepers, i, i+1)
		}
	}
	w.mu.Unlock()
}

// wait sleeps d, or until wake or ctx, in a wait span that says what
// ended it; released says that a release came before the wait began.
func (wt *waiter) wait(ctx context.Context, q *QuorumError, d time.Duration, wake <-chan struct{}, released bool) {
	span := wt.w.c.tel.startWait(ctx, q, d)
	endedBy := sleep(ctx, d, wake)
	if released {
		endedBy = tracing.WaitEndedByNotice
	}
	endWait(span, endedBy)
}

// stop ends the waiter's watch.
func (wt *waiter) stop() {
	if wt.channels != nil {
		wt.w.unwatch(wt.channels)
	}
}

// sleep waits d, or until wake or ctx, and says which ended it (a
// tracing.WaitEndedBy* value).
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (endedBy string) {
	if d <= 0 {
		return tracing.WaitEndedByBackoff
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return tracing.WaitEndedByBackoff
	case <-wake:
		return tracing.WaitEndedByNotice
	case <-ctx.Done():
		return tracing.WaitEndedByCtx
	}
}

// quorumHolder returns the result of a node that refused q for the holder
// a quorum of q's nodes named (the same lock value), if there is one.
func quorumHolder(q *QuorumError) (NodeResult, bool) {
	votes := map[string]int{}
	for _, r := range q.Nodes {
		if r.Outcome == OutcomeHeld && r.value != "" {
			votes[r.value]++
			if votes[r.value] >= q.Quorum {
				return r, true
			}
		}
	}
	return NodeResult{}, false
}

// oneHolder returns the shortest TTL left of the holder's key when a quorum
// of q's nodes refused for one lock (the same value): a holder to wait for.
func oneHolder(q *QuorumError) (expires time.Duration, ok bool) {
	h, ok := quorumHolder(q)
	if !ok {
		return 0, false
	}
	for _, r := range q.Nodes {
		if r.value == h.value && r.HolderTTL > 0 && (expires == 0 || r.HolderTTL < expires) {
			expires = r.HolderTTL
		}
	}
	return expires, expires > 0
}

// watch registers an Acquire waiting for channels, starts the subscribers
// if they are not running, and returns the releases seen so far on
// channels.
func (w *waker) watch(channels []string) (gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range channels {
		kw := w.keys[ch]
		if kw == nil {
			kw = &keyWatch{notices: map[string]int{}}
			w.keys[ch] = kw
		}
		kw.refs++
		gen += kw.gen
	}
	if !w.started && !w.closed {
		w.started = true
		for i, p := range w.c.peers {
			w.wg.Go(func() { w.subscribe(i, p) })
		}
	}
	return gen
}

// unwatch undoes watch.
func (w *waker) unwatch(channels []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range channels {
		if kw := w.keys[ch]; kw != nil {
			if kw.refs--; kw.refs == 0 {
				delete(w.keys, ch)
			}
		}
	}
}

// close stops every subscriber and waits for their goroutines.
func (w *waker) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.stop)
		for _, ps := range w.subs {
			if ps != nil {
				_ = ps.Close()
			}
		}
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// gen returns the number of releases seen so far on channels.
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

// released records a Release of this Client confirmed by a quorum: its
// waiters need not wait for the notices, whose copies are then ignored.
func (w *waker) released(lockKeys []string, id string) {
	if w.off {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range lockKeys {
		if kw := w.keys[k+releasedSuffix]; kw != nil && kw.notices[id] < w.c.quorum {
			kw.notices[id] = w.c.quorum - 1 // a quorum at once, if the notices had not made one
			kw.notice(id, w.c.quorum)
		}
	}
}

// notice counts one node's notice of release id and, when that makes a
// quorum, wakes the longest-sleeping Acquire; later copies count past the
// quorum and wake nothing. w.mu is held.
func (kw *keyWatch) notice(id string, quorum int) {
	if _, ok := kw.notices[id]; !ok && len(kw.notices) >= maxNotices {
		clear(kw.notices) // an old release's late copy may wake one more round: harmless
	}
	kw.notices[id]++
	if kw.notices[id] != quorum {
		return
	}
	kw.gen++
	if len(kw.sleepers) > 0 {
		select { // 1-buffered: a waiter on several keys may be woken by each
		case kw.sleepers[0] <- struct{}{}:
		default:
		}
		kw.sleepers = kw.sleepers[1:]
	}
}

// subscribe subscribes to node i's release notices and delivers them until
// the waker closes. All its I/O happens here, never in an Acquire.
func (w *waker) subscribe(i int, p *peer) {
	ps := p.rdb.PSubscribe(context.Background(), w.pattern)
	w.mu.Lock()
	closed := w.closed
	w.subs[i] = ps
	w.mu.Unlock()
	if closed {
		_ = ps.Close()
		return
	}
	pause := wakeRetry
	for {
		msg, err := ps.Receive(context.Background())
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		if err != nil {
			w.c.log.Debug("redlock: release notices: receive failed; retrying", "node", p.addr, "err", err)
			w.mu.Lock()
			w.ready[i] = false // go-redis subscribes again on its next connection
			w.mu.Unlock()
			t := time.NewTimer(pause)
			select {
			case <-w.stop:
			case <-t.C:
			}
			t.Stop()
			pause = min(2*pause, maxWakeRetry)
			continue
		}
		pause = wakeRetry
		w.mu.Lock()
		switch m := msg.(type) {
		case *redis.Message:
			if kw := w.keys[m.Channel]; kw != nil {
				kw.notice(m.Payload, w.c.quorum)
			}
		case *redis.Subscription:
			w.ready[i] = m.Kind == "psubscribe"
		}
		w.mu.Unlock()
	}
}
