package elector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/schedlock/schedlock/redlock"
	"github.com/schedlock/schedlock/tracing"
)

var _ gocron.Elector = (*Elector)(nil)

// Sentinel errors; match them with errors.Is.
var (
	// ErrNotLeader is returned by IsLeader and Term when this candidate does
	// not hold a valid lease.
	ErrNotLeader = errors.New("elector: not the leader")
	// ErrNoLeader is returned by Leader when no candidate holds the lease
	// on a quorum of nodes.
	ErrNoLeader = errors.New("elector: no leader")
	// ErrRunning is returned by Run when Run is already running for this
	// Elector.
	ErrRunning = errors.New("elector: Run already running")
)

// Defaults of the options.
const (
	// DefaultLeaseTTL is the lease's TTL: how long a crashed leader blocks
	// the election.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultRetryPeriod is how often a candidate that is not leader tries
	// to take the lease.
	DefaultRetryPeriod = time.Second
	// DefaultKeyPrefix starts the Redis key of every election (after the
	// redlock Client's own prefix).
	DefaultKeyPrefix = "schedlock:elector:"
)

// Option configures New.
type Option func(*config)

type config struct {
	identity         string
	identitySet      bool // WithIdentity given: no default identity drawn
	ttl              time.Duration
	renew            time.Duration
	renewSet         bool
	retrySet         bool
	retry            time.Duration
	prefix           string
	logger           *slog.Logger
	onStartedLeading func(ctx context.Context)
	onStoppedLeading func()
	onNewLeader      func(identity string)
	tracer           trace.TracerProvider
	meter            metric.MeterProvider
}

// WithTracerProvider sets the OpenTelemetry tracer provider: a span per
// campaign ("elector.campaign"), and per leadership term short spans at its
// start ("elector.term started"; OnStartedLeading's ctx carries it), for
// each renewal and at its end ("elector.term ended"): see
// docs/observability.md. Default: the global provider; nil means the
// default.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tracer = tp } }

// WithMeterProvider sets the OpenTelemetry meter provider for the
// schedlock.elector.leaderships counter and the schedlock.elector.leading
// up-down counter. Default: the global provider; nil means the default.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.meter = mp } }

// WithIdentity sets this candidate's identity, as reported by Leader and
// OnNewLeader to every candidate. Default tracing.DefaultIdentity(),
// "<service>/<host>-<pid>-<token>" (e.g. "billing/web-3-19350-1a2b", with a
// random token per process, so that a restarted process is another
// candidate). At most redlock.MaxMetadata bytes; New rejects "".
func WithIdentity(id string) Option {
	return func(c *config) { c.identity, c.identitySet = id, true }
}

// WithLeaseTTL sets the lease TTL: a leader that crashes blocks the election
// for at most this long; a leader that cannot renew steps down before it
// ends. Default DefaultLeaseTTL (10 s); New rejects values below 30 ms.
func WithLeaseTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// WithRenewInterval sets the time between lease renewals while leading.
// Default: TTL/3. New rejects values <= 0 or above TTL/2 (the lease must
// survive at least one failed renewal).
func WithRenewInterval(d time.Duration) Option {
	return func(c *config) { c.renew, c.renewSet = d, true }
}

// WithRetryPeriod sets how often a candidate that is not leader tries to
// take the lease (with up to 10% random jitter); after a leader resigns,
// another candidate leads within about this long. Default: DefaultRetryPeriod
// (1 s) or TTL/4, whichever is shorter; New rejects values <= 0 or not below
// the TTL.
func WithRetryPeriod(d time.Duration) Option {
	return func(c *config) { c.retry, c.retrySet = d, true }
}

// WithKeyPrefix sets the prefix of the election's key. Default
// DefaultKeyPrefix; "" is allowed.
func WithKeyPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithLogger sets the logger for leadership changes (Info), failed
// campaigns and lost leaderships (Warn). Default, and for nil:
// slog.Default() at the time of New; pass slog.New(slog.DiscardHandler) to
// drop everything.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// OnStartedLeading sets a function run in its own goroutine each time this
// candidate becomes leader, unless the lease's validity has already ended
// when that goroutine starts (a process pause). Its ctx is cancelled when
// leadership is lost (before the lease's validity ends; after a process
// pause past it, as soon as the process runs again, and at the latest when
// IsLeader says no) or Run's ctx ends; it carries the lease
// (redlock.FromContext) and the term (TermFromContext). Run waits for it to
// return before it calls OnStoppedLeading or campaigns again.
func OnStartedLeading(f func(ctx context.Context)) Option {
	return func(c *config) { c.onStartedLeading = f }
}

