package redlock

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock/internal/node"
	"github.com/schedlock/schedlock/redlock/internal/script"
)

// The seam. A layer adds one feature to a lock's rounds: fencing,
// reentrancy, restart gating, wake on release, the scheduler's records
// (a record, a high-water mark, a release log), quorum-first asking. The
// core (acquire.go, lock.go, round.go, client.go) calls the layers at fixed points
// and names none of them (docs/design.md, "The seam"):
//
//   - In the scripts: each layer's Lua fragment (scripts/<layer>.lua)
//     goes into the core's templates at their hooks (internal/script);
//     its keys follow the lock keys and its arguments the core's, where
//     the layout puts them. The acquire template is the redis.io step,
//     SET NX PX per key with the undo of a partial grant; its hooks are
//     check (before anything is set: may refuse), refused (a key of
//     another's refused), granted (every key set: may add reply
//     elements). Extend's are regain (before a missing key is set
//     again: may refuse) and extended; release's are verify (before
//     anything is deleted: may refuse with an error reply), hold (may
//     keep a key that other holds use), deleted and released; an undo's
//     are undo and hold.
//   - In Go: begin (an attempt starts: a reentrant owner's token),
//     reply (reads a reply of its own to acquire or extend: a refusal
//     by its keys, or gating's {2, ms left}), granted (after a quorum
//     granted, before the validity: more rounds, values for the Lock),
//     released (after a quorum released), wait (spends Acquire's delay
//     between attempts: wake), done (the acquisition ended) and order (how
//     an acquire round asks the nodes: round.go's askingOrder; a layer
//     with only an order, quorumfirst.go, is in no script).
//
// Layers are chosen once per Lock, from the options, in the order of
// registry, which is the order of their keys, arguments, reply elements
// and hooks in every script. A new feature is one file with its layer
// (and its fragment beside it), plus a line in registry.
type layer interface {
	// part is the layer's static share of the scripts: its name, the
	// shape of its keys, its argument and reply counts and its Lua by hook.
	part() script.Part
	// keys returns its keys for a lock with lock keys lockKeys: PerKey per
	// resource (all of the first kind for every resource, then the next),
	// then Fixed more.
	keys(lockKeys []string) []string
	// args returns its arguments in script k (Part.Args of them, or any
	// number for Args -1).
	args(k scriptKind, a *attempt) []any
	// begin sets up an attempt: a reentrant owner's token, and the
	// layer's own state for it (reentrancy's acquisition ID).
	begin(a *attempt)
	// reply reads v, a reply to script k (acquire or extend), laid out by
	// lay, that the core does not read: the core reads {1, ...} granted
	// and {0, holder's value, PTTL, i} refused by lock key i >= 1
	// (acquire), and 0, 1 and 3 (extend); a layer reads what its own
	// fragment returns (a refusal by its keys, with its index
	// lay.Refusal; gating's {2, ms left}). False when v is not one of the
	// layer's.
	reply(l *Lock, k scriptKind, lay *script.Layout, v any) (NodeResult, bool)
	// granted runs after a quorum granted attempt a (rs: the replies to
	// k, laid out by lay) and before the validity is checked; an error
	// fails the attempt, which is then undone.
	granted(ctx context.Context, a *attempt, lay *script.Layout, k call, rs []NodeResult) *QuorumError
	// released runs after a quorum released the lock; args are the
	// layer's arguments of that release.
	released(l *Lock, args []any)
	// wait spends Acquire's delay d after the failed attempt q, before
	// the next attempt (wake.go: until a release notice); false leaves
	// it to the core, which sleeps d. The first layer that waits does.
	wait(ctx context.Context, l *Lock, q *QuorumError, d time.Duration) bool
	// done runs once an Acquire or TryAcquire of l ends, acquired or not.
	done(l *Lock, acquired bool)
	// order returns a new asking order for one acquire round of the Lock
	// (round.go, askingOrder: which nodes are asked first, and when the
	// others are), or nil. The first layer that has one gives it.
	order() askingOrder
}

