package redlock

import (
	_ "embed"
	"time"

	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The record of an acquisition (WithRecord): a key beside the lock's,
// written by the acquire script all or nothing with them
// (scripts/record.lua). Another acquisition's record
// refuses the round like a held key, before the lock's keys; the record
// is never extended or released, and outlives the lock until its own TTL
// ends; the undo of a failed attempt deletes it.

//go:embed scripts/record.lua
var recordSrc string

var recordPart = script.Part{Name: "record", Fixed: 1, Args: 1, Refuses: true, Hooks: script.Parse(recordSrc)}

// record is the layer of a Lock acquired with WithRecord.
type record struct {
	baseLayer
	name string // the record's resource name
	key  string
	ttl  int64 // ms
}

func newRecord(c *Client, cfg *lockConfig, resources []string, _ bool) (layer, error) {
	if cfg.record == "" && cfg.recordTTL == 0 {
		return nil, nil
	}
	if err := checkAddedKey("WithRecord", "record", cfg.record, resources, cfg.owner); err != nil {
		return nil, err
	}
	if p := c.ttlProblem(cfg.recordTTL); p != "" {
		return nil, invalidf("record %s (WithRecord): %s", quoteName(cfg.record), p)
	}
	return &record{name: cfg.record, key: c.cfg.keyPrefix + cfg.record, ttl: cfg.recordTTL.Truncate(time.Millisecond).Milliseconds()}, nil
}

func (*record) part() script.Part { return recordPart }

func (r *record) keys([]string) []string { return []string{r.key} }

// args passes the record's TTL.
func (r *record) args(scriptKind, *attempt) []any { return []any{r.ttl} }

// reply reads the acquire reply {0, holder's value, PTTL, I.record}:
// refused by the record.
func (r *record) reply(_ *Lock, k scriptKind, lay *script.Layout, reply any) (NodeResult, bool) {
	v, _ := reply.([]any)
	i, ok := lay.Refusal("record")
	if k != kindAcquire || !ok || len(v) != 4 || !allInts(v[2:]) || intAt(v, 3) != int64(i) {
		return NodeResult{}, false
	}
	holder, isString := v[1].(string)
	return refusal(holder, time.Duration(intAt(v, 2))*time.Millisecond, r.name), isString
}

// WithRecord makes the acquisition also write a record of itself under
// the resource name record, with its own TTL: on each node, in the same
// script and all or nothing with the lock's keys, a record that another
// acquisition wrote refuses the round like a held key (checked first; the
// refused NodeResult's Resource names the record), and otherwise the
// record is set to this acquisition's value for ttl. A record is never
// extended or released: it outlives the lock until its TTL ends, so that
// the acquisition is remembered. A failed
// attempt deletes its record with its lock keys. The record obeys the
// rules of a resource name and of a TTL (restart gate included), must not
// be one of the lock's resources, and cannot be combined with WithOwner:
// the call rejects one that breaks a rule (ErrInvalidArgument). A
// LockOption only (Acquire, TryAcquire, Do): it names one acquisition's
// record, so it does not compile as an option of New. Default: no record.
func WithRecord(record string, ttl time.Duration) LockOption {
	return callOption(func(l *lockConfig) { l.record, l.recordTTL = record, ttl })
}
