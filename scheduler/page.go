package scheduler

import (
	_ "embed"
	"fmt"
	"hash/fnv"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The status page's template and what it shows (Handler). The template
// (status.html) is html/template: every name, error text and URL
// parameter is escaped in its context.

//go:embed status.html
var pageSource string

var pageTemplate = template.Must(template.New("status").Parse(pageSource))

// pageView is what the template renders.
type pageView struct {
	Now        timeView
	Zone       string
	Instance   string
	Refresh    int    // seconds; 0: no refresh
	RefreshURL string // the page without its notice
	Notice     string
	Warning    string
	Controls   bool
	CSRF       string
	Filter     string // the job shown alone, if any
	Runs       int
	Summary    []chip
	Instances  []instanceView
	Elections  []electionView
	Jobs       []jobView
}

// chip is a count in the summary line.
type chip struct {
	Label string
	Count int
	Class string
}

// timeView is an instant as the page shows it: relative to the read
// ("3s ago", "in 5s"), absolute in the scheduler's location, and ISO 8601
// for the title.
type timeView struct {
	Rel, Abs, ISO string
}

type instanceView struct {
	ID, Hue, State, Class string
	LastSeen, Started     timeView
	Offset                string
	Jobs                  int
	Differs               []string
}

type electionView struct {
	Name, Leader, State, Class string
	Term                       string
	Since                      timeView
}

type jobView struct {
	Name, Link, Anchor string
	Schedule           string
	Next               timeView
	HasNext            bool
	State, Class       string
	Paused             bool
	PausedBy           string
	PausedAt           timeView
	Running            *runningView
	RunNow             *runNowView
	Runs               []runView
	Missed, Late       int
	Stale              bool
	Registered         timeView
}

type runningView struct {
	Instance          string
	Since, ValidUntil timeView
}

type runNowView struct {
	State, Class, Text string
	Asked              timeView
}

type runView struct {
	Scheduled      timeView
	ScheduledExtra string // a missed entry's range
	Kind           string
	Instance, Hue  string
	Started        timeView
	Duration       string
	Outcome, Class string
	Error          string
}

// notices are the texts of the page's ?done= parameter after a control.
var notices = map[string]string{
	"paused":    "Paused %q on every instance: its scheduled times are skipped and recorded as paused (within about a fleet poll).",
	"resumed":   "Resumed %q: its next scheduled time runs as usual.",
	"requested": "Asked the fleet to run %q now, once: the first instance to poll runs it; its state shows below.",
}

// view builds the page of st (read with err, if any) for the page's
// parameters.
func (h *handler) view(st *Status, err error, runs int, job string, q url.Values) pageView {
	loc := h.s.locker.cfg.location
	at := func(t time.Time) timeView { return timeAt(t, st.At, loc) }
	v := pageView{Now: at(st.At), Zone: st.At.In(loc).Format("MST"), Instance: st.Instance, Controls: h.cfg.controls, Filter: job, Runs: runs,
		Refresh: int(h.cfg.refresh / time.Second)}
	keep := url.Values{}
	if job != "" {
		keep.Set("job", job)
	}
	if q.Get("runs") != "" {
		keep.Set("runs", strconv.Itoa(runs))
	}
	v.RefreshURL = "./"
	if len(keep) > 0 {
		v.RefreshURL += "?" + keep.Encode()
	}
	if f, ok := notices[q.Get("done")]; ok {
		v.Notice = fmt.Sprintf(f, q.Get("target"))
	}
	if err != nil {
		v.Warning = "Part of this page was read from fewer than a quorum of Redis nodes, and may be incomplete: " + err.Error()
	}
	counts := map[string]int{}
	for _, in := range st.Instances {
		iv := instanceView{ID: in.ID, Hue: hue(in.ID), State: in.State, Class: "b-" + in.State, LastSeen: at(in.LastSeen), Started: at(in.Started),
			Offset: formatOffset(in.ClockOffset, in.OffsetError), Jobs: in.Jobs, Differs: in.Differs}
		v.Instances = append(v.Instances, iv)
		if in.State == "up" {
			counts["instances"]++
		}
	}
	for _, e := range st.Elections {
		ev := electionView{Name: e.Name, Leader: e.Leader, State: "led", Class: "b-ok", Since: at(e.Since)}
		switch {
		case e.Unknown:
			ev.State, ev.Class = "unknown", "b-missed"
		case e.Leader == "":
			ev.State, ev.Class = "no leader", "b-failed"
		}
		if e.Term != 0 {
			ev.Term = strconv.FormatUint(e.Term, 10)
		}
		v.Elections = append(v.Elections, ev)
	}
	for _, j := range st.Jobs {
		jv := h.jobView(j, at)
		counts[jv.State]++
		if j.Paused {
			counts["paused jobs"]++
		}
		counts["missed times"] += j.Missed
		v.Jobs = append(v.Jobs, jv)
	}
	v.Summary = []chip{
		{"jobs", len(st.Jobs), "b-neutral"},
		{"running now", counts["running"], "b-running"},
		{"last run failed", counts["failed"], "b-failed"},
		{"missed scheduled times", counts["missed times"], "b-missed"},
		{"paused", counts["paused jobs"], "b-paused"},
		{"instances up", counts["instances"], "b-up"},
	}
	return v
}

// jobView builds one job's part of the page.
func (h *handler) jobView(j JobStatus, at func(time.Time) timeView) jobView {
	q := url.Values{"job": {j.Name}}
	jv := jobView{Name: j.Name, Link: "./?" + q.Encode(), Anchor: "job-" + anchor(j.Name), Schedule: j.Schedule,
		Next: at(j.Next), HasNext: !j.Next.IsZero(), Paused: j.Paused, PausedBy: j.PausedBy, PausedAt: at(j.PausedAt),
		Missed: j.Missed, Late: j.Late, Stale: j.Stale, Registered: at(j.Registered)}
	if jv.Schedule == "" {
		jv.Schedule = "schedule not known here"
	}
	if r := j.Running; r != nil {
		jv.Running = &runningView{Instance: r.Instance, Since: at(r.Since), ValidUntil: at(r.ValidUntil)}
	}
	if r := j.RunNow; r != nil {
		jv.RunNow = newRunNowView(r, at)
	}
	for _, r := range j.Runs {
		jv.Runs = append(jv.Runs, newRunView(r, at))
	}
	jv.State = pageState(j)
	jv.Class = "b-" + strings.ReplaceAll(jv.State, " ", "-")
	return jv
}

// newRunNowView builds the view of a job's run-now request.
func newRunNowView(r *RunNowStatus, at func(time.Time) timeView) *runNowView {
	rv := &runNowView{State: r.State, Asked: at(r.Asked), Class: "b-ended"}
	switch r.State {
	case requestPending:
		rv.Text, rv.Class = "waiting for an instance", "b-running"
	case requestStarted:
		rv.Text, rv.Class = "started on "+r.Instance, "b-ok"
	case requestRefused:
		rv.Text, rv.Class = "refused on "+r.Instance+": "+r.Error, "b-failed"
	default:
		rv.Text, rv.Class = "no instance took it", "b-missed"
	}
	return rv
}

// newRunView builds the view of one entry of a job's run record.
func newRunView(r Run, at func(time.Time) timeView) runView {
	rv := runView{Scheduled: at(r.Scheduled), Kind: r.Kind, Instance: r.Instance, Hue: hue(r.Instance), Started: at(r.Started),
		Outcome: r.Outcome, Class: "b-" + r.Outcome, Error: r.Error}
	if r.Scheduled.IsZero() {
		rv.Scheduled = timeView{Rel: "—", Abs: "none (manual)"}
	}
	if r.Kind == kindMissed && r.Missed > 1 {
		rv.ScheduledExtra = fmt.Sprintf("to %s, %d scheduled times", at(r.Last).Abs, r.Missed)
	}
	if !r.Ended.IsZero() && !r.Started.IsZero() {
		rv.Duration = formatDuration(r.Ended.Sub(r.Started))
	}
	return rv
}

// pageState returns a job's state on the page, most urgent first.
func pageState(j JobStatus) string {
	switch last := lastRun(j.Runs); {
	case j.Running != nil:
		return "running"
	case j.Paused:
		return "paused"
	case last != nil && (last.Outcome == outcomeFailed || last.Outcome == outcomeLost):
		return "failed"
	case j.Missed > 0 && len(j.Runs) > 0 && j.Runs[0].Kind == kindMissed:
		return "missed"
	case j.Stale:
		return "stale"
	case last == nil:
		return "no runs yet"
	}
	return "ok"
}

// lastRun returns the newest entry of runs that ran the job, or nil.
func lastRun(runs []Run) *Run {
	for i, r := range runs {
		if r.Kind != kindMissed && r.Kind != kindLate && r.Outcome != outcomePaused {
			return &runs[i]
		}
	}
	return nil
}

// hue returns the class of an instance's colour ("h0" to "h7"), the same
// wherever the page shows it, so that who ran what reads at a glance.
func hue(instance string) string {
	h := fnv.New32a()
	h.Write([]byte(instance))
	return "h" + strconv.Itoa(int(h.Sum32()%8))
}

// anchor returns an HTML id fragment for a job name (the name itself is
// escaped where it is shown).
func anchor(name string) string {
	var b strings.Builder
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, ".%x", r)
		}
	}
	return b.String()
}

