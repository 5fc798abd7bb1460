package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"
)

// A timetable is a job's schedule as scheduled times: the instants at
// which gocron fires the job on every instance of a fleet. next returns
// the first scheduled time after t, or the zero time when there is none.
type timetable interface {
	next(t time.Time) time.Time
	// String describes the schedule in words ("cron */10 * * * * *",
	// "every 10s").
	String() string
}

// newTimetable returns the timetable of a gocron job schedule in loc (the
// scheduler's location), or an error matching ErrUnsharedSchedule (or
// ErrRandomSchedule) for a schedule whose scheduled times differ between
// instances: random intervals, cron's "@every", and daily, weekly or
// monthly jobs with an interval above 1 (gocron counts those intervals
// from each instance's own start).
func newTimetable(s gocron.JobSchedule, loc *time.Location) (timetable, error) {
	switch s := s.(type) {
	case gocron.CronJobSchedule:
		return newCronTable(s.Crontab, loc)
	case gocron.DurationJobSchedule:
		if s.Duration <= 0 {
			return nil, fmt.Errorf("%w: duration %v is not positive", ErrUnsharedSchedule, s.Duration)
		}
		return grid(s.Duration), nil
	case gocron.DurationRandomJobSchedule:
		return nil, fmt.Errorf("%w: it runs every %v to %v at random; use a fixed interval (gocron.DurationJob) or a cron schedule",
			ErrRandomSchedule, s.Min, s.Max)
	case gocron.DailyJobSchedule:
		return newCalendar("daily", s.Interval, s.AtTimes, loc, func(time.Time) bool { return true })
	case gocron.WeeklyJobSchedule:
		return newCalendar("weekly", s.Interval, s.AtTimes, loc, func(d time.Time) bool { return slices.Contains(s.DaysOfWeek, d.Weekday()) })
	case gocron.MonthlyJobSchedule:
		return newCalendar("monthly", s.Interval, s.AtTimes, loc, func(d time.Time) bool { return monthDay(d, s.Days, s.DaysFromEnd) })
	case gocron.OneTimeJobSchedule:
		times := slices.SortedFunc(slices.Values(s.StartAt), time.Time.Compare)
		return once(slices.CompactFunc(times, time.Time.Equal)), nil
	}
	return nil, fmt.Errorf("%w: schedule %T is not known to the scheduler", ErrUnsharedSchedule, s)
}

// cronTable is a cron schedule, parsed as gocron parses it (robfig/cron
// v3, seconds optional, in the scheduler's location unless the crontab
// names one with CRON_TZ= or TZ=).
type cronTable struct {
	spec  string
	sched cron.Schedule
}

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

func newCronTable(crontab string, loc *time.Location) (timetable, error) {
	spec := crontab
	if !strings.HasPrefix(spec, "TZ=") && !strings.HasPrefix(spec, "CRON_TZ=") {
		spec = "CRON_TZ=" + loc.String() + " " + spec
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("scheduler: parsing crontab %q: %w", crontab, err)
	}
	if _, ok := s.(cron.ConstantDelaySchedule); ok {
		return nil, fmt.Errorf("%w: %q counts from each instance's start; use gocron.DurationJob, which the scheduler aligns", ErrUnsharedSchedule, crontab)
	}
	return cronTable{spec: crontab, sched: s}, nil
}

// next is robfig's Next, except at a daylight-saving fall-back, where the
// same wall-clock time comes twice: like gocron, it runs the first only.
func (c cronTable) next(t time.Time) time.Time {
	n := c.sched.Next(t)
	if !n.IsZero() && repeated(n) {
		return c.sched.Next(n)
	}
	return n
}

// repeated reports whether the wall-clock time of t came once already,
// earlier the same day: t falls in the hour (or so) that a daylight-saving
// fall-back repeats.
func repeated(t time.Time) bool {
	_, now := t.Zone()
	_, before := t.Add(-3 * time.Hour).Zone()
	if before <= now {
		return false
	}
	e := t.Add(-time.Duration(before-now) * time.Second)
	return e.Hour() == t.Hour() && e.Minute() == t.Minute() && e.Second() == t.Second()
}

func (c cronTable) String() string { return "cron " + c.spec }

