// Package model is an executable model of redlock's protocol as
// implemented, explored exhaustively for small configurations by an
// explicit-state explorer of its own, and tied to the code.
//
//   - scripts.go mirrors redlock/scripts/*.lua line for line on a Store
//     (store.go), a small Redis with expiry on the node's clock: the
//     core's templates with the fragments of a call's layers at their
//     hooks (layers.go mirrors each layer's shape; internal/script lays
//     them out, for the model as for the client); calls.go builds each
//     call's keys and arguments as the client does.
//     TestScriptsMatchRedis runs the same calls on a real redis-server and
//     on the model and compares every reply and the whole key space.
//   - model.go is the protocol: nodes running those scripts on their own
//     clocks, clients running acquire.go's attempt (the quorum, the
//     validity, the undo, the retries; WithQuorumFirst's and
//     WithHighWaterFirst's rounds in quorumfirst.go), fencing.go's check, fence and
//     note rounds, lock.go's Extend and Release, keep.go's Keep, with
//     validity on their own monotonic clocks.
//   - explore.go explores every state reachable within a horizon,
//     breadth first, and returns the shortest trace to a state that breaks
//     a property.
//
// Faults (config.go): lost, delayed and reordered messages, nodes
// restarting empty with and without the restart gate, a client paused
// between its validity check and its write, clocks drifting at a bounded
// rate. Bugs puts historical bugs back, each as the code was before its
// fix. docs/safety.md ("The model") gives the scope, the assumptions,
// what the checker found, the state counts and the commands.
package model