// OnStoppedLeading sets a function called exactly once after each
// leadership ends (loss, expiry or Run's end), after OnStartedLeading has
// returned, on Run's goroutine. It pairs with OnStartedLeading: a
// leadership whose OnStartedLeading was not run (the lease's validity had
// ended when its goroutine started) does not call it either.
func OnStoppedLeading(f func()) Option {
	return func(c *config) { c.onStoppedLeading = f }
}

// OnNewLeader sets a function called on Run's goroutine when the observed
// leader changes: when this candidate becomes leader (with its own
// identity), or when a campaign finds the lease held by another identity on
// a quorum of nodes (which, as with Leader, may be a candidate whose late
// grants are not undone yet). It must not block for long.
func OnNewLeader(f func(identity string)) Option { return func(c *config) { c.onNewLeader = f } }

// Elector campaigns for the leadership of one named election among all
// candidates that use the same name and Redis nodes. Safe for concurrent
// use; New starts nothing, Run does the work.
type Elector struct {
	client  *redlock.Client
	name    string
	res     string
	cfg     config
	log     *slog.Logger
	running atomic.Bool

	tracer      trace.Tracer
	leaderships metric.Int64Counter
	leading     metric.Int64UpDownCounter

	mu         sync.Mutex
	lease      *redlock.Lock           // nil unless leading
	leadCtx    context.Context         // cancelled when leadership ends
	leadCancel context.CancelCauseFunc // cancels leadCtx
	observed   string                  // last leader identity reported to OnNewLeader
}

// New returns an Elector for the election name. It performs no I/O. Errors
// match redlock.ErrInvalidArgument and name the bad values: a nil client,
// an empty name, an empty or oversized identity, a TTL below 30 ms or one
// that the Client rejects (redlock.Client.CheckTTL: e.g. above its restart
// gate), a renew interval not in (0, TTL/2], a retry period not in (0, TTL).
func New(client *redlock.Client, name string, opts ...Option) (*Elector, error) {
	cfg := config{ttl: DefaultLeaseTTL, retry: DefaultRetryPeriod, prefix: DefaultKeyPrefix}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("option %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	if err := cfg.validate(client, name); err != nil {
		return nil, err
	}
	if !cfg.identitySet {
		cfg.identity = tracing.DefaultIdentity()
	}
	log := cfg.logger
	if log == nil {
		log = slog.Default()
	}
	e := &Elector{client: client, name: name, res: cfg.prefix + name, cfg: cfg, log: log}
	tp, mp := cfg.tracer, cfg.meter
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	e.tracer = tp.Tracer(tracing.ScopeElector, trace.WithInstrumentationVersion(tracing.Version))
	m := mp.Meter(tracing.ScopeElector, metric.WithInstrumentationVersion(tracing.Version))
	var err1, err2 error
	e.leaderships, err1 = m.Int64Counter(tracing.MetricLeaderships, metric.WithUnit("{leadership}"),
		metric.WithDescription("Leaderships gained by this candidate."))
	e.leading, err2 = m.Int64UpDownCounter(tracing.MetricLeading, metric.WithUnit("{leader}"),
		metric.WithDescription("1 while this candidate leads."))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("elector: creating the OpenTelemetry instruments: %w", err)
	}
	return e, nil
}

// validate fills in the defaults that follow the TTL and checks cfg,
// naming the bad value.
func (cfg *config) validate(client *redlock.Client, name string) error {
	if !cfg.renewSet {
		cfg.renew = cfg.ttl / 3
	}
	if !cfg.retrySet {
		cfg.retry = min(DefaultRetryPeriod, cfg.ttl/4)
	}
	switch {
	case client == nil:
		return invalidf("the *redlock.Client is nil")
	case name == "":
		return invalidf("the election name is empty")
	case cfg.identitySet && cfg.identity == "":
		return invalidf("identity (WithIdentity) is empty")
	case len(cfg.identity) > redlock.MaxMetadata:
		return invalidf("identity (WithIdentity) is %d bytes, more than the maximum %d", len(cfg.identity), redlock.MaxMetadata)
	case cfg.ttl < 30*time.Millisecond:
		return invalidf("lease TTL %v (WithLeaseTTL) is below the minimum 30ms", cfg.ttl)
	case cfg.renew <= 0 || cfg.renew > cfg.ttl/2:
		return invalidf("renew interval %v (WithRenewInterval) must be above 0 and at most half the lease TTL (%v), so that the lease survives a failed renewal",
			cfg.renew, cfg.ttl/2)
	case cfg.retry <= 0 || cfg.retry >= cfg.ttl:
		return invalidf("retry period %v (WithRetryPeriod) must be above 0 and below the lease TTL %v", cfg.retry, cfg.ttl)
	}
	if err := client.CheckTTL(cfg.ttl); err != nil {
		return &textError{msg: fmt.Sprintf("elector: lease TTL %v (WithLeaseTTL): %s", cfg.ttl, redlock.ErrorText(err)), errs: []error{err}}
	}
	return nil
}

