package scheduler

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/schedlock/schedlock/redlock"
)

// HandlerOption configures Scheduler.Handler.
type HandlerOption func(*handlerConfig)

type handlerConfig struct {
	controls bool
	refresh  time.Duration
	key      []byte
	status   []StatusOption
}

// DefaultRefresh is how often the status page reloads itself
// (WithRefresh).
const DefaultRefresh = 5 * time.Second

// WithControls turns the fleet controls on (true) or off: the page's
// Pause, Resume and Run now buttons and the POST endpoints behind them.
// Default off: a POST is then 403.
func WithControls(on bool) HandlerOption { return func(c *handlerConfig) { c.controls = on } }

// WithRefresh sets how often the page reloads itself (an HTML meta
// refresh, no JavaScript). Default DefaultRefresh (5 s); 0 turns it off;
// Handler rejects negative values and values below 1 s.
func WithRefresh(d time.Duration) HandlerOption { return func(c *handlerConfig) { c.refresh = d } }

// WithCSRFKey sets the key of the page's CSRF tokens. Default: a random
// key per Handler, so that a form served by one instance is refused by
// another: behind a load balancer that does not keep a browser on one
// instance, give every instance the same key (a secret of at least 32
// bytes). Handler rejects shorter keys.
func WithCSRFKey(key []byte) HandlerOption {
	return func(c *handlerConfig) { c.key = append([]byte(nil), key...) }
}

// WithStatusOptions passes options to the Handler's Status reads, e.g.
// WithElections, or WithRuns for the default number of runs per job
// (the page's ?runs= overrides it, within the history length).
func WithStatusOptions(opts ...StatusOption) HandlerOption {
	return func(c *handlerConfig) { c.status = append(c.status, opts...) }
}

// Limits of the handler's input.
const (
	maxForm    = 8 << 10 // bytes of a POST body
	maxJobName = 1000    // bytes of a job parameter
)

// csrfCookie names the cookie of the CSRF token.
const csrfCookie = "schedlock_csrf"

// handler is the http.Handler of Scheduler.Handler.
type handler struct {
	s    *Scheduler
	cfg  handlerConfig
	runs int // default runs per job
	cop  *http.CrossOriginProtection
	page *template.Template
}

// Handler returns the fleet's status page: it serves the fleet's state
// (Status) as a web page and as JSON, and, when the application enables
// them, the fleet controls (Pause, Resume, RequestRun) as forms. It has
// no authentication of its own: mount it behind the application's
// (docs/operations.md).
//
//	GET  /             the page: server-rendered (html/template), no
//	                   JavaScript, refreshing itself (WithRefresh);
//	                   ?job=NAME shows one job, ?runs=N its newest N runs
//	GET  /api/status   the same as JSON (Status), same parameters
//	POST /pause        job=NAME: Pause      (WithControls(true) only)
//	POST /resume       job=NAME: Resume
//	POST /run          job=NAME: RequestRun
//
// Paths are relative to where it is mounted: under a prefix, strip it
// (http.StripPrefix("/ops/scheduler", h)) and link to the prefix with a
// trailing slash; the page's links and forms are relative. A POST must be
// a same-origin form (http.CrossOriginProtection: the browser's
// Sec-Fetch-Site or Origin header) carrying the page's CSRF token, an
// HMAC of a random cookie that the page sets (double-submit, so that a
// token obtained by one browser is refused from another); it gets 303 See
// Other back to the page. Bad input changes nothing and gets a 4xx with
// a plain-text reason: 400 (bad runs or job parameter, malformed form),
// 403 (controls disabled, cross-origin request, missing or wrong CSRF
// token), 404 (unknown path or job), 405 (wrong method), 409 (a run-now
// request already pending), 413 (form over 8 KiB), 415 (not a form).
// Redis unavailable is 503. The page shows no lock values, owner tokens
// or fencing tokens: instance IDs, job names, schedules, settings and the
// error texts of runs.
//
// It starts nothing; each request reads the nodes (Status), bounded by
// the request's context. Errors match redlock.ErrInvalidArgument: a nil
// option, a refresh below 1 s, a CSRF key shorter than 32 bytes, a bad
// StatusOption. Safe for concurrent use.
func (s *Scheduler) Handler(opts ...HandlerOption) (http.Handler, error) {
	cfg := handlerConfig{refresh: DefaultRefresh}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("HandlerOption %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	switch {
	case cfg.refresh < 0 || cfg.refresh > 0 && cfg.refresh < time.Second:
		return nil, invalidf("refresh %v (WithRefresh) must be 0 (off) or at least 1s", cfg.refresh)
	case cfg.key != nil && len(cfg.key) < 32:
		return nil, invalidf("CSRF key (WithCSRFKey) is %d bytes, fewer than 32", len(cfg.key))
	case cfg.key == nil:
		cfg.key = make([]byte, 32)
		_, _ = rand.Read(cfg.key) // never fails (crypto/rand, Go 1.24+)
	}
	sc := statusConfig{runs: DefaultStatusRuns}
	for i, o := range cfg.status {
		if o == nil {
			return nil, invalidf("StatusOption %d of %d (WithStatusOptions) is nil", i+1, len(cfg.status))
		}
		o(&sc)
	}
	if sc.runs < 1 || sc.runs > s.locker.cfg.history {
		return nil, invalidf("run count %d (WithRuns) must be between 1 and the history length %d", sc.runs, s.locker.cfg.history)
	}
	return &handler{s: s, cfg: cfg, runs: sc.runs, cop: http.NewCrossOriginProtection(), page: pageTemplate}, nil
}

