package faults

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// A second opinion on a history, by porcupine (anishathalye/porcupine,
// the checker etcd runs on its client histories): is the history
// linearizable as a register that holds the lock's (holder, fencing
// token)? Each window is an acquire, from the call of Acquire to its
// return, that takes a free lock (with a token above the last one, when
// fenced) and a release at the window's effective end; each guarded
// action is a use, at its instant, that needs the lock held by its
// window. Overlapping windows, a token that goes backwards and an action
// after the holder's validity have no linearization. No wall clock
// enters the register; the instants only order the operations.

// lockOp is one operation on the register.
type lockOp struct {
	kind  byte // 'a' acquire, 'r' release, 'u' use
	lock  int
	token uint64
}

// lockState is the register: the lock holding it (0: free) and the
// largest token handed out.
type lockState struct {
	holder int
	token  uint64
}

var lockModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byRes := map[string][]porcupine.Operation{}
		for _, op := range history {
			r := op.Metadata.(string)
			byRes[r] = append(byRes[r], op)
		}
		keys := make([]string, 0, len(byRes))
		for r := range byRes {
			keys = append(keys, r)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, r := range keys {
			out = append(out, byRes[r])
		}
		return out
	},
	Init: func() any { return lockState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, op := state.(lockState), input.(lockOp)
		switch op.kind {
		case 'a':
			if s.holder != 0 || op.token != 0 && op.token <= s.token {
				return false, s
			}
			return true, lockState{holder: op.lock, token: max(s.token, op.token)}
		case 'r':
			if s.holder != op.lock {
				return false, s
			}
			return true, lockState{token: s.token}
		}
		return op.lock != 0 && s.holder == op.lock, s
	},
	DescribeOperation: func(input, _ any) string {
		op := input.(lockOp)
		return fmt.Sprintf("%c lock %d token %d", op.kind, op.lock, op.token)
	},
}

// linearizeTimeout bounds porcupine's search; a history it cannot decide
// in time is reported as unknown.
const linearizeTimeout = 20 * time.Second

// linearizable checks windows and work with porcupine: Ok, Illegal, or
// Unknown when its search timed out.
func linearizable(windows []Window, work []Work) porcupine.CheckResult {
	var origin time.Time
	for _, w := range windows {
		if origin.IsZero() || w.Start.Before(origin) {
			origin = w.Start
		}
		if !w.Attempt.IsZero() && w.Attempt.Before(origin) {
			origin = w.Attempt
		}
	}
	at := func(t time.Time) int64 { return int64(t.Sub(origin)) } // monotonic readings
	var ops []porcupine.Operation
	for _, w := range windows {
		call := w.Attempt
		if call.IsZero() || call.After(w.Start) {
			call = w.Start
		}
		ops = append(ops,
			porcupine.Operation{Input: lockOp{'a', w.Lock, w.Token}, Call: at(call), Return: at(w.Start), Metadata: w.Resource},
			porcupine.Operation{Input: lockOp{'r', w.Lock, 0}, Call: at(w.Effective()), Return: at(w.Effective()), Metadata: w.Resource})
	}
	for _, x := range work {
		ops = append(ops, porcupine.Operation{Input: lockOp{'u', x.Lock, x.Token}, Call: at(x.At), Return: at(x.At), Metadata: x.Resource})
	}
	return porcupine.CheckOperationsTimeout(lockModel, ops, linearizeTimeout)
}
