package redlock

import (
	"context"
	"testing"
	"time"
)

// TestNotifyWakesOneSleeperPerRelease: the notices of one lock's release
// from a quorum of distinct nodes wake one sleeping Acquire, the longest
// sleeping first; fewer do not, nor do copies; a notice for a channel
// nobody waits for is ignored.
func TestNotifyWakesOneSleeperPerRelease(t *testing.T) {
	c, _ := newMiniClient(t)
	w := &waker{c: c, keys: map[string]*keyWatch{}}
	chs := []string{"r:released"}
	w.keys[chs[0]] = &keyWatch{refs: 3}
	woke := make(chan int, 3)
	for i := range 3 {
		go func() {
			w.sleep(context.Background(), chs, 0, 20*time.Second, 0)
			woke <- i
		}()
		// Sleepers queue in order: wait until this one is in.
		for {
			w.mu.Lock()
			n := len(w.keys[chs[0]].sleepers)
			w.mu.Unlock()
			if n == i+1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	w.notify(0, "r:released", "a") // one node of three: not yet released
	select {
	case got := <-woke:
		t.Fatalf("a notice from one node of three woke sleeper %d", got)
	case <-time.After(50 * time.Millisecond):
	}
	w.notify(0, "r:released", "a") // the same node again
	w.notify(1, "r:released", "b") // another lock's release
	w.notify(2, "r:released", "a") // a quorum: released
	w.notify(1, "r:released", "a") // the last copy of the same release
	w.notify(0, "other:released", "c")
	if got := <-woke; got != 0 {
		t.Errorf("first release woke sleeper %d, want 0 (first come)", got)
	}
	select {
	case got := <-woke:
		t.Fatalf("copies of one release woke sleeper %d too", got)
	case <-time.After(100 * time.Millisecond):
	}
	w.notify(2, "r:released", "b") // b on a quorum (1, 2)
	if got := <-woke; got != 1 {
		t.Errorf("second release woke sleeper %d, want 1", got)
	}
	if g := w.gen(chs); g != 2 {
		t.Errorf("gen = %d after two releases, want 2", g)
	}
	// A release seen since the caller read gen: sleep returns at once.
	start := time.Now()
	w.sleep(context.Background(), chs, 1, 20*time.Second, 0)
	if time.Since(start) > 10*time.Second {
		t.Error("sleep waited although a release came after its gen")
	}
	w.notify(0, "r:released", "d")
	w.notify(1, "r:released", "d")
	if got := <-woke; got != 2 {
		t.Errorf("third release woke sleeper %d, want 2", got)
	}
}

// TestSleepStretchesToHolderExpiry: with the subscription confirmed on
// every node, a short retry delay is stretched to the holder's expiry (a
// release would wake the caller); confirmed on a quorum only, it is kept.
func TestSleepStretchesToHolderExpiry(t *testing.T) {
	c, _ := newMiniClient(t)
	w := &waker{c: c, keys: map[string]*keyWatch{}}
	chs := []string{"r:released"}
	w.keys[chs[0]] = &keyWatch{refs: 1}
	const expires = 300 * time.Millisecond

	start := time.Now()
	w.sleep(context.Background(), chs, 0, time.Millisecond, expires)
	if took := time.Since(start); took >= expires {
		t.Errorf("unconfirmed: slept %v, want the 1ms retry delay", took)
	}

	w.confirm(0, chs[0], true)
	w.confirm(2, chs[0], true)
	start = time.Now()
	w.sleep(context.Background(), chs, 0, time.Millisecond, expires)
	if took := time.Since(start); took >= expires {
		t.Errorf("confirmed on 2 of 3: slept %v, want the 1ms retry delay", took)
	}

	w.confirm(1, chs[0], true)
	start = time.Now()
	w.sleep(context.Background(), chs, 0, time.Millisecond, expires)
	if took := time.Since(start); took < expires {
		t.Errorf("confirmed on 3 of 3: slept %v, want at least the holder's expiry %v", took, expires)
	}

	w.unconfirm(2) // node 2's connection failed
	start = time.Now()
	w.sleep(context.Background(), chs, 0, time.Millisecond, expires)
	if took := time.Since(start); took >= expires {
		t.Errorf("node 2 unconfirmed again: slept %v, want the 1ms retry delay", took)
	}
}
