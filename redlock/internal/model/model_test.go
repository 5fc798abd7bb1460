package model

import (
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// envLong=1 runs the long exploration: longer horizons, more faults.
const envLong = "SCHEDLOCK_MODEL_LONG"

func long() bool { return os.Getenv(envLong) == "1" }

// pick returns pr in the CI run, lng in the long run.
func pick[T any](pr, lng T) T {
	if long() {
		return lng
	}
	return pr
}

// stateLimit bounds one exploration: a configuration that reaches it has
// outgrown its run, which fails.
const stateLimit = 20_000_000

// base is the timing every configuration starts from: a round trip
// takes a tick, the TTL 8 ticks, a holder may extend to 8 or 16, a
// 2-tick node timeout, drift = TTL x 10% + 2, a grant must leave a
// quarter of its TTL (WithMinValidity(0.25): a fenced reentrant
// acquisition takes four round trips, half a TTL here). Node clocks are
// a few ticks apart.
func base(name string, horizon int64, clients ...ClientSpec) Config {
	return Config{Name: name, Clients: clients, TTL: 8, LongTTL: 16, NodeTimeout: 2, DriftFactorPct: 10, DriftConst: 2,
		MinValidityPct: 25, Horizon: horizon, NodeOffsets: [Nodes]int64{0, 2, -1}, Fencing: true}
}

// explore runs cfg and logs what it found: state counts, time, events
// and the trace of a violation.
func explore(t *testing.T, cfg Config) Result {
	t.Helper()
	r, err := Explore(cfg, stateLimit)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v", r)
	for k, v := range r.Events {
		t.Logf("  %s: %d transitions", k, v)
	}
	if r.Violation != "" {
		t.Logf("  violation: %s", r.Violation)
		for _, l := range r.Trace {
			t.Logf("    %s", l)
		}
	}
	return r
}

// holds explores cfg and fails on any violation or an exploration cut
// short.
func holds(t *testing.T, cfg Config) Result {
	t.Helper()
	r := explore(t, cfg)
	if r.Violation != "" {
		t.Errorf("%s: %s (trace above)", cfg.Name, r.Violation)
	}
	if !r.Complete {
		t.Errorf("%s: exploration cut at %d states", cfg.Name, r.States)
	}
	return r
}

// finds explores cfg and fails unless it breaks a property whose text
// contains want.
func finds(t *testing.T, cfg Config, want string) Result {
	t.Helper()
	r := explore(t, cfg)
	if !strings.Contains(r.Violation, want) {
		t.Errorf("%s: found %q, want a violation containing %q", cfg.Name, r.Violation, want)
	}
	return r
}
