package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/schedlock/schedlock/redlock/redlocktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStaleWriteIsRejected(t *testing.T) {
	for name, args := range map[string][]string{
		"miniredis": nil,
		"redis":     {"-redis", strings.Join(redlocktest.Start(t, 3).Addrs(), ",")},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(context.Background(), args, &out); err != nil {
				t.Fatalf("run: %v\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "late write was rejected") {
				t.Errorf("output:\n%s", out.String())
			}
		})
	}
}

func TestStoreRejectsOlderTokens(t *testing.T) {
	var s Store
	if err := s.Write(5, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(4, "b"); !errors.Is(err, ErrStaleToken) {
		t.Errorf("Write(4) after 5 = %v, want ErrStaleToken", err)
	}
	if err := s.Write(6, "c"); err != nil || s.value != "c" {
		t.Errorf("Write(6) = %v, value %q", err, s.value)
	}
}