// registry makes the layers of one Lock from its options, in order; each
// returns nil when its feature is off for the Lock. retrying says that
// the Lock is Acquire's (which retries and waits for release notices),
// not TryAcquire's.
var registry = []func(c *Client, cfg *lockConfig, resources []string, retrying bool) (layer, error){
	newReentrant,
	newFencing,
	newGating,
	newRecord,
	newHighWater,
	newWakeMark,
	newWakeNotice,
	newQuorumFirst,
}

// A service is a feature's state shared by the Locks of one Client
// (wake.go's release-notice subscribers): made at New, in the order of
// services, and stopped at Close, which waits for close to return.
type service interface{ close() }

var services = []func(c *Client) service{
	func(c *Client) service { return newWaker(c) },
}

// serviceOf returns c's service of type T, or T's zero value.
func serviceOf[T service](c *Client) T {
	for _, s := range c.services {
		if t, ok := s.(T); ok {
			return t
		}
	}
	var zero T
	return zero
}

// clientDefaults set the features' defaults of a Client's options before
// New applies the options given. clientChecks validate the features'
// options at New, and callChecks those a call may be given (at New, for
// the SharedOptions given to it, too), each naming the bad value;
// ttlChecks are the features' limits on every TTL of a Client (CheckTTL:
// ttl as given, "" when it is within the limit). Each is in its
// feature's file.
var (
	clientDefaults = []func(cfg *config){defaultFencingRetention}
	clientChecks   = []func(cfg *config) error{checkFencingRetention, checkGate}
	callChecks     = []func(cfg *lockConfig) error{checkOwner}
	ttlChecks      = []func(cfg *config, ttl time.Duration) string{checkGateTTL}
)

// releaseLayers returns the layers that opts add to a Release of l, in
// order (releaselog.go), or the error of an option that does not apply.
func releaseLayers(l *Lock, opts []ReleaseOption) ([]layer, error) {
	var layers []layer
	for i, o := range opts {
		if o == nil {
			return nil, invalidf("ReleaseOption %d of %d is nil", i+1, len(opts))
		}
		y, err := o.releaseLayer(l, layers)
		if err != nil {
			return nil, err
		}
		layers = append(layers, y)
	}
	return layers, nil
}

// baseLayer gives a layer the defaults of the methods it does not need.
type baseLayer struct{}

func (baseLayer) keys([]string) []string          { return nil }
func (baseLayer) args(scriptKind, *attempt) []any { return nil }
func (baseLayer) begin(*attempt)                  {}
func (baseLayer) reply(*Lock, scriptKind, *script.Layout, any) (NodeResult, bool) {
	return NodeResult{}, false
}
func (baseLayer) granted(context.Context, *attempt, *script.Layout, call, []NodeResult) *QuorumError {
	return nil
}
func (baseLayer) released(*Lock, []any) {}
func (baseLayer) wait(context.Context, *Lock, *QuorumError, time.Duration) bool {
	return false
}
func (baseLayer) done(*Lock, bool)   {}
func (baseLayer) order() askingOrder { return nil }

// perKey returns lockKeys, each with suffix: a key per resource.
func perKey(lockKeys []string, suffix string) []string {
	keys := make([]string, len(lockKeys))
	for i, k := range lockKeys {
		keys[i] = k + suffix
	}
	return keys
}

// attempt is one acquisition attempt: its value, which its extensions
// and release use too once it holds the lock.
type attempt struct {
	l     *Lock
	token string // the owner token: new per attempt unless a layer keeps one
	value string
	// release says that the call is a Release (not an undo, nor the
	// cleanup of a lost extension).
	release bool
}

// scriptKind names a script built from a core template and layers.
type scriptKind int

const (
	kindAcquire scriptKind = iota
	kindExtend
	kindRelease
	kindUndo
)

