package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/elector"
	exnodes "github.com/schedlock/schedlock/example/internal/nodes"
	"github.com/schedlock/schedlock/redlock"
)

// runDemo runs the candidates and the kills until cfg.duration has passed or
// ctx is done, stops everything in order (candidates, clients, nodes) and
// prints the summary. It returns the summary's verdict.
func runDemo(ctx context.Context, cfg config, stdout io.Writer) error {
	nodes, err := exnodes.Start(cfg.redis)
	if err != nil {
		return err
	}
	defer nodes.Close() // last: after every candidate and client has stopped
	if err := nodes.Ping(ctx); err != nil {
		return err
	}
	printHeader(stdout, cfg, nodes)

	j := newJournal(stdout)
	f := &fleet{cfg: cfg, addrs: nodes.Addrs, j: j}
	start := time.Now()
	err = f.run(ctx)
	if cerr := f.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		fmt.Fprintf(stdout, "\nInterrupted after %v.\n", elapsed.Round(10*time.Millisecond))
	}
	return j.summarize(stdout, cfg, elapsed)
}

// printHeader tells what is about to happen.
func printHeader(w io.Writer, cfg config, nodes *exnodes.Set) {
	kind := "Redis nodes given by -redis"
	if nodes.Embedded() {
		kind = "embedded miniredis nodes"
	}
	instances := fmt.Sprintf("%d candidate instances share", cfg.instances)
	if cfg.instances == 1 {
		instances = "1 candidate instance uses"
	}
	fmt.Fprintf(w, "%s %d %s: %s.\n", instances, len(nodes.Addrs), kind, strings.Join(nodes.Addrs, ", "))
	fmt.Fprintf(w, "They elect one leader; only the leader processes items (one every %v).\n", workEvery)
	fmt.Fprintf(w, "Lease TTL %v, retry period %v: a crashed leader blocks the election for up to %v;\n"+
		"a leader that stops gracefully resigns, and another takes over within about %v.\n",
		cfg.ttl, cfg.retry(), cfg.ttl, cfg.retry())
	if cfg.killEvery > 0 {
		fmt.Fprintf(w, "Every %v the leader is killed, by a crash and a graceful stop in turn, and a new instance replaces it.\n", cfg.killEvery)
	}
	fmt.Fprintf(w, "Running for %v.\n\n", cfg.duration)
}

// killKind is how an instance was killed.
type killKind int32

const (
	notKilled killKind = iota
	crash              // clients closed, then Run cancelled: no resign
	graceful           // Run cancelled: it resigns
)

func (k killKind) String() string {
	switch k {
	case crash:
		return "crash"
	case graceful:
		return "graceful stop"
	}
	return "none"
}

// fleet owns the candidate instances. Its methods are called from run's
// goroutine only; the candidates' callbacks use the journal, not the fleet.
type fleet struct {
	cfg   config
	addrs []string
	j     *journal

	wg       sync.WaitGroup // every candidate's Run goroutine
	members  []*candidate   // every candidate ever started, in order
	stopping atomic.Bool    // set when the final shutdown begins
}

// run starts cfg.instances candidates, kills the leader every
// cfg.killEvery, and returns at the end of the run (after cfg.duration or
// when ctx is done) once every candidate has stopped. Candidates run on a
// context of their own, so that even when ctx is cancelled the shutdown
// stays ordered: the followers first, then the leader.
func (f *fleet) run(ctx context.Context) error {
	base := context.WithoutCancel(ctx)
	for range f.cfg.instances {
		if _, err := f.startCandidate(base); err != nil {
			f.stopAll()
			return err
		}
	}

	end := time.NewTimer(f.cfg.duration)
	defer end.Stop()
	var kills <-chan time.Time
	if f.cfg.killEvery > 0 {
		t := time.NewTicker(f.cfg.killEvery)
		defer t.Stop()
		kills = t.C
	}
	next := crash
	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end.C:
			break loop
		case <-kills:
			killed, kerr := f.replaceLeader(base, next)
			if kerr != nil {
				err = kerr
				break loop
			}
			if killed && next == crash {
				next = graceful
			} else if killed {
				next = crash
			}
		}
	}
	if err == nil && ctx.Err() == nil {
		f.awaitTakeover(ctx)
	}
	f.stopAll()
	return err
}

