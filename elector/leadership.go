package elector

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/schedlock/schedlock/redlock"
)

// Terms: what a status page shows of an election besides its leader. A
// leader writes, as its term starts, a term record to the hash at the key
// prefix itself (WithKeyPrefix; no election has an empty name, so no
// lease key is that key): election name -> "<node time in Unix ms>|{
// identity, term}", on every node that answers, best effort. Leaderships
// reads the leases and the term records of many elections in one round
// of two scripts per node.

// termsKey is the hash of the term records.
func (cfg *config) termsKey() string { return cfg.prefix }

// termRecordTTL is how long the term records stay after the last term
// started.
const termRecordTTL = 30 * 24 * time.Hour

type termRecord struct {
	Identity string `json:"identity"`
	Term     uint64 `json:"term"`
}

var (
	termWriteScript = redlock.NewScript(`-- Term: write election ARGV[1]'s term record ARGV[2]
-- to the hash KEYS[1], kept ARGV[3] ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now) .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)
	termReadScript = redlock.NewScript(`-- Terms: the term records of the elections ARGV in the hash KEYS[1].
return redis.call('HMGET', KEYS[1], unpack(ARGV))`)
)

// writeTerm records the start of this candidate's term, bounded by the
// node timeout; a failure is logged (the record only informs status
// pages).
func (e *Elector) writeTerm(ctx context.Context, term uint64) {
	b, _ := json.Marshal(termRecord{Identity: e.cfg.identity, Term: term})
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.client.NodeTimeout())
	defer cancel()
	if _, err := e.client.Eval(wctx, termWriteScript, []string{e.cfg.termsKey()}, e.name, string(b), termRecordTTL.Milliseconds()); err != nil {
		e.log.Debug("elector: writing the term record failed", "election", e.name, "err", err)
	}
}

// Leadership is what the Redis nodes say of one election (Leaderships).
type Leadership struct {
	// Election is the election's name.
	Election string
	// Leader is the identity that holds the lease on a quorum of nodes,
	// "" when none does (Leader's ErrNoLeader).
	Leader string
	// Unknown reports that nodes that failed leave the leader unknown.
	Unknown bool
	// Term is the leader's term (its fencing token, Elector.Term) and
	// Since when it started, on the nodes' clock, as the leader recorded
	// them when its term started; zero when no record of the leader's
	// current term was found.
	Term  uint64
	Since time.Time
}

// Leaderships reads the leader, term and start of term of each election
// in names, in order, from the nodes of client: one round of two scripts
// per node whatever the number of elections (the leases through
// redlock.Client.Holders, which waits for every node up to the node
// timeout, and the term records). opts are those given to New; only
// WithKeyPrefix matters. Errors: an error matching
// redlock.ErrInvalidArgument for a nil client, no names, an empty or
// duplicate name; one matching redlock.ErrUnavailable when fewer than a
// quorum of nodes answered, with what the answering nodes say. Safe for
// concurrent use.
func Leaderships(ctx context.Context, client *redlock.Client, names []string, opts ...Option) ([]Leadership, error) {
	cfg := config{prefix: DefaultKeyPrefix}
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("option %d of %d is nil", i+1, len(opts))
		}
		o(&cfg)
	}
	if client == nil {
		return nil, invalidf("the *redlock.Client is nil")
	}
	if len(names) == 0 {
		return nil, invalidf("no election names")
	}
	leases := make([]string, len(names))
	args := make([]any, len(names))
	for i, n := range names {
		if n == "" {
			return nil, invalidf("election name %d of %d is empty", i+1, len(names))
		}
		leases[i], args[i] = cfg.prefix+n, n
	}
	var holders []redlock.Holding
	var herr error
	var wg sync.WaitGroup
	wg.Go(func() { holders, herr = client.Holders(ctx, leases) })
	rctx, cancel := context.WithTimeout(ctx, client.NodeTimeout())
	replies, rerr := client.Eval(rctx, termReadScript, []string{cfg.termsKey()}, args...)
	cancel()
	wg.Wait()
	if holders == nil && herr != nil {
		return nil, herr // bad arguments, a closed client
	}
	out := make([]Leadership, len(names))
	for i, n := range names {
		l := Leadership{Election: n, Leader: holders[i].Metadata, Unknown: holders[i].Unknown}
		if holders[i].Held {
			l.Term, l.Since = newestTerm(replies, i, l.Leader)
		}
		out[i] = l
	}
	if herr != nil {
		return out, herr
	}
	if rerr != nil {
		return out, &textError{msg: "elector: reading the term records: " + redlock.ErrorText(rerr), errs: []error{rerr}}
	}
	return out, nil
}

// newestTerm returns, of the term records at index i of the replies, the
// newest one of identity.
func newestTerm(replies []redlock.NodeReply, i int, identity string) (uint64, time.Time) {
	var term uint64
	var since time.Time
	for _, r := range replies {
		list, _ := r.Val.([]any)
		if r.Err != nil || i >= len(list) {
			continue
		}
		v, _ := list[i].(string)
		ms, rest, ok := strings.Cut(v, "|")
		at, err := strconv.ParseInt(ms, 10, 64)
		var rec termRecord
		if !ok || err != nil || json.Unmarshal([]byte(rest), &rec) != nil || rec.Identity != identity {
			continue
		}
		if rec.Term > term {
			term, since = rec.Term, time.UnixMilli(at)
		}
	}
	return term, since
}

// String is the leadership in words, for logs: `"billing" led by "web-3"
// (term 42 since 2026-01-02T15:04:05Z)`.
func (l Leadership) String() string {
	switch {
	case l.Unknown:
		return fmt.Sprintf("%q: leader unknown", l.Election)
	case l.Leader == "":
		return fmt.Sprintf("%q: no leader", l.Election)
	case l.Term == 0:
		return fmt.Sprintf("%q led by %q", l.Election, l.Leader)
	}
	return fmt.Sprintf("%q led by %q (term %d since %s)", l.Election, l.Leader, l.Term, l.Since.Format(time.RFC3339))
}
