package redlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRawBulk: rawBulk takes nil (RESP2 and RESP3) and bulk strings, and
// nothing else, also not a bulk string whose length does not match.
func TestRawBulk(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   string
		isNil  bool
		wantOK bool
	}{
		{in: "$-1\r\n", isNil: true, wantOK: true},
		{in: "_\r\n", isNil: true, wantOK: true},
		{in: "$5\r\nab-cd\r\n", want: "ab-cd", wantOK: true},
		{in: "$0\r\n\r\n", want: "", wantOK: true},
		{in: "$4\r\na\r\nb\r\n", want: "a\r\nb", wantOK: true},
		{in: "$5\r\nab\r\n"}, // short
		{in: "$1\r\nab\r\n"}, // long
		{in: "$2\r\nabxx"},   // no CRLF after the payload
		{in: "$x\r\nab\r\n"}, // no length
		{in: "$-2\r\n"},      // negative length
		{in: "-ERR syntax error\r\n"},
		{in: "+OK\r\n"},
		{in: ":1\r\n"},
		{in: "*-1\r\n"},
		{in: ""},
	} {
		v, ok := rawBulk([]byte(tc.in))
		if ok != tc.wantOK || (v == nil) != (tc.isNil || !tc.wantOK) || string(v) != tc.want {
			t.Errorf("rawBulk(%q) = %q (nil %v), %v; want %q (nil %v), %v", tc.in, v, v == nil, ok, tc.want, tc.isNil, tc.wantOK)
		}
	}
}

// TestCook: what cook makes of each raw reply, before and after the op's
// end, for an op sent alone (resend) and in a pipeline. Only an error
// reply that go-redis's Do retries, to an op sent alone, before its end,
// is left for Do.
func TestCook(t *testing.T) {
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	cmd := []any{"set", "k", "v", "px", 1000, "nx", "get"}
	cook := func(reply string, err error, deadline time.Time, resend bool) (*op, bool) {
		raw := redis.NewRawCmd(context.Background(), cmd...)
		if err != nil {
			raw.SetErr(err)
		} else {
			raw.SetVal([]byte(reply))
		}
		o := &op{ctx: context.Background(), deadline: deadline, cmd: cmd, alt: true, raw: raw}
		done := o.cook(resend)
		if o.raw != nil || !o.cooked {
			t.Errorf("cook(%q): raw %v, cooked %v; want nil, true", reply, o.raw, o.cooked)
		}
		return o, done
	}
	for _, deadline := range []time.Time{past, future} {
		for _, resend := range []bool{false, true} {
			if o, done := cook("_\r\n", nil, deadline, resend); !done || !errors.Is(o.res.Err(), redis.Nil) {
				t.Errorf("nil reply: done %v, %v; want true, redis.Nil", done, o.res.Err())
			}
			if o, done := cook("$3\r\nabc\r\n", nil, deadline, resend); !done || o.res.Val() != "abc" || o.res.Err() != nil {
				t.Errorf("bulk reply: done %v, %v, %v; want true, abc, nil", done, o.res.Val(), o.res.Err())
			}
			broken := errors.New("connection reset")
			if o, done := cook("", broken, deadline, resend); !done || !errors.Is(o.res.Err(), broken) {
				t.Errorf("go-redis error: done %v, %v; want true, %v", done, o.res.Err(), broken)
			}
			if o, done := cook(":1\r\n", nil, deadline, resend); !done || o.res.Err() == nil || !strings.Contains(o.res.Err().Error(), `":1\r\n"`) {
				t.Errorf("unexpected reply: done %v, %v; want true and an error that quotes it", done, o.res.Err())
			}
			// Not retried by go-redis: may come from a proxy after the
			// command ran, so it is never sent again.
			for reply, want := range map[string]string{
				"-ERR syntax error\r\n":               "ERR syntax error",
				"-OOM command not allowed\r\n":        "OOM command not allowed",
				"-ERR proxy: upstream timed out\r\n":  "ERR proxy: upstream timed out",
				"!22\r\nSYNTAX invalid\r\nsyntax\r\n": "SYNTAX invalid\r\nsyntax", // RESP3 blob error
			} {
				o, done := cook(reply, nil, deadline, resend)
				var rerr redis.Error
				if !done || !errors.As(o.res.Err(), &rerr) || o.res.Err().Error() != want {
					t.Errorf("error reply %q: done %v, %v; want true and the reply as a Redis error", reply, done, o.res.Err())
				}
			}
		}
	}
	retried := "-READONLY You can't write against a read only replica.\r\n"
	if o, done := cook(retried, nil, future, true); done || o.res != nil {
		t.Errorf("retried error reply, alone, before the end: done %v, res %v; want false, nil (sent again with Do)", done, o.res)
	}
	for _, tc := range []struct {
		deadline time.Time
		resend   bool
	}{{future, false}, {past, true}, {past, false}} {
		o, done := cook(retried, nil, tc.deadline, tc.resend)
		if err := o.res.Err(); !done || !redis.HasErrorPrefix(err, "READONLY") {
			t.Errorf("retried error reply, resend %v, ended %v: done %v, %v; want true and the reply as a Redis error", tc.resend, tc.deadline == past, done, err)
		}
	}
}