// invalidf returns an error that reads "elector: invalid argument:
// <message>" and matches redlock.ErrInvalidArgument.
func invalidf(format string, args ...any) error {
	return &textError{msg: "elector: invalid argument: " + fmt.Sprintf(format, args...), errs: []error{redlock.ErrInvalidArgument}}
}

// textError is an error with a text of its own that matches errs
// (errors.Is, errors.As): one package prefix, however many errors of other
// packages it wraps.
type textError struct {
	msg  string
	errs []error
}

func (e *textError) Error() string   { return e.msg }
func (e *textError) Unwrap() []error { return e.errs }

// Identity returns this candidate's identity.
func (e *Elector) Identity() string { return e.cfg.identity }

// IsLeader implements gocron.Elector (gocron.WithDistributedElector): nil
// while this candidate leads and the lease's local validity deadline has
// not passed, ErrNotLeader otherwise. It is O(1) and local: no network call.
// ctx is not used. When it finds the deadline passed (the process was
// paused past it, so the renewal goroutine has not run yet), it cancels
// the leadership's context first, with a cause matching
// redlock.ErrLockLost: once IsLeader says no, that context says so too.
// Call it right before every write that leadership guards, and send the
// term (Term) with the write for the store to reject older terms: a pause
// after the check is caught only by the store (docs/election.md).
func (e *Elector) IsLeader(context.Context) error {
	e.mu.Lock()
	lease, lctx, cancel := e.lease, e.leadCtx, e.leadCancel
	e.mu.Unlock()
	switch {
	case lease == nil || lctx.Err() != nil:
		return ErrNotLeader
	case !time.Now().Before(lease.Until()):
		cancel(&textError{msg: fmt.Sprintf("elector: leadership of %q lost: the lease's validity ended %v ago, before a renewal (was the process paused?)",
			e.name, time.Since(lease.Until()).Round(time.Millisecond)), errs: []error{redlock.ErrLockLost}})
		return ErrNotLeader
	}
	return nil
}

// Term returns the current term while this candidate leads: a fencing token
// of the lease, strictly greater than every earlier leader's term of this
// election (see redlock.WithFencing). ErrNotLeader otherwise.
func (e *Elector) Term() (uint64, error) {
	e.mu.Lock()
	lease := e.lease
	e.mu.Unlock()
	if err := e.IsLeader(context.Background()); err != nil {
		return 0, err
	}
	return lease.FencingToken(), nil
}

type termKey struct{}

// TermFromContext returns the term of the leadership whose OnStartedLeading
// ctx is ctx (or an ancestor of it): the same as Term, a redlock fencing
// token. Terms are large and not consecutive (a token is at least the
// Redis nodes' clock in microseconds, docs/fencing.md): compare them, do
// not count them.
func TermFromContext(ctx context.Context) (term uint64, ok bool) {
	term, ok = ctx.Value(termKey{}).(uint64)
	return term, ok
}

// Leader returns the identity of the current leader as seen by a quorum of
// nodes, with one round of reads. It reports what the nodes hold: a
// candidate whose grants reached a quorum only after its own campaign gave
// up (links slower than the node timeout) holds the lease there, without
// leading, until its undo arrives, and is reported meanwhile. Errors:
// ErrNoLeader when no candidate holds the lease on a quorum; an error
// matching redlock.ErrUnavailable when the nodes that failed leave that
// unknown (redlock.Client.HolderMetadata).
func (e *Elector) Leader(ctx context.Context) (identity string, err error) {
	id, held, err := e.client.HolderMetadata(ctx, e.res)
	switch {
	case err != nil:
		return "", &textError{msg: fmt.Sprintf("elector: leader of %q: %s", e.name, redlock.ErrorText(err)), errs: []error{err}}
	case !held:
		return "", ErrNoLeader
	}
	return id, nil
}

