package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/elector"
	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// runLog records the runs of scheduled jobs; safe for concurrent use.
type runLog struct {
	mu   sync.Mutex
	runs []Run
}

func (l *runLog) add(r Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, r)
}

func (l *runLog) list() []Run {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Run(nil), l.runs...)
}

// startScheduler starts one scheduler instance whose clock is offset from
// the system clock, running a job every second that records its runs.
func startScheduler(t *testing.T, nodes []redis.UniversalClient, id int, offset time.Duration, log *runLog,
	lopts []redlock.Option, sopts ...scheduler.LockerOption) *scheduler.Scheduler {
	t.Helper()
	c, err := redlock.New(nodes, lopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	opts := append([]scheduler.LockerOption{
		scheduler.WithClock(redlocktest.OffsetClock(offset)),
		scheduler.WithInstanceID(fmt.Sprintf("instance-%d", id)),
	}, sopts...)
	s, err := scheduler.New(c, scheduler.WithLockerOptions(opts...))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func(ctx context.Context) {
		ctx = s.RunContext(ctx)
		tick, ok := scheduler.TickFromContext(ctx)
		if !ok {
			t.Errorf("instance %d: run without a tick", id)
		}
		start := time.Now()
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
		log.add(Run{Tick: tick, Instance: id, Start: start, End: time.Now()})
	}), gocron.WithName("tick-job"))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

func TestRedisSchedulerClockOffsets(t *testing.T) {
	t.Parallel()
	sc := newScenario(t, "scheduler instances with clock offsets", "redis", false)
	runFor := pick(10*time.Second, 60*time.Second)
	var judged, dups, missed counter
	var mu sync.Mutex
	var offsetsSeen []string
	sc.parallelSeeds(2, 5, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 3)
		log := &runLog{}
		// One instance behind, one on time, one ahead; within the default
		// clock tolerance of 1 s.
		offsets := []time.Duration{
			-time.Duration(100+r.IntN(700)) * time.Millisecond,
			0,
			time.Duration(100+r.IntN(700)) * time.Millisecond,
		}
		mu.Lock()
		offsetsSeen = append(offsetsSeen, fmt.Sprint(offsets))
		mu.Unlock()
		start := time.Now()
		var scheds []*scheduler.Scheduler
		for i, off := range offsets {
			scheds = append(scheds, startScheduler(t, w.clients(), i, off, log, nil))
		}
		time.Sleep(runFor)
		end := time.Now()
		for _, s := range scheds {
			_ = s.Shutdown()
		}
		v := Tally(log.list(), time.Second, start.Add(2*time.Second), end.Add(-time.Second))
		judged.Add(int64(v.Judged))
		dups.Add(int64(v.Duplicates))
		missed.Add(int64(v.Missed))
		sc.add(v.Judged, len(offsets)-1, v.Duplicates)
		if v.Duplicates != 0 || v.Missed != 0 {
			t.Errorf("offsets %v: %d ticks ran twice, %d of %d missed", offsets, v.Duplicates, v.Missed, v.Judged)
		}
	})
	sc.metric("ticks judged / run twice / missed", "%d / %d / %d", judged.Load(), dups.Load(), missed.Load())
	sc.metric("offsets (behind, on time, ahead)", "%v", offsetsSeen)
}

// TestSoakEndToEnd (soak tier only): five scheduler instances with skewed
// clocks and three elector candidates share five nodes with restart gating,
// while random faults (SIGSTOP, kill -9 and immediate restart) hit at most
// two nodes at a time, counting a restarted node as down until its gate has
// passed. Pass: no tick runs twice, never two leaders at once.
func TestSoakEndToEnd(t *testing.T) {
	if !soak() {
		t.Skipf("soak tier only (%s=1)", envSoak)
	}
	t.Parallel()
	sc := newScenario(t, "end-to-end soak: 5 skewed schedulers + elected singleton", "soak", false)
	const gate, ttl, leaseTTL = 3 * time.Second, 2 * time.Second, 2 * time.Second
	runFor := 3 * time.Minute
	sc.seeds(1, 1, func(t *testing.T, seed uint64, r *rand.Rand) {
		w := newRedisWorld(t, 5)
		lopts := []redlock.Option{redlock.WithRestartGating(gate)}
		arm, err := redlock.New(w.clients(), lopts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = arm.Close(context.Background()) })
		_, _ = arm.TryAcquire(context.Background(), []string{"arm"}, gate)
		time.Sleep(gate + 100*time.Millisecond)

		log := &runLog{}
		start := time.Now()
		for i := range 5 {
			off := time.Duration(r.IntN(1600)-800) * time.Millisecond
			startScheduler(t, w.clients(), i, off, log, lopts, scheduler.WithTTL(ttl))
		}
		h := &History{}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range 3 {
			c, err := redlock.New(w.clients(), lopts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			id := fmt.Sprintf("candidate-%d", i)
			e, err := elector.New(c, "singleton", elector.WithIdentity(id), elector.WithLeaseTTL(leaseTTL),
				elector.OnStartedLeading(func(lctx context.Context) {
					l, _ := redlock.FromContext(lctx)
					hd := h.Begin("leader", id, time.Now(), l)
					for {
						select {
						case <-lctx.Done():
							hd.End()
							return
						case <-time.After(20 * time.Millisecond):
							hd.Act()
						}
					}
				}))
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { _ = e.Run(ctx) })
		}
		// Faults: at most two nodes unavailable at a time (frozen, down, or
		// restarted and still gated).
		faults := 0
		downUntil := make([]time.Time, 5)
		for deadline := time.Now().Add(runFor); time.Now().Before(deadline); {
			time.Sleep(time.Duration(200+r.IntN(800)) * time.Millisecond)
			now := time.Now()
			var avail []int
			busy := 0
			for i, u := range downUntil {
				if now.Before(u) {
					busy++
				} else {
					avail = append(avail, i)
				}
			}
			if busy >= 2 || len(avail) == 0 {
				continue
			}
			i := avail[r.IntN(len(avail))]
			faults++
			if r.IntN(2) == 0 {
				d := time.Duration(300+r.IntN(2500)) * time.Millisecond
				w.freeze(i)
				downUntil[i] = now.Add(d + 100*time.Millisecond)
				time.Sleep(d)
				w.thaw(i)
			} else {
				w.kill(i)
				w.restart(i)
				downUntil[i] = time.Now().Add(gate + 100*time.Millisecond)
			}
		}
		end := time.Now()
		cancel()
		wg.Wait()
		runs := log.list()
		v := Tally(runs, time.Second, start.Add(2*time.Second), end.Add(-time.Second))
		lv := sc.checkHistory(t, h)
		sc.add(v.Judged, faults, v.Duplicates)
		if v.Duplicates != 0 {
			t.Errorf("%d of %d ticks ran twice", v.Duplicates, v.Judged)
		}
		if !lv.OK() {
			t.Errorf("leaders: %v", lv)
		}
		leaders := h.Windows()
		sort.Slice(leaders, func(i, j int) bool { return leaders[i].Start.Before(leaders[j].Start) })
		sc.metric("ticks judged / run twice / missed", "%d / %d / %d", v.Judged, v.Duplicates, v.Missed)
		sc.metric("leaderships / overlapping", "%d / %d", len(leaders), lv.Overlaps)
	})
}