// awaitTakeover waits, when the time is up right after a kill, until a new
// leader has started and processed an item, so that the summary has the
// takeover time, but not much longer than a takeover after a crash should
// take.
func (f *fleet) awaitTakeover(ctx context.Context) {
	took := f.j.pendingTakeover()
	if took == nil {
		return
	}
	limit := f.cfg.ttl + 2*f.cfg.retry() + time.Second
	f.j.printf("time is up; waiting for a new leader after the last kill (at most %v)\n", limit)
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-took:
	case <-t.C:
		return
	case <-ctx.Done():
		return
	}
	// Let the new leader process an item, to show that the work goes on.
	t.Reset(workEvery + 100*time.Millisecond)
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// startCandidate creates the next candidate (worker-<n>) and starts its Run.
func (f *fleet) startCandidate(base context.Context) (*candidate, error) {
	name := fmt.Sprintf("worker-%d", len(f.members)+1)
	c, err := newCandidate(name, f.addrs, f.cfg, f.j, &f.stopping)
	if err != nil {
		return nil, err
	}
	f.members = append(f.members, c)
	c.start(base, &f.wg)
	return c, nil
}

// replaceLeader starts a replacement instance, waits until its first
// campaign has found the leader, then kills the leader by kind and waits
// until its Run has returned. The replacement starts first so that the
// takeover is done by a follower on its usual retry schedule, not by a
// fresh instance that happens to campaign right after the kill. It returns
// false, having done nothing, when no instance leads right now.
func (f *fleet) replaceLeader(base context.Context, kind killKind) (bool, error) {
	if f.j.current() == nil {
		f.j.printf("no instance leads right now (a takeover is under way): no kill this time\n")
		return false, nil
	}
	repl, err := f.startCandidate(base)
	if err != nil {
		return false, err
	}
	f.j.printf("%s starts, to replace the leader, which is about to be killed\n", repl.name)
	t := time.NewTimer(time.Second)
	select {
	case <-repl.seen:
	case <-t.C:
	}
	t.Stop()

	l := f.j.current()
	var victim *candidate
	for _, c := range f.members {
		if l != nil && c.name == l.who && !c.stopped {
			victim = c
		}
	}
	if victim == nil {
		f.j.printf("no instance leads right now (a takeover is under way): no kill this time\n")
		return false, nil
	}
	victim.kill.Store(int32(kind))
	f.j.killed(kind, l, f.cfg)
	if kind == crash {
		// Like a process that dies: nothing it sends reaches Redis any
		// more, so it can neither renew nor delete its lease.
		if err := victim.closeClients(); err != nil {
			return true, err
		}
	}
	victim.stop()
	return true, victim.closeClients()
}

// stopAll stops every running candidate: the followers first, so that none
// of them takes over when the leader resigns, then the rest. It returns
// after every Run has returned.
func (f *fleet) stopAll() {
	f.stopping.Store(true)
	leader := ""
	if l := f.j.current(); l != nil {
		leader = l.who
		f.j.printf("stopping all instances: the followers first, then the leader, %s, which resigns\n", leader)
	} else {
		f.j.printf("stopping all instances\n")
	}
	for _, c := range f.members {
		if c.name != leader {
			c.cancel()
		}
	}
	for _, c := range f.members {
		if c.name != leader {
			<-c.done
		}
	}
	for _, c := range f.members {
		c.cancel()
	}
	f.wg.Wait()
}

// close closes the clients of every candidate; call it after stopAll. It
// returns the errors of the candidates' Runs and of closing.
func (f *fleet) close() error {
	var errs []error
	for _, c := range f.members {
		errs = append(errs, c.err, c.closeClients())
	}
	return errors.Join(errs...)
}

