package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/schedlock/schedlock/redlock"
)

// A child holder is this test binary run again with envChild set: a
// separate process that acquires a lock and then hangs (to be killed with
// SIGKILL) or waits at the point between its validity check and its write
// (to be paused with SIGSTOP). It reports on stdout, one line per event,
// instants as CLOCK_MONOTONIC nanoseconds:
//
//	acquired <start> <until> <token>
//	checked <at>             (pause-write: validity checked, write next)
//	wrote <at> <accepted 0|1>
//	error <message>

// Child settings, passed in the environment.
const (
	envChildNodes    = "SCHEDLOCK_FAULTS_NODES"    // comma-separated addresses
	envChildResource = "SCHEDLOCK_FAULTS_RESOURCE" // resource name
	envChildTTL      = "SCHEDLOCK_FAULTS_TTL"      // TTL in ms
	envChildFencing  = "SCHEDLOCK_FAULTS_FENCING"  // "1" for fencing
	envChildStore    = "SCHEDLOCK_FAULTS_STORE"    // store address (pause-write)
)

// Child roles.
const (
	roleHang       = "hang"
	rolePauseWrite = "pause-write"
)

func runChild(role string) int {
	fail := func(format string, args ...any) int {
		fmt.Printf("error %s\n", fmt.Sprintf(format, args...))
		return 1
	}
	var nodes []redis.UniversalClient
	for _, addr := range strings.Split(os.Getenv(envChildNodes), ",") {
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: addr}))
	}
	ttlMS, err := strconv.Atoi(os.Getenv(envChildTTL))
	if err != nil {
		return fail("bad TTL: %v", err)
	}
	fenced := os.Getenv(envChildFencing) == "1"
	locks, err := redlock.New(nodes, redlock.WithKeyPrefix(keyPrefix), redlock.WithFencing(fenced))
	if err != nil {
		return fail("New: %v", err)
	}
	defer locks.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := locks.Acquire(ctx, []string{os.Getenv(envChildResource)}, time.Duration(ttlMS)*time.Millisecond)
	if err != nil {
		return fail("Acquire: %v", err)
	}
	start := MonoNow()
	fmt.Printf("acquired %d %d %d\n", start, start+int64(time.Until(l.Until())), l.FencingToken())
	switch role {
	case roleHang:
		time.Sleep(time.Hour) // until killed
		return 0
	case rolePauseWrite:
		store := NewStore(redis.NewClient(&redis.Options{Addr: os.Getenv(envChildStore)}), "store")
		if !time.Now().Before(l.Until()) {
			return fail("validity already over before the write")
		}
		fmt.Printf("checked %d\n", MonoNow())
		// The write is next. The parent pauses the process here (SIGSTOP)
		// before it lets it go on: a GC pause or a stopped VM between the
		// check and the write.
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return fail("stdin: %v", err)
		}
		at := MonoNow()
		ok, err := store.Write(context.Background(), "child", l.FencingToken(), fenced)
		if err != nil {
			return fail("%v", err)
		}
		fmt.Printf("wrote %d %d\n", at, boolInt(ok))
		_ = l.Release(context.Background())
		return 0
	}
	return fail("unknown role %q", role)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// child is a running child holder.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    *os.File
	r      *bufio.Reader
	stdin  io.WriteCloser
	stderr string
}

// startChild starts a child holder with role on nodes, for resource.
func startChild(t *testing.T, role string, nodes []string, resource string, ttl time.Duration, fenced bool, store string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envChild+"="+role,
		envChildNodes+"="+strings.Join(nodes, ","),
		envChildResource+"="+resource,
		envChildTTL+"="+strconv.FormatInt(ttl.Milliseconds(), 10),
		envChildFencing+"="+strconv.Itoa(boolInt(fenced)),
		envChildStore+"="+store,
	)
	errPath := filepath.Join(t.TempDir(), "child.stderr")
	errFile, err := os.Create(errPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = errFile.Close()
	c := &child{t: t, cmd: cmd, out: stdout.(*os.File), r: bufio.NewReader(stdout), stdin: stdin, stderr: errPath}
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// expect reads the child's next line, which must start with word, within
// limit, and returns its fields after word.
func (c *child) expect(word string, limit time.Duration) []string {
	c.t.Helper()
	if err := c.out.SetReadDeadline(time.Now().Add(limit)); err != nil {
		c.t.Fatal(err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		b, _ := os.ReadFile(c.stderr)
		c.t.Fatalf("child: waiting for %q: %v (stderr: %s)", word, err, b)
	}
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != word {
		b, _ := os.ReadFile(c.stderr)
		c.t.Fatalf("child said %q, want %q (stderr: %s)", strings.TrimSpace(line), word, b)
	}
	return f[1:]
}

// monoField parses an instant reported by the child.
func (c *child) monoField(s string) time.Time {
	c.t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		c.t.Fatalf("child: bad instant %q", s)
	}
	return MonoToTime(n)
}

// acquired waits for the child's lock and returns its start, until and
// token.
func (c *child) acquired(limit time.Duration) (start, until time.Time, token uint64) {
	c.t.Helper()
	f := c.expect("acquired", limit)
	if len(f) != 3 {
		c.t.Fatalf("child: acquired %q", f)
	}
	tok, _ := strconv.ParseUint(f[2], 10, 64)
	return c.monoField(f[0]), c.monoField(f[1]), tok
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// kill sends SIGKILL and waits until the process has exited; it returns
// the instant the signal was sent.
func (c *child) kill() time.Time {
	c.t.Helper()
	at := time.Now()
	if err := syscall.Kill(c.pid(), syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill child: %v", err)
	}
	_ = c.cmd.Wait()
	return at
}

// stop freezes the child with SIGSTOP and returns once it is stopped.
func (c *child) stop() {
	c.t.Helper()
	if err := syscall.Kill(c.pid(), syscall.SIGSTOP); err != nil {
		c.t.Fatalf("SIGSTOP child: %v", err)
	}
	if !waitFor(2*time.Second, func() bool { return procState(c.pid()) == 'T' }) {
		c.t.Fatalf("child %d not stopped after SIGSTOP", c.pid())
	}
}

// cont resumes the child with SIGCONT.
func (c *child) cont() {
	c.t.Helper()
	if err := syscall.Kill(c.pid(), syscall.SIGCONT); err != nil {
		c.t.Fatalf("SIGCONT child: %v", err)
	}
}

// procState returns the state letter of /proc/pid/stat, or 0.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}