// ServeHTTP routes a request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "same-origin")
	switch path := r.URL.Path; path {
	case "":
		h.toSlash(w, r)
	case "/", "/api/status":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			plain(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is read with GET, not %s", path, r.Method))
			return
		}
		if path == "/" {
			h.servePage(w, r)
		} else {
			h.serveJSON(w, r)
		}
	case "/pause", "/resume", "/run":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			plain(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s changes the fleet: it takes a POST from the status page's form, not %s", path, r.Method))
			return
		}
		h.control(w, r, path[1:])
	default:
		plain(w, http.StatusNotFound, fmt.Sprintf("no such page %q: the status page is at the handler's root (GET /), its JSON at /api/status", path))
	}
}

// toSlash redirects a request for the mount point without its trailing
// slash (http.StripPrefix leaves "") to it with one, so that the page's
// relative links work.
func (h *handler) toSlash(w http.ResponseWriter, r *http.Request) {
	p := r.URL.EscapedPath()
	if r.RequestURI != "" {
		if u, err := url.ParseRequestURI(r.RequestURI); err == nil {
			p = u.EscapedPath()
		}
	}
	last := p[strings.LastIndex(p, "/")+1:]
	target := "./"
	if last != "" {
		target = last + "/"
	}
	w.Header().Set("Location", target)
	w.WriteHeader(http.StatusMovedPermanently)
}

// query reads the page's parameters: runs and job.
func (h *handler) query(r *http.Request) (runs int, job string, err error) {
	q := r.URL.Query()
	runs = h.runs
	if v := q.Get("runs"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > h.s.locker.cfg.history {
			return 0, "", fmt.Errorf("runs=%.40q: want a number of runs per job from 1 to %d (the history length)", v, h.s.locker.cfg.history)
		}
		runs = n
	}
	job = q.Get("job")
	if len(job) > maxJobName || strings.ContainsRune(job, 0) {
		return 0, "", fmt.Errorf("job=%.40q...: a job name has at most %d bytes and no NUL byte", job, maxJobName)
	}
	return runs, job, nil
}

// status reads the fleet's state for a request.
func (h *handler) status(ctx context.Context, runs int, job string) (*Status, error) {
	opts := append(append([]StatusOption(nil), h.cfg.status...), WithRuns(runs))
	if job != "" {
		opts = append(opts, WithJob(job))
	}
	return h.s.Status(ctx, opts...)
}

// statusCode is the HTTP status of a Status or control error.
func statusCode(err error) int {
	switch {
	case errors.Is(err, ErrUnknownJob):
		return http.StatusNotFound
	case errors.Is(err, ErrRequestPending):
		return http.StatusConflict
	case errors.Is(err, redlock.ErrInvalidArgument):
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

// serveJSON serves GET /api/status.
func (h *handler) serveJSON(w http.ResponseWriter, r *http.Request) {
	runs, job, err := h.query(r)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err)
		return
	}
	st, err := h.status(r.Context(), runs, job)
	if st == nil {
		jsonError(w, statusCode(err), err)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	if err != nil {
		w.Header().Set("Warning", `199 - "read from fewer than a quorum of nodes"`)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st)
}

// jsonError writes err as {"error": "..."} with code.
func jsonError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}