// Run campaigns until ctx ends: it tries to take the lease every retry
// period (asking a quorum of the nodes first, redlock.WithQuorumFirst: a
// follower's campaign against a leader costs a quorum of commands); as
// leader it renews the lease every renew interval and steps down
// when renewal cannot reach a quorum before the lease's local deadline,
// then campaigns again. When ctx ends it resigns (releases the lease, so
// that another candidate leads within its retry period rather than after the
// TTL), waits for its callbacks, and returns nil. It returns ErrRunning if
// Run is already running for e, and an error matching redlock.ErrClosed
// when a campaign finds the redlock.Client closed (no campaign can succeed
// then). Nothing Run starts outlives it.
func (e *Elector) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer e.running.Store(false)
	var misconfigLogged time.Time
	for {
		if ctx.Err() != nil {
			return nil
		}
		cctx, span := e.tracer.Start(ctx, tracing.SpanCampaign, trace.WithAttributes(
			tracing.Election.String(e.name), tracing.Identity.String(e.cfg.identity)))
		lease, err := e.client.TryAcquire(cctx, []string{e.res}, e.cfg.ttl,
			redlock.WithMetadata(e.cfg.identity), redlock.WithFencing(true), redlock.WithQuorumFirst())
		if err == nil {
			span.SetAttributes(tracing.Outcome.String(tracing.OutcomeGranted), tracing.Term.Int64(int64(lease.FencingToken())))
			span.End()
			e.lead(ctx, lease, span.SpanContext())
			continue
		}
		e.endCampaign(span, err)
		if errors.Is(err, redlock.ErrClosed) {
			return &textError{msg: fmt.Sprintf("elector: campaign for %q stopped: the redlock client is closed", e.name), errs: []error{err}}
		}
		if ctx.Err() == nil {
			misconfigLogged = e.logCampaign(err, misconfigLogged)
		}
		wait := e.cfg.retry + rand.N(e.cfg.retry/10+1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// endCampaign ends the span of a campaign that failed with err: its
// outcome, the holder that a quorum named (which e observes), and for
// unavailable or misconfigured nodes the error type and status.
func (e *Elector) endCampaign(span trace.Span, err error) {
	defer span.End()
	var qerr *redlock.QuorumError
	if errors.As(err, &qerr) {
		if holder, ok := qerr.HolderMetadata(); ok {
			span.SetAttributes(tracing.Holder.String(holder))
			e.observe(holder)
		}
	}
	span.SetAttributes(tracing.Outcome.String(campaignOutcome(err)))
	switch {
	case errors.Is(err, redlock.ErrUnavailable):
		span.SetAttributes(semconv.ErrorTypeKey.String(tracing.ErrorTypeUnavailable))
		span.SetStatus(codes.Error, err.Error())
	case errors.Is(err, redlock.ErrMisconfigured):
		span.SetAttributes(semconv.ErrorTypeKey.String(tracing.ErrorTypeMisconfigured))
		span.SetStatus(codes.Error, err.Error())
	}
}

// logCampaign logs a campaign that failed with err for another reason
// than a holder: misconfigured nodes at most once a minute (they stay so
// until an operator acts), other failures each time. It returns when
// misconfigured nodes were last logged, given misconfigLogged before.
func (e *Elector) logCampaign(err error, misconfigLogged time.Time) time.Time {
	switch {
	case errors.Is(err, redlock.ErrMisconfigured):
		if time.Since(misconfigLogged) >= time.Minute {
			e.log.Warn("elector: campaign failed (logged at most once a minute while the nodes are misconfigured)", "election", e.name, "err", err)
			return time.Now()
		}
	case !errors.Is(err, redlock.ErrNotAcquired):
		e.log.Warn("elector: campaign failed", "election", e.name, "err", err)
	}
	return misconfigLogged
}

// campaignOutcome names the outcome of a failed campaign.
func campaignOutcome(err error) string {
	switch {
	case errors.Is(err, redlock.ErrUnavailable):
		return tracing.OutcomeUnavailable
	case errors.Is(err, redlock.ErrMisconfigured):
		return tracing.OutcomeMisconfigured
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return tracing.OutcomeCanceled
	}
	return tracing.OutcomeContended
}

// lead runs one leadership: it keeps the lease until it is lost or ctx
// ends, runs the callbacks, and releases the lease. campaign is the span of
// the campaign that won it, linked from the leadership's span.
//
// A term is traced as short spans, each exported as soon as it ends: a
// tracing.SpanTermStarted span when it starts (linked to the campaign),
// one trace per renewal of the lease (redlock.Extend, linked to the start:
// see redlock.Lock.Keep), and a tracing.SpanTermEnded span when it ends
// (linked to the start; outcome resigned, lost, or unavailable when the
// nodes did not confirm the resignation). None lasts the term, so a
// running leader is seen in a trace backend within its export delay, and
// none of these spans or traces grows with the term's length; spans that
// OnStartedLeading's work starts under its ctx join the start's trace.
func (e *Elector) lead(ctx context.Context, lease *redlock.Lock, campaign trace.SpanContext) {
	term := lease.FencingToken()
	started := time.Now()
	termAttrs := trace.WithAttributes(tracing.Election.String(e.name), tracing.Identity.String(e.cfg.identity),
		tracing.Term.Int64(int64(term)))
	ctx, span := e.tracer.Start(ctx, tracing.SpanTermStarted, trace.WithNewRoot(),
		trace.WithLinks(trace.Link{SpanContext: campaign}), termAttrs)
	span.AddEvent(tracing.EventLeadershipGained)
	span.End()
	startSpan := span.SpanContext()
	election := metric.WithAttributes(tracing.Election.String(e.name))
	e.leaderships.Add(ctx, 1, election)
	e.leading.Add(ctx, 1, election)
	defer e.leading.Add(ctx, -1, election)
	kctx, stop := lease.Keep(context.WithValue(ctx, termKey{}, term), redlock.ExtendEvery(e.cfg.renew))
	// lctx ends with the lease (Keep) or when IsLeader finds its deadline
	// passed, whichever sees it first.
	lctx, cancel := context.WithCancelCause(kctx)
	defer cancel(nil)
	e.mu.Lock()
	e.lease, e.leadCtx, e.leadCancel = lease, lctx, cancel
	e.mu.Unlock()
	e.log.Info("elector: leading", "election", e.name, "identity", e.cfg.identity, "term", term)
	if e.IsLeader(ctx) == nil { // not paused past the lease already
		e.observe(e.cfg.identity)
	}

	done := make(chan struct{})
	ran := true // OnStartedLeading ran, or none is set: OnStoppedLeading pairs with it
	go func() {
		defer close(done)
		if e.cfg.onStartedLeading != nil {
			if ran = e.IsLeader(ctx) == nil; ran {
				e.cfg.onStartedLeading(lctx)
			}
		}
	}()
	e.writeTerm(lctx, term) // for status pages (Leaderships)
	<-lctx.Done()
	lost := stop()
	if lost == nil && kctx.Err() == nil { // IsLeader found the deadline passed
		lost = context.Cause(lctx)
	}
	e.mu.Lock()
	e.lease, e.leadCtx, e.leadCancel = nil, nil, nil
	e.mu.Unlock()
	<-done
	if e.cfg.onStoppedLeading != nil && ran {
		e.cfg.onStoppedLeading()
	}
	// Resign, or clean up what is left of a lost lease, in the span that
	// marks the term's end.
	ectx, end := e.tracer.Start(context.WithoutCancel(ctx), tracing.SpanTermEnded, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: startSpan}), termAttrs,
		trace.WithAttributes(tracing.TermMillis.Float64(float64(time.Since(started).Microseconds())/1000)))
	rerr := lease.Release(ectx)
	end.AddEvent(tracing.EventLeadershipLost)
	switch {
	case lost != nil || errors.Is(rerr, redlock.ErrLockLost):
		cause := lost
		if cause == nil {
			cause = rerr
		}
		end.SetAttributes(tracing.Outcome.String(tracing.OutcomeLost), semconv.ErrorTypeKey.String(tracing.ErrorTypeLockLost))
		end.SetStatus(codes.Error, cause.Error())
	case rerr != nil: // the nodes did not confirm the resignation
		end.SetAttributes(tracing.Outcome.String(tracing.OutcomeUnavailable), semconv.ErrorTypeKey.String(tracing.ErrorTypeUnavailable))
		end.SetStatus(codes.Error, rerr.Error())
	default:
		end.SetAttributes(tracing.Outcome.String(tracing.OutcomeResigned))
	}
	end.End()
	switch {
	case lost != nil:
		e.log.Warn("elector: leadership lost", "election", e.name, "term", term, "err", lost)
	case rerr != nil:
		e.log.Warn("elector: resign failed; the lease expires with its TTL", "election", e.name, "term", term, "err", rerr)
	default:
		e.log.Info("elector: resigned", "election", e.name, "term", term)
	}
}

// observe reports a leader identity to OnNewLeader when it changed.
func (e *Elector) observe(identity string) {
	e.mu.Lock()
	changed := identity != e.observed
	e.observed = identity
	e.mu.Unlock()
	if changed && e.cfg.onNewLeader != nil {
		e.cfg.onNewLeader(identity)
	}
}
