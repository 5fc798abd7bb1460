package scheduler_test

import (
	"context"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
)

// The error texts are part of what a user reads in a log: these tests pin
// the texts of the common errors.

// checkText fails t unless err reads want exactly and matches each of
// sentinels.
func checkText(t *testing.T, what string, err error, want string, sentinels ...error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want %q", what, want)
		return
	}
	for _, s := range sentinels {
		if !errors.Is(err, s) {
			t.Errorf("%s = %v, want an error matching %v", what, err, s)
		}
	}
	if err.Error() != want {
		t.Errorf("%s reads\n%s\nwant\n%s", what, err, want)
	}
}

func TestLockerOptionTexts(t *testing.T) {
	c, _ := miniClient(t, 1)
	tests := []struct {
		name   string
		client *redlock.Client
		opts   []scheduler.LockerOption
		want   string
	}{
		{"nil client", nil, nil, "scheduler: invalid argument: the *redlock.Client is nil"},
		{"tiny TTL", c, []scheduler.LockerOption{scheduler.WithTTL(time.Millisecond)},
			"scheduler: invalid argument: TTL 1ms (WithTTL) is below the minimum 10ms"},
		{"negative tolerance", c, []scheduler.LockerOption{scheduler.WithClockTolerance(-time.Second)},
			"scheduler: invalid argument: clock tolerance -1s (WithClockTolerance) must be at least 0 and below 24h"},
		{"zero resolution", c, []scheduler.LockerOption{scheduler.WithTickResolution(0)},
			"scheduler: invalid argument: tick resolution 0s (WithTickResolution) is below the minimum 1ms"},
		{"zero lock timeout", c, []scheduler.LockerOption{scheduler.WithLockTimeout(0)},
			"scheduler: invalid argument: lock timeout 0s (WithLockTimeout) is not positive"},
		{"negative jitter", c, []scheduler.LockerOption{scheduler.WithLockJitter(-time.Millisecond)},
			"scheduler: invalid argument: lock jitter -1ms (WithLockJitter) is negative"},
		{"empty instance ID", c, []scheduler.LockerOption{scheduler.WithInstanceID("")},
			"scheduler: invalid argument: instance ID (WithInstanceID) is empty"},
		{"long instance ID", c, []scheduler.LockerOption{scheduler.WithInstanceID(strings.Repeat("x", 1000))},
			"scheduler: invalid argument: instance ID (WithInstanceID) is 1000 bytes, more than the maximum 994"},
		{"nil option", c, []scheduler.LockerOption{scheduler.WithTTL(time.Second), nil},
			"scheduler: invalid argument: LockerOption 2 of 2 is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := scheduler.NewLocker(tt.client, tt.opts...)
			checkText(t, "NewLocker", err, tt.want, redlock.ErrInvalidArgument)
		})
	}
	_, err := scheduler.New(c, nil)
	checkText(t, "New with a nil Option", err, "scheduler: invalid argument: option 1 of 1 is nil", redlock.ErrInvalidArgument)
}