// plain writes a plain-text answer.
func plain(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, text)
}

// csrfToken returns the CSRF token of a browser's cookie value.
func (h *handler) csrfToken(cookie string) string {
	m := hmac.New(sha256.New, h.cfg.key)
	m.Write([]byte("schedlock status page\x00" + cookie))
	return hex.EncodeToString(m.Sum(nil))
}

// cookie returns the request's CSRF cookie, setting a new one on w when
// it has none.
func (h *handler) cookie(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		return c.Value
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return v
}

// control serves POST /pause, /resume and /run.
func (h *handler) control(w http.ResponseWriter, r *http.Request, action string) {
	job, code, why := h.controlForm(w, r)
	if why != "" {
		plain(w, code, why)
		return
	}
	var err error
	var done string
	switch action {
	case "pause":
		err, done = h.s.Pause(r.Context(), job), "paused"
	case "resume":
		err, done = h.s.Resume(r.Context(), job), "resumed"
	case "run":
		err, done = h.s.RequestRun(r.Context(), job), "requested"
	}
	if err != nil {
		plain(w, statusCode(err), "refused: "+err.Error())
		return
	}
	q := url.Values{"done": {done}, "target": {job}}
	w.Header().Set("Location", "./?"+q.Encode())
	w.WriteHeader(http.StatusSeeOther)
}

// controlForm checks a control request (controls on, same origin, a form
// within maxForm bytes with this browser's CSRF token) and returns the job
// it names, or the status code and text of its refusal.
func (h *handler) controlForm(w http.ResponseWriter, r *http.Request) (job string, code int, why string) {
	if !h.cfg.controls {
		return "", http.StatusForbidden, "fleet controls are disabled on this page; the application enables them with scheduler.WithControls(true)"
	}
	if err := h.cop.Check(r); err != nil {
		return "", http.StatusForbidden, "refused: a cross-origin request; use the form of the status page itself (" + err.Error() + ")"
	}
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/x-www-form-urlencoded" {
		return "", http.StatusUnsupportedMediaType, fmt.Sprintf("refused: Content-Type %.60q; the status page's form sends application/x-www-form-urlencoded", r.Header.Get("Content-Type"))
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return "", http.StatusRequestEntityTooLarge, fmt.Sprintf("refused: the form is over %d bytes", maxForm)
		}
		return "", http.StatusBadRequest, "refused: malformed form: " + err.Error()
	}
	c, err := r.Cookie(csrfCookie)
	token := r.PostForm.Get("csrf")
	if err != nil || token == "" || !hmac.Equal([]byte(token), []byte(h.csrfToken(c.Value))) {
		return "", http.StatusForbidden, "refused: the form's CSRF token is missing or does not match this browser's cookie; reload the status page and try again"
	}
	job = r.PostForm.Get("job")
	switch {
	case len(r.PostForm["job"]) != 1 || job == "":
		return "", http.StatusBadRequest, "refused: the form names no job (one job=NAME field)"
	case len(job) > maxJobName || strings.ContainsRune(job, 0):
		return "", http.StatusBadRequest, fmt.Sprintf("refused: job %.40q...: a job name has at most %d bytes and no NUL byte", job, maxJobName)
	}
	return job, 0, ""
}

// servePage serves GET /.
func (h *handler) servePage(w http.ResponseWriter, r *http.Request) {
	runs, job, err := h.query(r)
	if err != nil {
		plain(w, http.StatusBadRequest, err.Error())
		return
	}
	st, err := h.status(r.Context(), runs, job)
	if st == nil {
		plain(w, statusCode(err), "the fleet's status could not be read: "+err.Error())
		return
	}
	v := h.view(st, err, runs, job, r.URL.Query())
	if h.cfg.controls {
		v.CSRF = h.csrfToken(h.cookie(w, r))
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	if err := h.page.Execute(w, v); err != nil {
		h.s.locker.log.Warn("scheduler: rendering the status page failed", "err", err)
	}
}
