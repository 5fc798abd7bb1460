package scheduler_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"sync"
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
			"scheduler: invalid argument: instance ID (WithInstanceID) is 1000 bytes, more than the maximum 973"},
		{"zero misfire threshold", c, []scheduler.LockerOption{scheduler.WithMisfireThreshold(0)},
			"scheduler: invalid argument: misfire threshold 0s (WithMisfireThreshold) is below the minimum 1ms"},
		{"negative catch-up", c, []scheduler.LockerOption{scheduler.WithCatchUp(-time.Second)},
			"scheduler: invalid argument: catch-up window -1s (WithCatchUp) is negative"},
		{"no history", c, []scheduler.LockerOption{scheduler.WithHistoryLength(0)},
			"scheduler: invalid argument: history length 0 (WithHistoryLength) must be between 1 and 10000"},
		{"short retention", c, []scheduler.LockerOption{scheduler.WithRecordRetention(time.Second)},
			"scheduler: invalid argument: record retention 1s (WithRecordRetention) is below 1m2s: a scheduled time's record must outlive its last Lock, " +
				"up to the misfire threshold 1m0s plus the lock timeout 1s after it, on a clock up to the clock tolerance 1s behind"},
		{"fast fleet poll", c, []scheduler.LockerOption{scheduler.WithFleetPoll(time.Millisecond)},
			"scheduler: invalid argument: fleet poll 1ms (WithFleetPoll) must be between 10ms and 1m"},
		{"slow fleet poll", c, []scheduler.LockerOption{scheduler.WithFleetPoll(time.Hour)},
			"scheduler: invalid argument: fleet poll 1h0m0s (WithFleetPoll) must be between 10ms and 1m"},
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
// shorter than the run lock's TTL refused every Lock at run time; NewLocker
// says so. A misfire threshold or catch-up window above the gate is
// rejected too (a run that late could find a restarted node's record
// gone); the default threshold follows a shorter gate.
func TestLockerRejectsTTLsTheClientRejects(t *testing.T) {
	gated := func(gate time.Duration) *redlock.Client {
		rdb := redis.NewClient(&redis.Options{Addr: "localhost:1"})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := redlock.New([]redis.UniversalClient{rdb}, redlock.WithRestartGating(gate))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	_, err := scheduler.NewLocker(gated(5 * time.Second))
	checkText(t, "NewLocker, gate 5s", err, "scheduler: run lock TTL 10s (WithTTL): invalid argument: "+
		"TTL 10s is above the restart gate's maximum TTL 5s (WithRestartGating)", redlock.ErrInvalidArgument)
	_, err = scheduler.NewLocker(gated(10*time.Second), scheduler.WithMisfireThreshold(time.Minute))
	checkText(t, "NewLocker, gate 10s, misfire threshold 1m", err, "scheduler: invalid argument: misfire threshold 1m0s (WithMisfireThreshold) "+
		"or catch-up window 0s (WithCatchUp) is above the redlock Client's restart gate 10s (redlock.WithRestartGating): "+
		"a node restarted without its data rejoins after the gate, and a run later than that could find its scheduled time free", redlock.ErrInvalidArgument)
	_, err = scheduler.NewLocker(gated(10*time.Second), scheduler.WithCatchUp(time.Minute))
	if !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("NewLocker, gate 10s, catch-up 1m: %v, want ErrInvalidArgument", err)
	}
	if _, err := scheduler.NewLocker(gated(10 * time.Second)); err != nil {
		t.Errorf("NewLocker, gate 10s, default misfire threshold: %v, want it lowered to the gate", err)
	}
	if _, err := scheduler.NewLocker(gated(3*time.Second), scheduler.WithTTL(3*time.Second), scheduler.WithLockTimeout(math.MaxInt64),
		scheduler.WithRecordRetention(math.MaxInt64)); err != nil {
		t.Errorf("NewLocker, gate 3s, TTL 3s, lock timeout math.MaxInt64: %v", err)
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
	checkText(t, "Lock of a scheduled time taken", err,
		`scheduler: job "report" scheduled time 2026-01-01T12:00:00Z held by another instance: "a" took it`,
		scheduler.ErrHeldElsewhere)

	clock.Advance(time.Second) // a's run goes on into the next tick
	_, err = b.Lock(ctx, "report")
	checkText(t, "Lock while a run goes on", err,
		`scheduler: job "report" scheduled time 2026-01-01T12:00:01Z held by another instance: a run of the job is in progress on "a"`,
		scheduler.ErrHeldElsewhere)
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Another process with a's instance ID took the scheduled time.
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
	checkText(t, "Lock of a scheduled time taken by a twin", err,
		`scheduler: job "report" scheduled time 2026-01-01T12:00:02Z held by another instance: "a" took it, `+
			`another live instance with this instance's ID; give each instance its own ID (WithInstanceID)`,
		scheduler.ErrHeldElsewhere, scheduler.ErrDuplicateInstance)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Lock(cctx, "stopped")
	checkText(t, "Lock of a stopped job", err,
		`scheduler: job "stopped" scheduled time 2026-01-01T12:00:02Z skipped: the job was stopped (Shutdown, RemoveJob, Update or StopJobs) `+
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
		`scheduler: a random-interval job has no scheduled times common to the instances: it runs every 1s to 2s at random; `+
			`use a fixed interval (gocron.DurationJob) or a cron schedule (job "jitter")`, scheduler.ErrRandomSchedule)
	_, err = s.NewJob(gocron.DailyJob(2, gocron.NewAtTimes(gocron.NewAtTime(9, 0, 0))), task, gocron.WithName("every-other-day"))
	checkText(t, "NewJob of a daily job every 2 days", err,
		`scheduler: the job's scheduled times differ between instances: a daily job every 2 intervals counts them from each instance's start; `+
			`use interval 1 or a cron schedule (job "every-other-day")`, scheduler.ErrUnsharedSchedule)
	_, err = s.NewJob(gocron.CronJob("@every 5s", false), task, gocron.WithName("every5"))
	checkText(t, "NewJob of @every", err,
		`scheduler: the job's scheduled times differ between instances: "@every 5s" counts from each instance's start; `+
			`use gocron.DurationJob, which the scheduler aligns (job "every5")`, scheduler.ErrUnsharedSchedule)

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
	want := regexp.MustCompile(`^scheduler: job "report" scheduled time 2026-01-01T12:00:00Z skipped: Redis unavailable: ` +
		`(?:no quorum answered within the \S+ bound of its Lock: )?lock "schedlock:job:report" not acquired(?:: context deadline exceeded; the attempt)?: ` +
		`[0-3] of 3 nodes granted, quorum is 2, too many nodes failed: [^;]+; [^;]+; [^;]+$`)
	if !errors.Is(err, redlock.ErrUnavailable) || !want.MatchString(err.Error()) {
		t.Errorf("Lock with 2 of 3 nodes down = %v, want ErrUnavailable matching\n%s", err, want)
	}
	if strings.Contains(err.Error(), "redlock:") {
		t.Errorf("Lock error %q repeats redlock's package prefix", err)
	}
}

// TestMisconfiguredText: nodes that answer with an error an operator must
// fix (here a password the go-redis clients do not send) skip the run with
// redlock.ErrMisconfigured, not ErrUnavailable, and the text names the
// fix.
func TestMisconfiguredText(t *testing.T) {
	c, ms := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a, _ := twoLockers(t, c, clock)
	for _, m := range ms[:2] {
		m.RequireAuth("secret")
	}
	_, err := a.Lock(context.Background(), "report")
	if !errors.Is(err, redlock.ErrMisconfigured) || errors.Is(err, redlock.ErrUnavailable) {
		t.Fatalf("Lock with 2 of 3 nodes refusing the client's password = %v, want ErrMisconfigured, not ErrUnavailable", err)
	}
	for _, want := range []string{`scheduler: job "report" scheduled time 2026-01-01T12:00:00Z skipped: Redis nodes misconfigured: `,
		"NOAUTH", "set Password"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Lock error %q does not contain %q", err, want)
		}
	}
}