// TestLockerRejectsTTLsTheClientRejects: a Client whose restart gate is
// shorter than the run lock's TTL or a tick record's lifetime (or whose
// shortest TTL is above a record's) refused every Lock at run time; now
// NewLocker, or NewJob for a duration job, says so. Configurations whose
// records fit are accepted, whatever the lock timeout.
func TestLockerRejectsTTLsTheClientRejects(t *testing.T) {
	client := func(opts ...redlock.Option) *redlock.Client {
		rdb := redis.NewClient(&redis.Options{Addr: "localhost:1"})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := redlock.New([]redis.UniversalClient{rdb}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	gated := func(gate time.Duration) *redlock.Client { return client(redlock.WithRestartGating(gate)) }
	_, err := scheduler.NewLocker(gated(5 * time.Second))
	checkText(t, "NewLocker, gate 5s", err, "scheduler: invalid argument: run lock TTL 10s (WithTTL): "+
		"TTL 10s is above the restart gate's maximum TTL 5s (WithRestartGating)", redlock.ErrInvalidArgument)
	_, err = scheduler.NewLocker(gated(2*time.Second), scheduler.WithTTL(2*time.Second), scheduler.WithTickResolution(time.Minute))
	checkText(t, "NewLocker, gate 2s, TTL 2s, resolution 1m", err, "scheduler: invalid argument: tick records of jobs every 1m0s live 3s "+
		"(2 x clock tolerance 1s (WithClockTolerance), at least 100ms, + the Lock bound 1s (WithLockTimeout)): "+
		"TTL 3s is above the restart gate's maximum TTL 2s (WithRestartGating)", redlock.ErrInvalidArgument)
	_, err = scheduler.NewLocker(client(redlock.WithDriftFactor(0.49)), scheduler.WithClockTolerance(0), scheduler.WithTickResolution(100*time.Millisecond))
	checkText(t, "NewLocker, records shorter than the Client's shortest TTL", err, "scheduler: invalid argument: tick records of jobs every 100ms live 150ms "+
		"(2 x clock tolerance 0s (WithClockTolerance), at least 100ms, + the Lock bound 50ms (WithLockTimeout)): "+
		"TTL 150ms is too short: after the clock drift allowance of 75.5ms, less than the minimum validity (50% of the TTL, WithMinValidity) would remain; use at least 201ms",
		redlock.ErrInvalidArgument)
	for _, tt := range []struct {
		name string
		gate time.Duration
		opts []scheduler.LockerOption
	}{
		{"gate 3s, TTL 3s", 3 * time.Second, []scheduler.LockerOption{scheduler.WithTTL(3 * time.Second)}},
		{"lock timeout above the spacing", 2 * time.Second, []scheduler.LockerOption{scheduler.WithTTL(2 * time.Second),
			scheduler.WithClockTolerance(500 * time.Millisecond), scheduler.WithLockTimeout(5 * time.Second)}},
		{"lock timeout math.MaxInt64", 3 * time.Second, []scheduler.LockerOption{scheduler.WithTTL(2 * time.Second), scheduler.WithLockTimeout(math.MaxInt64)}},
	} {
		if _, err := scheduler.NewLocker(gated(tt.gate), tt.opts...); err != nil {
			t.Errorf("NewLocker, %s: %v", tt.name, err)
		}
	}
	if _, err := scheduler.NewLocker(client(), scheduler.WithLockTimeout(math.MaxInt64), scheduler.WithTickResolution(math.MaxInt64)); err != nil {
		t.Errorf("NewLocker, lock timeout and resolution math.MaxInt64: %v", err)
	}
	// Per-second records live 2 x 500ms + 750ms, hourly ones 2 x 500ms + 1.5s.
	s, err := scheduler.New(gated(2*time.Second), scheduler.WithLockerOptions(scheduler.WithTTL(2*time.Second),
		scheduler.WithClockTolerance(500*time.Millisecond), scheduler.WithLockTimeout(1500*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	_, err = s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(func() {}), gocron.WithName("hourly"))
	checkText(t, "NewJob, hourly job, gate 2s", err, `scheduler: invalid argument: job "hourly": tick records every 1h0m0s live 2.5s `+
		"(2 x clock tolerance 500ms (WithClockTolerance), at least 100ms, + the Lock bound 1.5s (WithLockTimeout)): "+
		"TTL 2.5s is above the restart gate's maximum TTL 2s (WithRestartGating)", redlock.ErrInvalidArgument)
	if n := len(s.Jobs()); n != 0 {
		t.Errorf("NewJob failed but left %d jobs", n)
	}
	if _, err := s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() {}), gocron.WithName("every-second")); err != nil {
		t.Errorf("NewJob, per-second job, records 1.75s, gate 2s: %v", err)
	}
}

func TestLockErrorTexts(t *testing.T) {
	c, _ := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a, b := twoLockers(t, c, clock)
	ctx := context.Background()

	la, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Lock(ctx, "report")
	checkText(t, "Lock of a tick taken", err,
		`scheduler: job "report" tick 2026-01-01T12:00:00Z held by another instance: the tick was already taken by "a"`,
		scheduler.ErrHeldElsewhere)

	clock.Advance(time.Second) // a's run goes on into the next tick
	_, err = b.Lock(ctx, "report")
	checkText(t, "Lock while a run goes on", err,
		`scheduler: job "report" tick 2026-01-01T12:00:01Z held by another instance: its previous run is still running on "a"`,
		scheduler.ErrHeldElsewhere)
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Another process with a's instance ID took the tick.
	clock.Advance(time.Second)
	twin, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID("a"), scheduler.WithLockJitter(0))
	if err != nil {
		t.Fatal(err)
	}
	lt, err := twin.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lt.Unlock(ctx) })
	_, err = a.Lock(ctx, "report")
	checkText(t, "Lock of a tick taken by a twin", err,
		`scheduler: job "report" tick 2026-01-01T12:00:02Z held by another instance: the tick was already taken by "a", `+
			`another live instance with this instance's ID; give each instance its own ID (WithInstanceID)`,
		scheduler.ErrHeldElsewhere, scheduler.ErrDuplicateInstance)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Lock(cctx, "stopped")
	checkText(t, "Lock of a stopped job", err,
		`scheduler: job "stopped" tick 2026-01-01T12:00:02Z skipped: the job was stopped (Shutdown, RemoveJob, Update or StopJobs) `+
			`while its lock was being taken (context canceled)`,
		scheduler.ErrStopped, context.Canceled)

	_, err = b.Lock(ctx, "main.main.func1")
	checkText(t, "Lock of an unnamed function", err,
		`scheduler: job name is not stable across instances: "main.main.func1" is gocron's default name for an unnamed function; `+
			`name the job with gocron.WithName`, scheduler.ErrUnstableName)
	_, err = b.Lock(ctx, "")
	checkText(t, "Lock of an empty name", err,
		`scheduler: job name is not stable across instances: the job has no name; name it with gocron.WithName`, scheduler.ErrUnstableName)
	// A NUL byte: accepted, then every tick failed with redlock's error
	// about a resource name (found by an adversarial helper).
	_, err = b.Lock(ctx, "bad\x00name")
	checkText(t, "Lock of a name with a NUL byte", err,
		`scheduler: invalid argument: job name "bad\x00name" contains a NUL byte; name the job without one`, redlock.ErrInvalidArgument)
}

