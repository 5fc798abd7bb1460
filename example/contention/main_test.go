package main

import (
	"context"
	"strings"
	"testing"
)

func TestRunTakesTurns(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-workers", "3", "-rounds", "2", "-hold", "20ms"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if got := strings.Count(out.String(), " got report after waiting "); got != 6 {
		t.Errorf("%d acquisitions printed, want 6:\n%s", got, out.String())
	}
}

func TestBadFlagsNameTheValue(t *testing.T) {
	for _, args := range [][]string{{"-workers", "0"}, {"-rounds", "101"}, {"-hold", "3s"}, {"-redis", "nohost"}} {
		var out strings.Builder
		err := run(context.Background(), args, &out)
		if err == nil || !strings.Contains(err.Error(), args[1]) {
			t.Errorf("run(%q) = %v, want an error naming %q", args, err, args[1])
		}
	}
}