// timeAt returns t as the page shows it, relative to now.
func timeAt(t, now time.Time, loc *time.Location) timeView {
	if t.IsZero() {
		return timeView{Rel: "—", Abs: "—"}
	}
	d := t.Sub(now)
	rel := "now"
	switch {
	case d > 0 && d < time.Second:
		rel = "in <1s"
	case d >= time.Second:
		rel = "in " + formatDuration(d)
	case d <= -time.Second:
		rel = formatDuration(-d) + " ago"
	}
	t = t.In(loc)
	abs := t.Format("15:04:05")
	y1, m1, d1 := t.Date()
	if y2, m2, d2 := now.In(loc).Date(); y1 != y2 || m1 != m2 || d1 != d2 {
		abs = t.Format("Jan 2 15:04:05")
	}
	return timeView{Rel: rel, Abs: abs, ISO: t.Format(time.RFC3339Nano)}
}

// formatDuration formats d coarsely, for people: 850ms, 12s, 3m 5s,
// 2h 10m, 3d 4h.
func formatDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 0, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// formatOffset formats a clock offset with its sign and error: +250ms
// ±2ms, -1.2s ±1ms, 0ms.
func formatOffset(d, err time.Duration) string {
	d = d.Round(time.Millisecond)
	s := d.String()
	switch {
	case d == 0:
		s = "0ms"
	case d > 0:
		s = "+" + s
	}
	if err > 0 {
		s += " ±" + err.Round(time.Millisecond).String()
	}
	return s
}