func TestNewJobErrorTexts(t *testing.T) {
	s := newMiniScheduler(t)
	task := gocron.NewTask(func() {})
	_, err := s.NewJob(gocron.DurationRandomJob(time.Second, 2*time.Second), task, gocron.WithName("jitter"))
	checkText(t, "NewJob of a random interval", err,
		`scheduler: a random-interval job has no ticks common to the instances: job "jitter" runs every 1s to 2s at random; `+
			`use a fixed interval (gocron.DurationJob) or a cron schedule`, scheduler.ErrRandomSchedule)

	first, err := s.NewJob(gocron.CronJob("* * * * * *", true), task, gocron.WithName("report"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), task, gocron.WithName("bad\x00name"))
	checkText(t, "NewJob of a name with a NUL byte", err,
		`scheduler: invalid argument: job name "bad\x00name" contains a NUL byte; name the job without one`, redlock.ErrInvalidArgument)

	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), task, gocron.WithName("report"))
	checkText(t, "NewJob of a name taken", err,
		`scheduler: duplicate job name: job `+first.ID().String()+` is already named "report"`, scheduler.ErrDuplicateName)
}

// TestUnavailableText: the head of the text is the scheduler's, the rest
// is redlock's count of the nodes, without redlock's package prefix.
func TestUnavailableText(t *testing.T) {
	c, ms := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a, _ := twoLockers(t, c, clock)
	for _, m := range ms[:2] {
		m.Close()
	}
	_, err := a.Lock(context.Background(), "report")
	want := regexp.MustCompile(`^scheduler: job "report" tick 2026-01-01T12:00:00Z skipped: Redis unavailable: ` +
		`(?:no quorum answered within the \S+ lock timeout: )?lock "schedlock:job:report" not acquired(?:: context deadline exceeded; the attempt)?: ` +
		`[0-3] of 3 nodes granted, quorum is 2, too many nodes failed: [^;]+; [^;]+; [^;]+$`)
	if !errors.Is(err, redlock.ErrUnavailable) || !want.MatchString(err.Error()) {
		t.Errorf("Lock with 2 of 3 nodes down = %v, want ErrUnavailable matching\n%s", err, want)
	}
	if strings.Contains(err.Error(), "redlock:") {
		t.Errorf("Lock error %q repeats redlock's package prefix", err)
	}
}