// TestHoldersAreNamedByInstance: a redlock error quoted in a Lock's error
// names the instance that holds the job, not its run lock's metadata.
func TestHoldersAreNamedByInstance(t *testing.T) {
	c, ms := miniClient(t, 3)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a, b := twoLockers(t, c, clock)
	ctx := context.Background()
	held, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	// a's Lock returned at a quorum: one node may lack its keys. That
	// node and one other refuse b's password; the third names a.
	refusing := 0
	for i, m := range ms {
		if m.Exists("schedlock:job:report") {
			refusing = i
		}
	}
	for i, m := range ms {
		if i != refusing {
			m.RequireAuth("secret")
		}
	}
	_, err = b.Lock(ctx, "report")
	if !errors.Is(err, redlock.ErrMisconfigured) {
		t.Fatalf("Lock with 2 of 3 nodes refusing the password = %v, want ErrMisconfigured", err)
	}
	for _, want := range []string{`skipped: Redis nodes misconfigured: lock "schedlock:job:report" not acquired`,
		`the job's record holds the scheduled time 2026-01-01T12:00:00Z, taken by instance "a"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Lock error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `"a@`) {
		t.Errorf("Lock error %q quotes the run lock's metadata", err)
	}
}

// TestRefusalTextNamesTheScheduledTime: the job's record of scheduled
// times is described by the time it holds and the instance that took it,
// a run lock by the instance that holds it.
func TestRefusalTextNamesTheScheduledTime(t *testing.T) {
	r := redlock.NodeResult{Outcome: redlock.OutcomeHeld, Holder: "vm-3@1796180510002/bb/2592000000", Resource: "schedlock:taken:report",
		HolderTTL: 719 * time.Hour, HolderMark: time.Date(2026, 12, 2, 8, 28, 45, 0, time.UTC).UnixMilli()}
	want := `the job's record holds the scheduled time 2026-12-02T08:28:45Z, taken by instance "vm-3"`
	if got := scheduler.RefusalText(r); got != want {
		t.Errorf("text\n%s\nwant\n%s", got, want)
	}
	r = redlock.NodeResult{Outcome: redlock.OutcomeHeld, Holder: "app/vm-514-915e@1796180510000/b324c077/2750", HolderTTL: 2686 * time.Millisecond}
	want = `the run lock is held by instance "app/vm-514-915e" for another 2.686s`
	if got := scheduler.RefusalText(r); got != want {
		t.Errorf("text\n%s\nwant\n%s", got, want)
	}
}