// candidate is one instance of the singleton worker: what one replica of a
// service would have.
type candidate struct {
	name     string
	rdbs     []*redis.Client
	locks    *redlock.Client
	el       *elector.Elector
	kill     atomic.Int32 // killKind; set before it is killed
	stopping *atomic.Bool // the fleet's: the final shutdown has begun

	cur      *leadership   // the current leadership; OnStartedLeading sets it, OnStoppedLeading reads it after it returned
	seen     chan struct{} // closed at the first call of OnNewLeader
	seenOnce sync.Once

	// Set by start; stop and the fleet use them from run's goroutine.
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run has returned
	err     error         // Run's error; read after done is closed
	stopped bool          // stop was called
	closed  bool          // closeClients was called
}

// newCandidate connects to addrs with new clients and creates the
// candidate's elector. It performs no I/O and starts nothing.
func newCandidate(name string, addrs []string, cfg config, j *journal, stopping *atomic.Bool) (*candidate, error) {
	c := &candidate{name: name, stopping: stopping, seen: make(chan struct{})}
	nodes := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		// ContextTimeoutEnabled lets a request that redlock gave up on
		// return at once instead of at the client's read timeout.
		rdb := redis.NewClient(&redis.Options{Addr: a, ContextTimeoutEnabled: true})
		c.rdbs = append(c.rdbs, rdb)
		nodes[i] = rdb
	}
	locks, err := redlock.New(nodes)
	c.locks = locks
	if err == nil {
		c.el, err = elector.New(locks, electionName,
			elector.WithIdentity(name),
			elector.WithLeaseTTL(cfg.ttl),
			elector.WithRetryPeriod(cfg.retry()),
			elector.OnStartedLeading(func(ctx context.Context) { c.lead(ctx, j) }),
			elector.OnStoppedLeading(func() { j.printf("%s stopped leading (%s)\n", name, c.cur.reason) }),
			elector.OnNewLeader(func(id string) {
				if id != name { // the leader itself says so in OnStartedLeading
					j.printf("%s sees %s as leader\n", name, id)
				}
				c.seenOnce.Do(func() { close(c.seen) })
			}),
		)
	}
	if err != nil {
		_ = c.closeClients()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}

// lead is the singleton work, run by OnStartedLeading: it processes one item
// every workEvery until the leadership's ctx ends.
func (c *candidate) lead(ctx context.Context, j *journal) {
	term, _ := elector.TermFromContext(ctx)
	l := j.started(c.name, term)
	c.cur = l
	t := time.NewTicker(workEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			j.ended(l, c.endReason(ctx))
			return
		case <-t.C:
			if ctx.Err() == nil {
				j.processed(l)
			}
		}
	}
}

// endReason tells why the leadership whose context is ctx ended.
func (c *candidate) endReason(ctx context.Context) string {
	switch kind := killKind(c.kill.Load()); {
	case kind != notKilled:
		return kind.String()
	case c.stopping.Load():
		return "end of run"
	case errors.Is(context.Cause(ctx), redlock.ErrLockLost):
		return "lost its lease"
	default:
		return fmt.Sprintf("ended: %v", context.Cause(ctx))
	}
}

// start runs the candidate's Run in a goroutine of wg until stop or the end
// of base.
func (c *candidate) start(base context.Context, wg *sync.WaitGroup) {
	ctx, cancel := context.WithCancel(base)
	c.cancel, c.done = cancel, make(chan struct{})
	wg.Go(func() {
		defer close(c.done)
		c.err = c.el.Run(ctx)
		if c.err != nil {
			c.err = fmt.Errorf("%s: %w", c.name, c.err)
		}
	})
}

// stop cancels the candidate's Run and waits for it to return: a leader
// resigns, unless its clients are closed. Run's error is kept in c.err.
func (c *candidate) stop() {
	c.stopped = true
	c.cancel()
	<-c.done
}

// closeClients closes the candidate's go-redis clients, once.
func (c *candidate) closeClients() error {
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	if c.locks != nil { // the redlock Client first: its queued releases go out
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, c.locks.Close(ctx))
		cancel()
	}
	for _, rdb := range c.rdbs {
		errs = append(errs, rdb.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: close clients: %w", c.name, err)
	}
	return nil
}
