package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/tracing"
)

// Do acquires the lock as Acquire does, runs fn while the lock is held, and
// releases the lock when fn returns. fn's ctx carries the Lock
// (FromContext). Do releases the lock (also when fn panics), on a context
// detached from ctx's cancellation.
//
// While fn runs, Do extends the lock by its TTL each time a third of the TTL
// has passed since the last successful extension, retrying every TTL/10
// while nodes fail; the TTL is ttl, or that of fn's own last Extend of the
// lock (see Keep). If the lock is lost (too many nodes no longer hold it, or
// no extension succeeded in time), fn's ctx is cancelled with a cause
// matching ErrLockLost no later than Until() - TTL/10, whether or not an
// Extend call is still waiting for nodes; no extension is tried after that
// point, so a lost lock is never revived. fn's ctx is also cancelled when
// ctx ends. Each extension is a trace of its own, linked to Do's span (see
// Keep).
//
// Do returns fn's error joined with ErrLockLost when the lock was lost while
// fn ran, or with the release error. It returns an acquisition error
// (ErrNotAcquired, see Acquire) without calling fn. Every goroutine Do starts
// has ended when Do returns, apart from node calls abandoned at their
// per-node timeout (see WithNodeTimeout).
func (c *Client) Do(ctx context.Context, resources []string, ttl time.Duration, fn func(ctx context.Context) error, opts ...LockOption) (err error) {
	ctx, span := c.tel.startOp(ctx, tracing.SpanDo, resources, ttl)
	defer func() { endOp(span, err) }()
	if fn == nil {
		return invalidf("Do called with a nil fn")
	}
	l, err := c.Acquire(ctx, resources, ttl, opts...)
	if err != nil {
		return err
	}
	fctx, stop := l.Keep(ctx)
	defer func() {
		lost := stop()
		rerr := l.Release(ctx)
		switch {
		case lost != nil:
			err = errors.Join(err, lost) // the loss is the error; Release only cleaned up
		case rerr != nil:
			err = errors.Join(err, wrapf([]error{rerr}, "release after Do failed: %s", detail(rerr)))
		}
	}()
	return fn(fctx)
}

// Keep extends l in the background while work runs, as Do does: by its TTL
// each time a third of the TTL (ExtendEvery, given here or at Acquire) has
// passed since the last extension, retrying every TTL/10 while nodes fail.
// The TTL and Until are the Lock's current ones: your last successful
// Extend while Keep runs sets the TTL that Keep extends by, whatever the
// interleaving (an extension of Keep's that waited behind it uses the new
// TTL), and when it moves Until earlier, Keep's deadline moves with it.
// The returned context, derived from ctx and carrying l (FromContext), is
// cancelled with a cause matching ErrLockLost when the lock is lost, no
// later than Until() - TTL/10, even while an extension still waits for
// nodes; no extension is tried after that, so a lost lock is never revived.
// It is also cancelled when ctx ends, which stops the extensions too, and
// when l is released (Release ends the extensions; stop then returns nil).
// Each extension is a trace of its own (its redlock.Extend span and round),
// linked to ctx's span: a hold of hours does not grow one trace without
// bound, and each extension can be seen as soon as it ends.
//
// stop ends the extensions, waits for the goroutine Keep started, cancels
// the returned context, and returns the loss (matching ErrLockLost) or nil.
// It does not release the lock: call it, then Release. Later calls of stop
// return the same result. opts (KeepOptions: ExtendEvery) override the
// Lock's own settings for this Keep. One Keep per Lock is enough; each
// Keep extends on its own schedule. Keep on a nil Lock returns ctx and a
// stop that reports ErrInvalidArgument.
func (l *Lock) Keep(ctx context.Context, opts ...KeepOption) (kctx context.Context, stop func() error) {
	if l == nil {
		err := invalidf("Keep called on a nil *Lock")
		return ctx, func() error { return err }
	}
	cfg := keepConfig{extendEvery: l.cfg.extendEvery}
	for _, o := range opts {
		if o != nil {
			o.applyKeep(&cfg)
		}
	}
	kctx, cancel := context.WithCancelCause(context.WithValue(ctx, lockKey{}, l))
	quit := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- l.keepAlive(kctx, quit, cancel, cfg.extendEvery) }()
	var once sync.Once
	var lost error
	return kctx, func() error {
		once.Do(func() {
			close(quit)
			lost = <-done
			cancel(nil)
		})
		return lost
	}
}

type lockKey struct{}

// FromContext returns the Lock that Do (or Keep) holds for the ctx it passed
// to fn (or a context derived from it), e.g. to read Until or pass the lock on; ok is
// false for any other context. Do releases the lock itself: do not call
// Release on it.
func FromContext(ctx context.Context) (l *Lock, ok bool) {
	l, ok = ctx.Value(lockKey{}).(*Lock)
	return l, ok
}

