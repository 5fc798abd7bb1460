package scheduler_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/schedlock/schedlock/elector"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/redlock/redlocktest"
	"github.com/schedlock/schedlock/scheduler"
)

// chromium returns the path of a headless-capable Chromium: $SCHEDLOCK_CHROMIUM,
// or chromium, chromium-browser or google-chrome in PATH. Without one the
// test is skipped with the install hint, except under CI=true, where it
// fails: .ci/run installs Debian's chromium.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SCHEDLOCK_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const hint = "no Chromium found (chromium, chromium-browser or google-chrome in PATH, or SCHEDLOCK_CHROMIUM): " +
		"the status page's browser test needs one; on Debian: apt-get install chromium (.ci/run does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(hint)
	}
	t.Skip(hint)
	return ""
}

// pageRow is one row of a job's run table as the browser shows it.
type pageRow struct {
	Scheduled string `json:"scheduled"` // ISO 8601, "" for a manual run
	Outcome   string `json:"outcome"`
	Instance  string `json:"instance"`
	Kind      string `json:"kind"`
}

// statusPage drives the page in a headless browser.
type statusPage struct {
	t   *testing.T
	ctx context.Context
	url string
}

// rows reloads the page and returns job's run table.
func (p *statusPage) rows(job string) (rows []pageRow, state string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => {
		const s = [...document.querySelectorAll('section.job')].find(e => e.dataset.job === %q);
		if (!s) return {rows: [], state: ""};
		return {state: s.querySelector('.job-state').textContent.trim(), rows: [...s.querySelectorAll('tr.run')].map(tr => ({
			scheduled: tr.querySelector('td.scheduled').title,
			outcome: tr.querySelector('.outcome').textContent.trim(),
			instance: tr.querySelector('td.instance').textContent.trim(),
			kind: tr.children[3].textContent.trim()}))};
	})()`, job)
	type table struct {
		Rows  []pageRow `json:"rows"`
		State string    `json:"state"`
	}
	if err := chromedp.Do(p.ctx, chromedp.Navigate(p.url)); err != nil {
		p.t.Fatalf("loading the status page: %v", err)
	}
	got, err := chromedp.Run(p.ctx, chromedp.Evaluate[table](js))
	if err != nil {
		p.t.Fatalf("reading the status page: %v", err)
	}
	return got.Rows, got.State
}

// click presses job's button of the form action (pause, resume, run),
// as a user does, and waits for the page it comes back to.
func (p *statusPage) click(job, action string) {
	p.t.Helper()
	sel := fmt.Sprintf(`section.job[data-job=%q] form[action=%q] button`, job, action)
	if err := chromedp.Do(p.ctx, chromedp.Navigate(p.url), chromedp.Click(chromedp.CSS(sel)), chromedp.WaitVisible(chromedp.CSS("div.notice"))); err != nil {
		p.t.Fatalf("pressing %s of %s: %v", action, job, err)
	}
}

// until reloads job's rows until cond holds, failing t after d.
func (p *statusPage) until(job string, d time.Duration, cond func(rows []pageRow, state string) bool) []pageRow {
	p.t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		rows, state := p.rows(job)
		if cond(rows, state) {
			return rows
		}
		if time.Now().After(end) {
			p.t.Fatalf("job %s: the page did not show what was awaited within %v; state %q, rows %+v", job, d, state, rows)
		}
	}
}

// TestStatusPageInABrowser loads the status page of a live fleet of three
// instances on real redis-server nodes in headless Chromium and uses it:
// each scheduled time is listed once with the instance that ran it; a
// scheduled time that ran nowhere shows as missed; Pause stops the job on
// every instance and Resume starts it again; Run now runs a job once.
func TestStatusPageInABrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	cl := redlocktest.Start(t, 3)
	ex := &executions{}
	const odd = `<b>bold</b> & "quoted"`
	fleet := startFleet(t, cl, 3, ex, []fleetJob{{"tick", everySecond}, {"nightly", daily}, {odd, daily}})
	// A leader election beside the jobs, shown on the page.
	e, err := elector.New(newRedlock(t, cl.Clients(t)), "reports-leader", elector.WithIdentity("i1"))
	if err != nil {
		t.Fatal(err)
	}
	ectx, stopElector := context.WithCancel(context.Background())
	electorDone := make(chan error, 1)
	go func() { electorDone <- e.Run(ectx) }()
	defer func() {
		stopElector()
		if err := <-electorDone; err != nil {
			t.Errorf("elector Run: %v", err)
		}
	}()
	h, err := fleet[0].Handler(scheduler.WithControls(true), scheduler.WithRefresh(0),
		scheduler.WithStatusOptions(scheduler.WithElections([]string{"reports-leader"})))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000))...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()
	p := &statusPage{t: t, ctx: ctx, url: srv.URL + "/?runs=40"}
	ids := map[string]bool{"i0": true, "i1": true, "i2": true}

	// Each scheduled time once, with the instance that ran it, as the run
	// record says.
	rows := p.until("tick", 20*time.Second, func(rows []pageRow, _ string) bool { return len(rows) >= 3 })
	record := map[string]string{}
	for _, r := range history(t, fleet[1], "tick") {
		record[r.Scheduled.Format(time.RFC3339Nano)] = r.Instance
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if r.Kind != "scheduled" || r.Outcome != "ok" || !ids[r.Instance] || seen[r.Scheduled] {
			t.Errorf("row %+v: want each scheduled time once, ok, with one of the fleet's instances", r)
		}
		seen[r.Scheduled] = true
		if inst, ok := record[r.Scheduled]; ok && inst != r.Instance {
			t.Errorf("row %+v: the run record says %s ran it", r, inst)
		}
	}
	// The election: its leader, with a term.
	var election []string
	waitFor(t, 10*time.Second, func() bool {
		if err := chromedp.Do(ctx, chromedp.Navigate(p.url)); err != nil {
			t.Fatal(err)
		}
		election, err = chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#elections tbody td')].map(td => td.textContent.trim())`))
		return err == nil && len(election) == 5 && election[1] == "led" && election[3] != ""
	})
	if election[0] != "reports-leader" || election[2] != "i1" {
		t.Errorf("elections row %q, want reports-leader led by i1, with a term", election)
	}
	// A name with markup shows as text.
	heading, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`[...document.querySelectorAll('section.job h3')].find(e => e.textContent === %q && !e.querySelector('b')) ? "text" : "missing"`, odd)))
	if err != nil || heading != "text" {
		t.Errorf("the job %q is not shown as text (%q, %v)", odd, heading, err)
	}

	// A scheduled time that ran nowhere: the run lock held for 2.5 s by
	// something that is not an instance (a crashed run's lock).
	outsider, err := redlock.New(cl.Clients(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outsider.Close(context.Background()) })
	if _, err := outsider.TryAcquire(ctx, []string{"schedlock:job:tick"}, 2500*time.Millisecond, redlock.WithMetadata("crashed-run")); err != nil {
		t.Fatal(err)
	}
	p.until("tick", 20*time.Second, func(rows []pageRow, _ string) bool {
		for _, r := range rows {
			if r.Outcome == "missed" && r.Kind == "missed" {
				return true
			}
		}
		return false
	})

	// Pause through the page: it stops on every instance.
	p.click("tick", "pause")
	waitFor(t, 10*time.Second, func() bool {
		for _, s := range fleet {
			if !s.Paused("tick") {
				return false
			}
		}
		return true
	})
	from := time.Now().Truncate(time.Second).Add(time.Second)
	pausedSince := func(rows []pageRow) int {
		n := 0
		for _, r := range rows {
			if at, err := time.Parse(time.RFC3339Nano, r.Scheduled); err == nil && at.After(from) {
				if r.Outcome != "paused" || !ids[r.Instance] {
					t.Fatalf("row %+v after every instance saw the pause: want paused, with its instance", r)
				}
				n++
			}
		}
		return n
	}
	p.until("tick", 20*time.Second, func(rows []pageRow, state string) bool { return state == "paused" && pausedSince(rows) >= 1 })
	before := ex.total("tick")
	p.until("tick", 20*time.Second, func(rows []pageRow, _ string) bool { return pausedSince(rows) >= 4 })
	if after := ex.total("tick"); after != before {
		t.Errorf("the job ran %d times on the fleet while the page showed it paused", after-before)
	}

	// Resume through the page: it runs again.
	p.click("tick", "resume")
	resumed := ex.total("tick")
	waitFor(t, 20*time.Second, func() bool { return ex.total("tick") >= resumed+2 })
	p.until("tick", 20*time.Second, func(rows []pageRow, state string) bool {
		return state != "paused" && len(rows) > 0 && rows[0].Outcome == "ok"
	})

	// Run now through the page: one run, on one instance.
	p.click("nightly", "run")
	manual := func(rows []pageRow) (n int) {
		for _, r := range rows {
			if r.Kind == "manual" && r.Outcome == "ok" && ids[r.Instance] {
				n++
			}
		}
		return n
	}
	p.until("nightly", 20*time.Second, func(rows []pageRow, _ string) bool { return manual(rows) >= 1 })
	time.Sleep(time.Second) // ten polls of every instance: a second run would start
	if rows, _ := p.rows("nightly"); manual(rows) != 1 || len(rows) != 1 || ex.total("nightly") != 1 {
		t.Errorf("after Run now: rows %+v, %d runs; want one manual run", rows, ex.total("nightly"))
	}

	if out := os.Getenv("SCHEDLOCK_STATUS_SCREENSHOT"); out != "" {
		if err := chromedp.Do(ctx, chromedp.Navigate(strings.Replace(p.url, "runs=40", "runs=12", 1))); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
