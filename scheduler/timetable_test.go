package scheduler

import (
	"errors"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// TestTimetablesMatchGocron: for each kind of schedule, the scheduled
// times a timetable gives are the ones gocron fires at, read from a real
// gocron scheduler's NextRuns on the same clock and location.
func TestTimetablesMatchGocron(t *testing.T) {
	loc, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	s, err := gocron.NewScheduler(gocron.WithLocation(loc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	s.Start()
	at := gocron.NewAtTimes(gocron.NewAtTime(9, 30, 0), gocron.NewAtTime(17, 0, 5))
	defs := map[string]gocron.JobDefinition{
		"cron":    gocron.CronJob("*/7 * * * *", false),
		"seconds": gocron.CronJob("5,35 * * * * *", true),
		"daily":   gocron.DailyJob(1, at),
		"weekly":  gocron.WeeklyJob(1, gocron.NewWeekdays(time.Monday, time.Thursday), at),
		"monthly": gocron.MonthlyJob(1, gocron.NewDaysOfTheMonth(1, -1, 15), at),
	}
	for name, def := range defs {
		j, err := s.NewJob(def, gocron.NewTask(func() {}), gocron.WithName(name))
		if err != nil {
			t.Fatal(err)
		}
		tt, err := newTimetable(j.Schedule(), loc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := j.NextRuns(6)
		if err != nil || len(want) != 6 {
			t.Fatalf("%s: NextRuns = %v, %v", name, want, err)
		}
		for i := 1; i < len(want); i++ {
			if got := tt.next(want[i-1]); !got.Equal(want[i]) {
				t.Errorf("%s (%v): next(%v) = %v, want gocron's %v", name, tt, want[i-1], got, want[i])
			}
			if got, ok := latest(tt, want[i].Add(-time.Millisecond), time.Time{}); !ok || !got.Equal(want[i-1]) {
				t.Errorf("%s: latest before %v = %v, %v; want %v", name, want[i], got, ok, want[i-1])
			}
			if got, ok := latest(tt, want[i], want[i-1]); !ok || !got.Equal(want[i]) {
				t.Errorf("%s: latest at %v with a hint = %v, %v; want it", name, want[i], got, ok)
			}
		}
	}
}

// TestLatest: the latest scheduled time at or before t, on a grid and on
// a one-time schedule, with hints before, at and after the answer.
func TestLatest(t *testing.T) {
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	g := grid(5 * time.Second)
	for _, tc := range []struct {
		t, hint time.Duration
		want    time.Duration
	}{
		{0, -1, 0},
		{4999 * time.Millisecond, -1, 0},
		{5 * time.Second, -1, 5 * time.Second},
		{12 * time.Second, 5 * time.Second, 10 * time.Second},
		{22 * time.Second, 5 * time.Second, 20 * time.Second}, // hint too old: bisect
	} {
		hint := time.Time{}
		if tc.hint >= 0 {
			hint = base.Add(tc.hint)
		}
		got, ok := latest(g, base.Add(tc.t), hint)
		if !ok || !got.Equal(base.Add(tc.want)) {
			t.Errorf("latest(+%v, hint +%v) = %v, %v; want +%v", tc.t, tc.hint, got.Sub(base), ok, tc.want)
		}
	}
	o := once{base.Add(time.Hour), base.Add(2 * time.Hour)}
	if _, ok := latest(o, base, time.Time{}); ok {
		t.Error("latest before a one-time job's first time: ok, want none")
	}
	if got, ok := latest(o, base.Add(90*time.Minute), time.Time{}); !ok || !got.Equal(base.Add(time.Hour)) {
		t.Errorf("latest of a one-time job = %v, %v; want its first time", got, ok)
	}
	if got := o.next(base.Add(2 * time.Hour)); !got.IsZero() {
		t.Errorf("next after a one-time job's last time = %v, want none", got)
	}
}

// TestUnsharedSchedules: schedules whose times each instance counts from
// its own start have no timetable.
func TestUnsharedSchedules(t *testing.T) {
	at := gocron.NewAtTimes(gocron.NewAtTime(9, 0, 0))
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	for name, def := range map[string]gocron.JobDefinition{
		"@every":          gocron.CronJob("@every 1m", false),
		"daily every 2":   gocron.DailyJob(2, at),
		"weekly every 3":  gocron.WeeklyJob(3, gocron.NewWeekdays(time.Monday), at),
		"monthly every 2": gocron.MonthlyJob(2, gocron.NewDaysOfTheMonth(1), at),
	} {
		j, err := s.NewJob(def, gocron.NewTask(func() {}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newTimetable(j.Schedule(), time.UTC); !errors.Is(err, ErrUnsharedSchedule) {
			t.Errorf("%s: %v, want ErrUnsharedSchedule", name, err)
		}
	}
}

// TestCronSkipsTheRepeatedHourAtFallBack: at a daylight-saving fall-back
// the same wall-clock time comes twice; gocron runs a cron job once, at
// the first, and so does the timetable (robfig alone gives both, which
// read as a scheduled time missed every autumn).
func TestCronSkipsTheRepeatedHourAtFallBack(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	tt, err := newTimetable(gocron.CronJobSchedule{Crontab: "0 30 1 * * *"}, ny)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Date(2026, 11, 1, 1, 30, 0, 0, ny) // EDT, the first 01:30
	if got := tt.next(first.Add(-time.Hour)); !got.Equal(first) {
		t.Fatalf("next before the fall-back = %v, want %v", got, first)
	}
	want := time.Date(2026, 11, 2, 1, 30, 0, 0, ny)
	if got := tt.next(first); !got.Equal(want) {
		t.Errorf("next after the first 01:30 of the fall-back = %v, want the next day's %v", got, want)
	}
	if got, ok := latest(tt, want.Add(-time.Minute), time.Time{}); !ok || !got.Equal(first) {
		t.Errorf("latest before the next day's run = %v, want the first 01:30 %v", got, first)
	}
}