// templates are the core's scripts: source, hooks, and the number of the
// core's own arguments and reply elements.
var templates = [...]struct {
	src           *string
	hooks         []string
	args, replies int
}{
	kindAcquire: {&acquireSrc, []string{"check", "refused", "granted"}, 3, 1},
	kindExtend:  {&extendSrc, []string{"regain", "extended"}, 3, 0},
	kindRelease: {&releaseSrc, []string{"verify", "hold", "deleted", "released"}, 2, 0},
	kindUndo:    {&releaseSrc, []string{"undo", "hold"}, 2, 0},
}

// assembled is one script for one combination of layers.
type assembled struct {
	layout *script.Layout
	script *node.Script
	in     []bool // per layer of the combination: in the script
}

// scriptKey names one assembled script: its kind and its layers' types,
// in order (a layer's type: two may share a part name, wake.go).
type scriptKey struct {
	kind  scriptKind
	types [maxLayers]reflect.Type
}

// maxLayers bounds the layers of one script: the registry's and a
// Release's log.
const maxLayers = 16

// scriptCache holds the assembled scripts: a handful per process.
var scriptCache struct {
	sync.RWMutex
	m map[scriptKey]*assembled
}

// assemble returns script k for layers, assembling it once per
// combination.
func assemble(k scriptKind, layers []layer) *assembled {
	key := scriptKey{kind: k}
	for i, y := range layers {
		key.types[i] = reflect.TypeOf(y)
	}
	scriptCache.RLock()
	a, ok := scriptCache.m[key]
	scriptCache.RUnlock()
	if ok {
		return a
	}
	t := templates[k]
	parts := make([]script.Part, len(layers))
	for i, y := range layers {
		parts[i] = y.part()
	}
	lay := script.New(t.hooks, t.args, t.replies, parts...)
	a = &assembled{layout: lay, script: node.NewScript(lay.Assemble(*t.src)), in: make([]bool, len(layers))}
	for i := range layers {
		a.in[i] = parts[i].In(t.hooks)
	}
	scriptCache.Lock()
	defer scriptCache.Unlock()
	if old, ok := scriptCache.m[key]; ok {
		return old
	}
	if scriptCache.m == nil {
		scriptCache.m = map[scriptKey]*assembled{}
	}
	scriptCache.m[key] = a
	return a
}

// layerCall is a script's call with what its layers need afterwards.
type layerCall struct {
	call
	layout *script.Layout
	in     []layer // the layers in the script, in order
	largs  [][]any // each one's arguments
}

// scriptCall returns the call of script k for attempt a of l, with the
// extra layers (a Release's log) after l's; coreArgs are the core's
// arguments.
func (l *Lock) scriptCall(k scriptKind, op string, a *attempt, parse func(*redis.Cmd) NodeResult, coreArgs []any, extra ...layer) layerCall {
	layers, s := l.layers, l.scripts[k].Load()
	if len(extra) > 0 {
		layers, s = append(layers[:len(layers):len(layers)], extra...), nil
	}
	if s == nil {
		s = assemble(k, layers)
		if len(extra) == 0 {
			l.scripts[k].Store(s)
		}
	}
	lc := layerCall{call: call{op: op, timeout: l.cfg.nodeTimeout, script: s.script, keys: l.keys[:l.n:l.n],
		args: coreArgs, parse: parse}, layout: s.layout}
	for i, y := range layers {
		if !s.in[i] {
			continue
		}
		args := y.args(k, a)
		lc.in, lc.largs = append(lc.in, y), append(lc.largs, args)
		lc.keys = append(lc.keys, y.keys(l.keys[:l.n])...)
		lc.call.args = append(lc.call.args, args...)
	}
	return lc
}

// order returns the asking order of one acquire round of l: the first
// layer's that has one (layer.order), or nil: every node at once.
func (l *Lock) order() askingOrder {
	for _, y := range l.layers {
		if o := y.order(); o != nil {
			return o
		}
	}
	return nil
}

// layerOf returns the layer of type T of l (a nil Lock has none), or T's
// zero value: for the accessors of what a layer learned from a grant.
func layerOf[T layer](l *Lock) T {
	var zero T
	if l == nil {
		return zero
	}
	for _, y := range l.layers {
		if t, ok := y.(T); ok {
			return t
		}
	}
	return zero
}