// TestOneMisconfiguredNodeRunsQuietly: with one node of three refusing the
// clients' password, runs go on, and their releases (confirmed by a
// quorum) are not warned about at each run: redlock logs the node once.
func TestOneMisconfiguredNodeRunsQuietly(t *testing.T) {
	c, ms := miniClient(t, 3)
	ms[2].RequireAuth("secret")
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	l, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID("a"),
		scheduler.WithLockJitter(0), scheduler.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	unlockErrs := 0
	// Until a release names the node (one that returned at a quorum before
	// the node's answer is nil), then a few runs more.
	for i, deadline := 0, time.Now().Add(10*time.Second); unlockErrs == 0 || i < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no release reported the misconfigured node within 10 s")
		}
		lk, err := l.Lock(ctx, "report")
		if err != nil {
			t.Fatal(err)
		}
		// nil when the release returned at a quorum before the node's
		// answer; else the error names the node where it could not run.
		if err := lk.Unlock(ctx); err != nil {
			unlockErrs++
			if errors.Is(err, redlock.ErrLockLost) || !strings.Contains(err.Error(), "could not run") {
				t.Errorf("Unlock = %v, want the release's error naming the node where it could not run", err)
			}
		}
		clock.Advance(time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("runs with one misconfigured node were warned about:\n%s", logs.String())
	}
}

// writerFunc is an io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestSkippedRunsAreLogged: runs skipped because too many nodes are
// misconfigured are logged on the Locker's logger, once a minute per job
// and reason, so that the logs alone say that the job stopped running.
func TestSkippedRunsAreLogged(t *testing.T) {
	c, ms := miniClient(t, 3)
	for _, m := range ms[:2] {
		m.RequireAuth("secret")
	}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	l, err := scheduler.NewLocker(c, scheduler.WithClock(clock), scheduler.WithInstanceID("a"),
		scheduler.WithLockJitter(0), scheduler.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.Lock(context.Background(), "report"); !errors.Is(err, redlock.ErrMisconfigured) {
			t.Fatalf("Lock = %v, want ErrMisconfigured", err)
		}
		clock.Advance(time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	got := strings.Count(logs.String(), "scheduler: run skipped")
	if got != 1 || !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "set Password") {
		t.Errorf("want one error line naming the fix for 3 skipped runs, got %d:\n%s", got, logs.String())
	}
}

// TestHistoryArgumentText: History's n names itself, not the history
// length setting (WithHistoryLength); an unknown job has no record and no
// error.
func TestHistoryArgumentText(t *testing.T) {
	c, _ := miniClient(t, 1)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	a, _ := twoLockers(t, c, clock)
	ctx := context.Background()
	_, err := a.History(ctx, "report", 0)
	checkText(t, "History with n 0", err,
		`scheduler: invalid argument: History of "report": n 0 (entries wanted) is below 1`, redlock.ErrInvalidArgument)
	runs, err := a.History(ctx, "no-such-job", 5)
	if err != nil || len(runs) != 0 {
		t.Errorf("History of a job without a record = %v, %v; want none and no error", runs, err)
	}
}
