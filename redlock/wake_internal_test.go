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
			w.sleep(context.Background(), chs, 0, 20*time.Second)
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
	w.sleep(context.Background(), chs, 1, 20*time.Second)
	if time.Since(start) > 10*time.Second {
		t.Error("sleep waited although a release came after its gen")
	}
	w.notify(0, "r:released", "d")
	w.notify(1, "r:released", "d")
	if got := <-woke; got != 2 {
		t.Errorf("third release woke sleeper %d, want 2", got)
	}
}
