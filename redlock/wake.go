package redlock

import (
	"context"
	_ "embed"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// Wake on release (WithReleaseNotices). An Acquire that a holder refused
// marks the holder's key (scripts/wake.lua), and the holder's Release
// then publishes a notice on "<key>:released" on every node where it
// deletes the key. The waiting Acquire subscribes to those channels and
// starts its next round when notices of one release have come from a
// quorum of nodes, instead of sleeping out its retry delay, which stays the
// fallback for what publishes nothing (a key that expires, a lost notice).
// Waking changes no outcome, only when the next round starts. Each release
// (its notices carry a random ID) wakes one sleeping Acquire of this
// Client, first come first woken and each at most once, so that waiters in
// one process do not split the nodes' votes between them; a woken Acquire
// that ends without the lock passes the wake on to the next.
//
// Only a quorum that reports one holder makes a waiter rely on notices:
// its delay is then stretched to that holder's expiry (at most
// maxNoticeWait) while every node has confirmed the subscription. After a
// split vote (contenders that each won a minority, and undo their partial
// grants without a notice) the resource is free and no notice comes: the
// next round starts after a short random delay (splitDelay, acquire.go).
//
// While some Acquire waits, each node has a subscriber: one goroutine that
// applies (UN)SUBSCRIBE and one that receives on a PubSub connection of the
// node's client; they end when no Acquire waits any more, and at Close.

const (
	// recentReleases is how many released locks per key are remembered,
	// to count the notices of one release from several nodes.
	recentReleases = 4
	// maxNoticeWait bounds how long a waiter relies on notices alone: the
	// longest a lost notice can delay it.
	maxNoticeWait = time.Second
	// wakeRetry is a subscriber's pause after a failed receive (node down,
	// connection lost); it doubles with each failure in a row, up to
	// maxWakeRetry.
	wakeRetry    = 100 * time.Millisecond
	maxWakeRetry = 2 * time.Second
)

type waker struct {
	c    *Client
	off  bool
	mu   sync.Mutex
	keys map[string]*keyWatch // by channel
	subs []*subscriber        // per node; nil when not running
	wg   sync.WaitGroup       // the subscribers' goroutines
	done bool                 // closed: start no subscriber
}

// keyWatch is the state of one wanted channel.
type keyWatch struct {
	refs      int                         // Acquire calls waiting for it
	confirmed []bool                      // per node: the subscription is confirmed
	gen       uint64                      // releases seen
	recent    [recentReleases]releaseSeen // the last released locks
	next      int                         // where the next one goes in recent
	sleepers  []*sleeper                  // sleeping Acquire calls, first come first
}

// sleeper is one sleeping Acquire, in the sleepers of each of its keys.
type sleeper struct {
	wake  chan struct{} // 1-buffered
	woken bool          // by one of its keys: the others pass it over
}

// releaseSeen counts the nodes that sent the notice of one lock's release.
type releaseSeen struct {
	id    string
	nodes []bool
	fired bool // a quorum has been seen; later copies are ignored
}

// subscriber keeps one node's subscriptions equal to the wanted channels.
type subscriber struct {
	kick   chan struct{}   // 1-buffered: the wanted channels changed
	stop   chan struct{}   // closed by close
	ctx    context.Context // of its commands and dials; ended by close
	cancel context.CancelFunc
}

func newWaker(c *Client) *waker {
	return &waker{c: c, off: c.cfg.noWake, keys: map[string]*keyWatch{}, subs: make([]*subscriber, len(c.peers))}
}

// noticeID returns the payload of the release notices of one Release: a
// random ID, the same on every node, so that the notices of two releases
// are never counted as one (a reentrant owner's value repeats); "" with
// notices off (the release then publishes nothing).
func (w *waker) noticeID() string {
	if w.off {
		return ""
	}
	return newAcquisitionID()
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

// watch registers an Acquire waiting for channels; the first registration
// of a channel starts or kicks every node's subscriber.
func (w *waker) watch(channels []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	added := false
	for _, ch := range channels {
		kw := w.keys[ch]
		if kw == nil {
			kw = &keyWatch{confirmed: make([]bool, len(w.c.peers))}
			w.keys[ch] = kw
			added = true
		}
		kw.refs++
	}
	if added {
		w.kickLocked()
	}
}

// unwatch undoes watch.
func (w *waker) unwatch(channels []string) {
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

// kickLocked tells every node's subscriber that the wanted channels
// changed, starting those that are not running. w.mu is held.
func (w *waker) kickLocked() {
	for i, p := range w.c.peers {
		if w.subs[i] == nil {
			if len(w.keys) == 0 || w.done {
				continue
			}
			s := &subscriber{kick: make(chan struct{}, 1), stop: make(chan struct{})}
			s.ctx, s.cancel = context.WithCancel(context.Background())
			w.subs[i] = s
			w.wg.Go(func() { w.subscribe(p, s) })
		}
		select {
		case w.subs[i].kick <- struct{}{}:
		default:
		}
	}
}

// close stops every subscriber and waits for their goroutines. Safe to
// call more than once and concurrently.
func (w *waker) close() {
	w.mu.Lock()
	w.done = true
	for i, s := range w.subs {
		if s != nil {
			close(s.stop)
			s.cancel()
			w.subs[i] = nil
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
	if len(w.keys) == 0 {
		return // no Acquire of this Client waits
	}
	for _, k := range lockKeys {
		if kw := w.keys[k+releasedSuffix]; kw != nil {
			kw.seen(id, -1, w.c)
		}
	}
}

// seen records that node i (-1: a quorum at once) released lock id, and
// wakes the longest-sleeping Acquire when this makes a quorum. w.mu is
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
		*r = releaseSeen{id: id, nodes: make([]bool, len(c.peers))}
	}
	for j := range r.nodes {
		r.nodes[j] = r.nodes[j] || i < 0 || j == i
	}
	if r.fired || countTrue(r.nodes) < c.quorum {
		return
	}
	r.fired = true
	kw.gen++
	kw.wakeOne()
}

// wakeOne wakes the longest-sleeping Acquire not woken yet. The waker's
// mutex is held.
func (kw *keyWatch) wakeOne() {
	for len(kw.sleepers) > 0 {
		s := kw.sleepers[0]
		kw.sleepers = kw.sleepers[1:]
		if !s.woken {
			s.woken = true
			s.wake <- struct{}{} // never blocks: 1-buffered, sent once
			return
		}
	}
}

// subscribe keeps p's subscriptions equal to the wanted channels until
// none is wanted or the waker closes. A second goroutine receives; all I/O
// happens in these two, never in an Acquire.
func (w *waker) subscribe(p *peer, s *subscriber) {
	defer s.cancel()
	var ps *redis.PubSub
	received := make(chan struct{})
	have := map[string]bool{}
	ctx := s.ctx // close ends a dial or command in progress
	for w.next(p, s) {
		add, drop := w.diff(have)
		switch {
		case ps == nil && len(add) > 0:
			ps = p.rdb.Subscribe(ctx, add...) // with a channel: a Ring needs one to pick a shard
			select {
			case <-s.stop: // closed while connecting: receive nothing
				_ = ps.Close()
				return
			default:
			}
			w.wg.Go(func() { defer close(received); w.receive(ctx, p, ps, s.stop) })
		case len(add) > 0:
			_ = ps.Subscribe(ctx, add...) // on error, go-redis subscribes again on its next connection
		}
		if len(drop) > 0 && ps != nil {
			_ = ps.Unsubscribe(ctx, drop...)
		}
	}
	if ps != nil {
		_ = ps.Close()
		<-received
	}
}

// next waits for a change of the wanted channels and reports whether s
// goes on: false once the waker closes or no channel is wanted.
func (w *waker) next(p *peer, s *subscriber) bool {
	select {
	case <-s.stop:
		return false
	case <-s.kick:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.keys) == 0 && w.subs[p.idx] == s {
		w.subs[p.idx] = nil // a later watch starts a new subscriber
	}
	return len(w.keys) > 0
}

// diff returns the channels wanted but not in have and those in have no
// longer wanted, and updates have.
func (w *waker) diff(have map[string]bool) (add, drop []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.keys {
		if !have[ch] {
			add = append(add, ch)
			have[ch] = true
		}
	}
	for ch := range have {
		if w.keys[ch] == nil {
			drop = append(drop, ch)
			delete(have, ch)
		}
	}
	return add, drop
}

// receive delivers p's release notices and subscription confirmations
// until ps is closed, or stop once a receive failed.
func (w *waker) receive(ctx context.Context, p *peer, ps *redis.PubSub, stop <-chan struct{}) {
	pause := wakeRetry
	for {
		msg, err := ps.Receive(ctx)
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		if err != nil {
			w.c.log.Debug("redlock: release notices: receive failed; retrying", "node", p.addr, "err", err)
			w.unconfirm(p.idx) // go-redis subscribes again on its new connection
			t := time.NewTimer(pause)
			select {
			case <-stop: // closing: do not connect again
				t.Stop()
				return
			case <-t.C:
			}
			pause = min(2*pause, maxWakeRetry)
			continue
		}
		pause = wakeRetry
		w.mu.Lock()
		switch m := msg.(type) {
		case *redis.Message:
			if kw := w.keys[m.Channel]; kw != nil {
				kw.seen(m.Payload, p.idx, w.c)
			}
		case *redis.Subscription:
			if kw := w.keys[m.Channel]; kw != nil {
				kw.confirmed[p.idx] = m.Kind == "subscribe"
			}
		}
		w.mu.Unlock()
	}
}

// unconfirm forgets node i's subscriptions: its connection failed.
func (w *waker) unconfirm(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, kw := range w.keys {
		kw.confirmed[i] = false
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

// The layers of waking (scripts/wake.lua): an Acquire's attempts mark a
// refusing holder's key (wakeMark), and every Release of a Client with
// notices on publishes a notice where it deletes a marked key
// (wakeNotice).

//go:embed scripts/wake.lua
var wakeSrc string

var (
	wakeHooks      = script.Parse(wakeSrc)
	wakeMarkPart   = script.Part{Name: "wake", Hooks: map[string]string{"refused": wakeHooks["refused"]}}
	wakeNoticePart = script.Part{Name: "wake", Args: 1, Hooks: map[string]string{"deleted": wakeHooks["deleted"]}}
)

// wakeMark is the layer of an Acquire's Lock while notices are on for the
// Client and the call: its attempts mark a refusing holder's key, and it
// spends the Acquire's waits between attempts, watching the keys'
// release notices once a holder refused.
type wakeMark struct {
	baseLayer
	w        *waker
	channels []string // nil until it watches
	gen      uint64   // releases seen before the current attempt
	woken    bool     // a notice ended the last sleep
}

func newWakeMark(c *Client, cfg *lockConfig, _ []string, retrying bool) (layer, error) {
	if !retrying || c.cfg.noWake || cfg.noWake {
		return nil, nil
	}
	return &wakeMark{w: serviceOf[*waker](c)}, nil
}

func (*wakeMark) part() script.Part { return wakeMarkPart }

// begin records the releases seen so far, so that wait returns at once
// for a release that came during the attempt.
func (m *wakeMark) begin(*attempt) {
	if m.channels != nil {
		m.gen = m.w.gen(m.channels)
	}
}

// wait waits after a failed attempt q: d, or until a release of the keys
// wakes it, or until ctx ends, in a wait span. It starts watching the keys
// the first time a holder refused; until then the core waits (false).
func (m *wakeMark) wait(ctx context.Context, l *Lock, q *QuorumError, d time.Duration) bool {
	w := m.w
	if m.channels == nil {
		if q.Count(OutcomeHeld) == 0 {
			return false
		}
		m.channels = make([]string, l.n)
		for i, k := range l.keys[:l.n] {
			m.channels[i] = k + releasedSuffix
		}
		w.watch(m.channels)
		// Only releases from now on wake this waiter: the channels may have
		// seen releases for another waiter of this Client before.
		m.gen = w.gen(m.channels)
	}
	s := &sleeper{wake: make(chan struct{}, 1)}
	w.mu.Lock()
	var g uint64
	confirmed := true
	for _, ch := range m.channels {
		kw := w.keys[ch]
		g += kw.gen
		confirmed = confirmed && countTrue(kw.confirmed) == len(w.c.peers)
		kw.sleepers = append(kw.sleepers, s)
	}
	released := g != m.gen // a release came during the attempt
	if released {
		d = 0
	} else if expires, ok := oneHolder(q); ok && confirmed {
		d = max(d, min(expires+driftConstant, maxNoticeWait))
	}
	w.mu.Unlock()
	w.c.tel.wait(ctx, q, d, s.wake, released)
	w.mu.Lock()
	for _, ch := range m.channels {
		kw := w.keys[ch]
		if i := slices.Index(kw.sleepers, s); i >= 0 {
			kw.sleepers = slices.Delete(kw.sleepers, i, i+1)
		}
	}
	m.woken = s.woken
	w.mu.Unlock()
	return true
}

// done ends the watch. An Acquire that a release woke and that ends
// without the lock (its ctx ended, its policy gave up) passes the wake on
// to the next sleeper of each of its keys.
func (m *wakeMark) done(_ *Lock, acquired bool) {
	if m.channels == nil {
		return
	}
	if m.woken && !acquired {
		m.w.mu.Lock()
		for _, ch := range m.channels {
			m.w.keys[ch].wakeOne()
		}
		m.w.mu.Unlock()
	}
	m.w.unwatch(m.channels)
}

// wakeNotice is the layer of every Lock while notices are on.
type wakeNotice struct {
	baseLayer
	w *waker
}

func newWakeNotice(c *Client, _ *lockConfig, _ []string, _ bool) (layer, error) {
	if c.cfg.noWake {
		return nil, nil
	}
	return wakeNotice{w: serviceOf[*waker](c)}, nil
}

func (wakeNotice) part() script.Part { return wakeNoticePart }

// args passes a Release's notice ID, "" for a cleanup that wakes nobody.
func (n wakeNotice) args(_ scriptKind, a *attempt) []any {
	if !a.release {
		return []any{""}
	}
	return []any{n.w.noticeID()}
}

// released counts the release for this Client's own waiters.
func (n wakeNotice) released(l *Lock, args []any) {
	if id, _ := args[0].(string); id != "" {
		n.w.released(l.keys[:l.n], id)
	}
}

// WithReleaseNotices turns waking on release on or off (default on): an
// Acquire that a holder refused on a quorum subscribes, on every node, to
// the release notices of its resources and starts its next round as soon as
// the holder releases, instead of polling with its retry delay (wake.go).
// The channels are "<key>:released": an ACL user needs
// &<prefix>*:released (Redis 7 gives new users no channel); a release
// whose PUBLISH is denied still releases. Turn it off where the nodes refuse
// SUBSCRIBE (ACLs, proxies without pub/sub): this Client's releases then
// publish nothing either. While an Acquire waits, the Client keeps one
// PubSub connection and two goroutines per node; they end when no Acquire
// waits any more, and at Close.
//
// A SharedOption: given to New, it turns notices on or off for the
// Client. Given to a call (Acquire, Do), WithReleaseNotices(false) makes
// that call poll with its retry delay and mark no holder's key, so that
// the holder's release publishes nothing for it (package scheduler's
// Lock: its losers do not wait). A call cannot turn notices on when its
// Client has them off. TryAcquire does not wait for a release either way.
func WithReleaseNotices(on bool) SharedOption { return releaseNoticesOption(on) }

type releaseNoticesOption bool

func (o releaseNoticesOption) applyClient(c *config)   { c.noWake, c.lock.noWake = !bool(o), !bool(o) }
func (o releaseNoticesOption) applyLock(l *lockConfig) { l.noWake = !bool(o) }