// keepAlive extends l until stop is closed, ctx ends or l is released: by
// its current TTL, each time `every` (ExtendEvery; 0: TTL/3) has passed
// since the last extension, and cancels fn's ctx through cancel when the
// lock is lost. It re-reads the Lock whenever Until, TTL or the state
// change (Lock.watch). It returns the loss, or nil.
func (l *Lock) keepAlive(ctx context.Context, stop <-chan struct{}, cancel context.CancelCauseFunc, every time.Duration) error {
	var failed error      // the last extension's failure since the last success
	var retryAt time.Time // when failed: the next try
	for {
		state, until, ttl, changed := l.watch()
		if state != stateHeld {
			return l.keepEnded(ctx, cancel, state, failed)
		}
		deadline := until.Add(-ttl / 10)
		next := until.Add(extendEvery(every, ttl) - ttl) // the last extension's start + every
		if failed != nil {
			next = retryAt
		}
		t := time.NewTimer(min(time.Until(next), time.Until(deadline)))
		select {
		case <-stop:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-changed: // an Extend or Release of the caller's
			t.Stop()
			continue
		case <-t.C:
		}
		if !time.Now().Before(deadline) {
			return l.lose(ctx, cancel, "no extension reached a quorum", failed)
		}
		done, err := l.extendKept(ctx, stop, cancel, ttl, failed)
		switch {
		case done:
			return err
		case err != nil:
			l.c.log.Debug("redlock: extension failed; retrying", "resources", l.resources, "err", err)
			failed, retryAt = err, time.Now().Add(max(ttl/10, time.Millisecond))
		default:
			failed = nil
		}
	}
}

// extendKept runs one of Keep's extensions, by the Lock's TTL as it is
// when the extension's round starts (ttl until then), in its own goroutine,
// so that Keep's deadline (Until - TTL/10 of the Lock as it is, followed
// while the Extend waits, e.g. behind a shortening Extend of the caller's)
// holds even while nodes hang: the round itself is bounded by the node
// timeout. done says that Keep ends, with err (the loss, or nil); else err
// is the extension's failure to retry, or nil.
func (l *Lock) extendKept(ctx context.Context, stop <-chan struct{}, cancel context.CancelCauseFunc, ttl time.Duration, failed error) (done bool, err error) {
	res := make(chan error, 1)
	go func() { res <- l.extend(newTrace(context.WithoutCancel(ctx)), ttl, true) }()
	for {
		_, until, lttl, changed := l.watch()
		dt := time.NewTimer(time.Until(until.Add(-lttl / 10)))
		select {
		case err := <-res:
			dt.Stop()
			if !errors.Is(err, ErrLockLost) {
				return false, err
			}
			if state, _, _, _ := l.watch(); state == stateReleased { // released meanwhile: not lost
				return true, l.keepEnded(ctx, cancel, state, nil)
			}
			return true, l.lost(ctx, cancel, err)
		case <-changed:
			dt.Stop()
		case <-dt.C:
			err := l.lose(ctx, cancel, "an extension was still waiting for the nodes", failed)
			<-res
			return true, err
		case <-stop:
			dt.Stop()
			<-res
			return true, nil
		}
	}
}

// keepEnded ends Keep for a lock no longer held: released by its owner
// (the kept context is cancelled, no loss), or found lost by an Extend
// (a loss, as lose).
func (l *Lock) keepEnded(ctx context.Context, cancel context.CancelCauseFunc, state lockState, failed error) error {
	if state == stateReleased {
		cancel(nil)
		return nil
	}
	return l.lose(ctx, cancel, "an Extend found it lost", failed)
}

// extendEvery returns the time from one extension to the next for ttl:
// every (ExtendEvery) when set, at most 0.8 x ttl; else ttl/3.
func extendEvery(every, ttl time.Duration) time.Duration {
	if every > 0 {
		return min(every, ttl*8/10)
	}
	return ttl / 3
}

// lostErr is the error of a lock that Keep gives up on because of what
// happened, with the last extension's failure: it says how long the
// validity has left (Keep gives up a tenth of the TTL before it ends), or
// how long ago it ended: then, with no failed extension, Keep's timer
// fired late, as it does in a process that was paused.
func (l *Lock) lostErr(what string, failed error) error {
	msg := fmt.Sprintf("%s lost: %s", lockName(l.resources), what)
	until := l.Until()
	if left := time.Until(until).Round(time.Millisecond); left > 0 {
		msg += fmt.Sprintf(" and its validity ends in %v", left)
	} else {
		msg += fmt.Sprintf(" before its validity ended %v ago", ago(until))
		if failed == nil {
			msg += " (was the process paused?)"
		}
	}
	if failed != nil {
		msg += "; the last extension failed: " + detail(failed)
	}
	return wrapf([]error{ErrLockLost}, "%s", msg)
}

// lose gives l up because of what happened, after the last extension
// failed with failed (lostErr): it marks l lost, cancels fn's ctx and logs
// it.
func (l *Lock) lose(ctx context.Context, cancel context.CancelCauseFunc, what string, failed error) error {
	err := l.lostErr(what, failed)
	l.mu.Lock()
	if l.state == stateHeld {
		l.loseLocked(ctx, "Keep gave up on it: "+what)
	}
	l.mu.Unlock()
	return l.lost(ctx, cancel, err)
}

// lost ends Keep for l, found lost with err (an Extend's, which marked l
// lost; else it does so here): it cancels fn's ctx with err and logs it.
func (l *Lock) lost(ctx context.Context, cancel context.CancelCauseFunc, err error) error {
	l.mu.Lock()
	if l.state == stateHeld {
		l.loseLocked(ctx, ErrorText(err))
	}
	l.mu.Unlock()
	trace.SpanFromContext(ctx).AddEvent(tracing.EventLockLost)
	cancel(err)
	l.c.log.Warn("redlock: lock lost while work was running", "resources", l.resources, "err", err)
	return err
}
