package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/scheduler"
)

// xssJob is a job name that a page must escape.
const xssJob = `<script>alert("x")</script>`

// pageFleet returns a Scheduler (not started: no instance takes run-now
// requests) with the jobs "report" and xssJob on miniredis nodes, and its
// page with controls on and off.
func pageFleet(t *testing.T) (s *scheduler.Scheduler, on, off *httptest.Server) {
	t.Helper()
	c, _ := miniClient(t, 3)
	s, err := scheduler.New(c, scheduler.WithLockerOptions(scheduler.WithInstanceID("web-1")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	for _, name := range []string{"report", xssJob} {
		if _, err := s.NewJob(gocron.CronJob("0 0 3 * * *", true), gocron.NewTask(func() {}), gocron.WithName(name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, controls := range []bool{true, false} {
		h, err := s.Handler(scheduler.WithControls(controls), scheduler.WithRefresh(0))
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		if controls {
			on = srv
		} else {
			off = srv
		}
	}
	return s, on, off
}

// browser is a cookie-keeping client that does not follow redirects.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar := &cookieJar{}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type cookieJar struct{ cookies []*http.Cookie }

func (j *cookieJar) SetCookies(_ *url.URL, cs []*http.Cookie) { j.cookies = append(j.cookies, cs...) }
func (j *cookieJar) Cookies(*url.URL) []*http.Cookie          { return j.cookies }

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token loads the page with c and returns its CSRF token.
func token(t *testing.T, c *http.Client, base string) string {
	t.Helper()
	code, body := get(t, c, base+"/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d: %s", code, body)
	}
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatal("the page has no CSRF token")
	}
	return m[1]
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post sends a form the way a browser does from the page itself, with
// headers changed by edit.
func post(t *testing.T, c *http.Client, u, body string, edit func(*http.Request)) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if edit != nil {
		edit(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestHandlerRefusesBadInput: every bad request gets a clear 4xx and
// changes nothing; a good one changes the fleet and comes back to the page.
func TestHandlerRefusesBadInput(t *testing.T) {
	s, on, off := pageFleet(t)
	c := browser(t)
	tok := token(t, c, on.URL)
	form := func(job string) string { return url.Values{"job": {job}, "csrf": {tok}}.Encode() }
	gets := []struct {
		path string
		code int
	}{
		{"/?runs=0", 400}, {"/?runs=1000000", 400}, {"/?runs=ten", 400}, {"/api/status?runs=-1", 400},
		{"/?job=" + url.QueryEscape(strings.Repeat("x", 2000)), 400},
		{"/?job=nope", 404}, {"/api/status?job=nope", 404}, {"/favicon.ico", 404}, {"/pause", 405},
	}
	for _, g := range gets {
		if code, body := get(t, c, on.URL+g.path); code != g.code || len(body) < 10 {
			t.Errorf("GET %s = %d %q, want %d with a reason", g.path, code, body, g.code)
		}
	}
	posts := []struct {
		name string
		srv  *httptest.Server
		path string
		body string
		edit func(*http.Request)
		code int
	}{
		{"controls disabled", off, "/pause", form("report"), nil, 403},
		{"cross-site", on, "/pause", form("report"), func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, 403},
		{"other origin", on, "/pause", form("report"), func(r *http.Request) {
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "https://evil.example")
		}, 403},
		{"no token", on, "/pause", url.Values{"job": {"report"}}.Encode(), nil, 403},
		{"wrong token", on, "/pause", url.Values{"job": {"report"}, "csrf": {strings.Repeat("0", 64)}}.Encode(), nil, 403},
		{"no cookie", on, "/pause", form("report"), nil, 403},
		{"json", on, "/pause", `{"job":"report"}`, func(r *http.Request) { r.Header.Set("Content-Type", "application/json") }, 415},
		{"huge", on, "/pause", form("report") + "&pad=" + strings.Repeat("x", 10000), nil, 413},
		{"malformed", on, "/pause", "job=%zz&csrf=" + tok, nil, 400},
		{"no job", on, "/pause", url.Values{"csrf": {tok}}.Encode(), nil, 400},
		{"two jobs", on, "/pause", form("report") + "&job=other", nil, 400},
		{"unknown job", on, "/pause", form("nope"), nil, 404},
		{"unknown job run", on, "/run", form("nope"), nil, 404},
		{"GET method", on, "/", form("report"), nil, 405},
	}
	noCookie := &http.Client{CheckRedirect: c.CheckRedirect}
	for _, p := range posts {
		client := c
		if p.name == "no cookie" {
			client = noCookie
		}
		resp := post(t, client, p.srv.URL+p.path, p.body, p.edit)
		if resp.StatusCode != p.code {
			t.Errorf("%s: POST %s = %d, want %d", p.name, p.path, resp.StatusCode, p.code)
		}
	}
	// Another browser's token is refused.
	other := browser(t)
	_ = token(t, other, on.URL)
	if resp := post(t, other, on.URL+"/pause", form("report"), nil); resp.StatusCode != 403 {
		t.Errorf("POST with another browser's token = %d, want 403", resp.StatusCode)
	}
	// Nothing changed.
	st, err := s.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range st.Jobs {
		if j.Paused || j.RunNow != nil {
			t.Errorf("job %q after refused requests: paused %v, run-now %+v; want nothing changed", j.Name, j.Paused, j.RunNow)
		}
	}
	// A good pause, and two run-now requests with no instance to take
	// them: the second is a conflict.
	resp := post(t, c, on.URL+"/pause", form("report"), nil)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "./?done=paused&target=report" {
		t.Errorf("POST /pause = %d to %q, want 303 to ./?done=paused&target=report", resp.StatusCode, loc)
	}
	if resp := post(t, c, on.URL+"/run", form(xssJob), nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("POST /run = %d, want 303", resp.StatusCode)
	}
	if resp := post(t, c, on.URL+"/run", form(xssJob), nil); resp.StatusCode != http.StatusConflict {
		t.Errorf("second POST /run = %d, want 409", resp.StatusCode)
	}
	st, err = s.Status(context.Background(), scheduler.WithJob("report"))
	if err != nil || !st.Jobs[0].Paused {
		t.Errorf("Status after the pause = %+v, %v; want report paused", st, err)
	}
	if _, err := s.Status(context.Background(), scheduler.WithRuns(101)); !errors.Is(err, redlock.ErrInvalidArgument) {
		t.Errorf("Status(WithRuns(101)) = %v, want ErrInvalidArgument", err)
	}
}

// TestHandlerEscapesNames: a job named like a script shows as text in
// the page and the JSON, never as markup.
func TestHandlerEscapesNames(t *testing.T) {
	_, on, _ := pageFleet(t)
	c := browser(t)
	code, body := get(t, c, on.URL+"/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	if strings.Contains(body, "<script") || !strings.Contains(body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Errorf("the page does not escape the job name %q:\n%s", xssJob, body)
	}
	code, body = get(t, c, on.URL+"/api/status?job="+url.QueryEscape(xssJob))
	var st scheduler.Status
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || len(st.Jobs) != 1 || st.Jobs[0].Name != xssJob {
		t.Fatalf("GET /api/status?job=... = %d %s", code, body)
	}
	if strings.Contains(body, "<script") {
		t.Errorf("the JSON has the job name unescaped: %s", body)
	}
}

// TestHandlerUnderAPrefix: mounted with http.StripPrefix, the page
// redirects its bare prefix to the prefix with a slash, and its links and
// forms are relative to it.
func TestHandlerUnderAPrefix(t *testing.T) {
	s, _, _ := pageFleet(t)
	h, err := s.Handler(scheduler.WithControls(true))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/scheduler/", http.StripPrefix("/ops/scheduler", h))
	mux.Handle("/ops/scheduler", http.StripPrefix("/ops/scheduler", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := browser(t)
	resp, err := c.Get(srv.URL + "/ops/scheduler")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusMovedPermanently || loc != "scheduler/" {
		t.Errorf("GET /ops/scheduler = %d to %q, want 301 to scheduler/", resp.StatusCode, loc)
	}
	code, body := get(t, c, srv.URL+"/ops/scheduler/")
	if code != http.StatusOK || !strings.Contains(body, `action="pause"`) || !strings.Contains(body, `href="api/status"`) ||
		!strings.Contains(body, `http-equiv="refresh" content="5; url=./"`) {
		t.Errorf("GET /ops/scheduler/ = %d, want the page with relative forms, links and refresh:\n%s", code, body)
	}
	if code, _ := get(t, c, srv.URL+"/ops/scheduler/api/status"); code != http.StatusOK {
		t.Errorf("GET /ops/scheduler/api/status = %d, want 200", code)
	}
	for _, bad := range []scheduler.HandlerOption{nil, scheduler.WithRefresh(time.Millisecond), scheduler.WithCSRFKey([]byte("short")),
		scheduler.WithStatusOptions(scheduler.WithRuns(0))} {
		if _, err := s.Handler(bad); !errors.Is(err, redlock.ErrInvalidArgument) {
			t.Errorf("Handler(bad option) = %v, want ErrInvalidArgument", err)
		}
	}
}