// grid is a duration job's schedule: the multiples of the interval since
// the zero time (time.Truncate), where Scheduler.NewJob anchors it.
type grid time.Duration

func (g grid) next(t time.Time) time.Time { return t.Truncate(time.Duration(g)).Add(time.Duration(g)) }
func (g grid) String() string             { return "every " + time.Duration(g).String() }

// once is a one-time job's scheduled times, sorted.
type once []time.Time

func (o once) next(t time.Time) time.Time {
	i, found := slices.BinarySearchFunc(o, t, time.Time.Compare)
	if found {
		i++
	}
	if i == len(o) {
		return time.Time{}
	}
	return o[i]
}

func (o once) String() string {
	if len(o) == 1 {
		return "once at " + o[0].Format(time.RFC3339)
	}
	return fmt.Sprintf("once at %d times", len(o))
}

// calendar is a daily, weekly or monthly schedule of interval 1: the
// times of day at on the days that match, in loc. A time of day that a
// daylight-saving change skips runs at the time the change moves it to
// (time.Date), as with gocron's default policy.
type calendar struct {
	kind  string
	at    []time.Time // times of day, sorted
	loc   *time.Location
	match func(day time.Time) bool
}

func newCalendar(kind string, interval uint, at []time.Time, loc *time.Location, match func(time.Time) bool) (timetable, error) {
	if interval != 1 {
		return nil, fmt.Errorf("%w: a %s job every %d intervals counts them from each instance's start; use interval 1 or a cron schedule",
			ErrUnsharedSchedule, kind, interval)
	}
	if len(at) == 0 {
		return nil, fmt.Errorf("%w: the %s job has no times of day", ErrUnsharedSchedule, kind)
	}
	at = slices.SortedFunc(slices.Values(at), func(a, b time.Time) int {
		return clockOf(a) - clockOf(b)
	})
	return calendar{kind: kind, at: at, loc: loc, match: match}, nil
}

// clockOf returns a time of day in seconds.
func clockOf(t time.Time) int { return t.Hour()*3600 + t.Minute()*60 + t.Second() }

func (c calendar) next(t time.Time) time.Time {
	t = t.In(c.loc)
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, c.loc)
	for range 400 { // a year and more: every calendar schedule matches within one
		if c.match(day) {
			for _, a := range c.at {
				s := time.Date(day.Year(), day.Month(), day.Day(), a.Hour(), a.Minute(), a.Second(), 0, c.loc)
				if s.After(t) {
					return s
				}
			}
		}
		day = time.Date(day.Year(), day.Month(), day.Day()+1, 0, 0, 0, 0, c.loc)
	}
	return time.Time{}
}

func (c calendar) String() string {
	times := make([]string, len(c.at))
	for i, a := range c.at {
		times[i] = a.Format("15:04:05")
	}
	return c.kind + " at " + strings.Join(times, ", ")
}

// monthDay reports whether day is one of days (1-31) or daysFromEnd (-1
// the last day of its month).
func monthDay(day time.Time, days, daysFromEnd []int) bool {
	if slices.Contains(days, day.Day()) {
		return true
	}
	last := time.Date(day.Year(), day.Month()+1, 0, 0, 0, 0, 0, day.Location()).Day()
	return slices.Contains(daysFromEnd, day.Day()-last-1)
}

// lookBack bounds how far back latest searches: a year and a day, so that
// a yearly schedule finds its last time.
const lookBack = 366 * 24 * time.Hour

// latest returns the latest scheduled time of tt at or before t, within
// lookBack; ok is false when there is none. It bisects on "next(x) <= t",
// which holds for every x before the answer and for none at or after it:
// about 35 calls of next. hint, when not zero, is an earlier answer: from
// it one or two calls of next usually suffice.
func latest(tt timetable, t, hint time.Time) (time.Time, bool) {
	if !hint.IsZero() && !hint.After(t) {
		s := hint
		for range 2 {
			n := tt.next(s)
			if n.IsZero() || n.After(t) {
				return s, true
			}
			s = n
		}
	}
	lo, hi := t.Add(-lookBack), t
	if n := tt.next(lo); n.IsZero() || n.After(t) {
		return time.Time{}, false
	}
	for hi.Sub(lo) > time.Millisecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if n := tt.next(mid); !n.IsZero() && !n.After(t) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return tt.next(lo), true
}