// TestCmdKeys: the keys a command names, for sendPipeline's ordering rule.
func TestCmdKeys(t *testing.T) {
	for _, tc := range []struct {
		cmd  []any
		want []any
	}{
		{[]any{"set", "k", "v", "px", 1000, "nx", "get"}, []any{"k"}},
		{[]any{"evalsha", "sha", 2, "a", "b", "v"}, []any{"a", "b"}},
		{[]any{"eval", "src", 1, "a", "v"}, []any{"a"}},
		{[]any{"evalsha", "sha", 0, "v"}, []any{}},
		{[]any{"evalsha", "sha", 3, "a"}, nil}, // malformed
		{[]any{"get", "k"}, nil},
	} {
		if got := cmdKeys(tc.cmd); !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("cmdKeys(%v) = %v, want %v", tc.cmd, got, tc.want)
		}
	}
}

// TestDropEnded: ops whose end has passed get that error and are not sent
// again; the others keep their order. A dropped EVAL's script is still to
// be loaded.
func TestDropEnded(t *testing.T) {
	ctx := context.Background()
	past, future := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	cmd := []any{"eval", "return 1", 1, "k"}
	a := &op{ctx: ctx, deadline: future, cmd: cmd}
	b := &op{ctx: ctx, deadline: past, cmd: cmd}
	c := &op{ctx: ctx, deadline: future, cmd: cmd}
	live, load := dropEnded([]*op{a, b, c}, nil)
	if len(live) != 2 || live[0] != a || live[1] != c {
		t.Errorf("dropEnded kept %v, want the two live ops in order", live)
	}
	if !slices.Equal(load, []string{"return 1"}) {
		t.Errorf("dropEnded: scripts to load %q, want the dropped EVAL's", load)
	}
	if b.res == nil || !errors.Is(b.res.Err(), context.DeadlineExceeded) {
		t.Errorf("the ended op's result: %v, want DeadlineExceeded", b.res)
	}
	if a.res != nil || c.res != nil {
		t.Error("dropEnded set a live op's result")
	}
}

// TestParseAcquireReplyOwnValue: SET NX GET that answers the lock's own
// value ran before (go-redis sent it again after a connection error): the
// key is ours, also when a waiter has marked the byte after the owner
// token. Another owner's value is a refusal.
func TestParseAcquireReplyOwnValue(t *testing.T) {
	own := strings.Repeat("a", tokenLen) + "-meta"
	set := func(reply string) *redis.Cmd {
		cmd := redis.NewCmd(context.Background(), "set", "k", own, "px", 1000, "nx", "get")
		cmd.SetVal(reply)
		return cmd
	}
	for _, v := range []string{own, strings.Repeat("a", tokenLen) + "_meta"} {
		if rep, err := parseAcquireReply(set(v)); err != nil || !rep.ok {
			t.Errorf("SET NX GET answering %q (own token): %+v, %v; want granted", v, rep, err)
		}
	}
	other := strings.Repeat("b", tokenLen) + "-theirs"
	if rep, err := parseAcquireReply(set(other)); err != nil || rep.ok || rep.holder != "theirs" {
		t.Errorf("SET NX GET answering another owner's value: %+v, %v; want refused, holder %q", rep, err, "theirs")
	}
}
