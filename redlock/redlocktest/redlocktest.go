package redlocktest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds how long a starting server may take to answer PING.
	startTimeout = 5 * time.Second
	// portAttempts is how many fresh ports a new server tries when the one it
	// picked was taken between picking it and binding it.
	portAttempts = 5
	// restartAttempts is how often Restart retries binding its fixed port.
	restartAttempts = 20
	// killTimeout bounds the wait for a SIGKILLed process to be reaped.
	killTimeout = 10 * time.Second
	// ioTimeout bounds each private connection used by PING probes and Keys.
	ioTimeout = 5 * time.Second
	// logTailBytes is how much of each log failure messages include.
	logTailBytes = 4096
	// notFoundHint is the message used when no redis-server binary exists.
	notFoundHint = "redis-server not found in PATH (install it: apt-get install -y redis-server, or set REDIS_SERVER)"
)

// errPortInUse reports that redis-server could not bind its port.
var errPortInUse = errors.New("port already in use")

// config collects the effect of the Options given to StartServer or Start.
type config struct {
	appendOnly bool
	args       []string
}

// Option configures the servers started by StartServer and Start.
type Option func(*config)

// WithAppendOnlyFsyncAlways runs the server with --appendonly yes
// --appendfsync always: every write is in the append-only file, fsynced,
// before the server acknowledges it, so acknowledged data survives Kill
// followed by Restart.
func WithAppendOnlyFsyncAlways() Option {
	return func(c *config) { c.appendOnly = true }
}

// WithArgs appends extra command-line arguments to redis-server, after the
// package's own (for example WithArgs("--maxmemory", "10mb")). Arguments that
// the package already sets (--port, --bind, --dir, --logfile, --daemonize)
// must not be overridden, or the helpers may stop working.
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return c
}

// Server is one redis-server child process listening on 127.0.0.1.
//
// A Server keeps its port and data directory for its whole life: Restart
// starts a new process on the same port and directory. The process is
// killed, and its resources released, when the test that started it ends.
//
// The methods of a Server may be called from several goroutines at once; they
// are serialised internally. Methods that take a testing.TB may fail the test
// through it (t.Fatalf), so, like t.Fatalf itself, they must be called from
// the goroutine running the test; Addr, Dir and PID may be called from any
// goroutine.
type Server struct {
	bin  string
	dir  string
	port int
	cfg  config

	mu      sync.Mutex
	cmd     *exec.Cmd     // nil while no process runs (killed)
	exited  chan struct{} // closed once cmd has been reaped
	stopped bool          // SIGSTOP sent and no SIGCONT since
}

// Cluster is a set of independent servers, as returned by Start. Its methods
// have the same concurrency rules as those of Server.
type Cluster []*Server

// StartServer starts one redis-server on a free port of 127.0.0.1 with a new
// temporary data directory and returns once it answers PING. The process is
// resumed and killed, and the goroutine waiting for it has returned, by the
// time the test's cleanup has run.
//
// StartServer blocks for at most about five seconds per attempt. It fails the
// test with t.Fatalf if redis-server cannot be found (see the package
// documentation), or does not start (the message includes the tail of its
// redis.log, and of its standard output and error if it wrote any). It must
// be called from the test's goroutine.
func StartServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin := lookupRedis(t)
	cfg := newConfig(opts)
	dir := t.TempDir()
	s, err := startServer(bin, dir, cfg, freePort)
	if err != nil {
		t.Fatalf("redlocktest: %v", err)
	}
	t.Cleanup(s.cleanup)
	return s
}

// Start starts n servers, as StartServer does, in parallel, and returns them
// in a Cluster. It blocks until all of them answer PING or one has failed; on
// failure it fails the test with t.Fatalf after killing the servers that did
// start. It must be called from the test's goroutine.
func Start(t testing.TB, n int, opts ...Option) Cluster {
	t.Helper()
	if n < 0 {
		t.Fatalf("redlocktest: Start: negative server count %d", n)
	}
	bin := lookupRedis(t)
	cfg := newConfig(opts)
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	c := make(Cluster, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c[i], errs[i] = startServer(bin, dirs[i], cfg, freePort)
		})
	}
	wg.Wait()
	for _, s := range c {
		if s != nil {
			t.Cleanup(s.cleanup)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redlocktest: Start(%d): %v", n, err)
	}
	return c
}

// lookupRedis returns the path of the redis-server binary or fails the test.
func lookupRedis(t testing.TB) string {
	t.Helper()
	name := "redis-server"
	if env := os.Getenv("REDIS_SERVER"); env != "" {
		name = env
	}
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("redlocktest: %s: %v", notFoundHint, err)
	}
	return path
}

// freePort returns a port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	return port, nil
}

// startServer starts a server in dir, trying fresh ports from pickPort while
// the chosen one turns out to be taken. On error no process is left running.
// It does not touch any testing.TB, so it may run on any goroutine.
func startServer(bin, dir string, cfg config, pickPort func() (int, error)) (*Server, error) {
	var err error
	for range portAttempts {
		var port int
		port, err = pickPort()
		if err != nil {
			return nil, err
		}
		s := &Server{bin: bin, dir: dir, port: port, cfg: cfg}
		s.mu.Lock()
		err = s.launchLocked()
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortInUse) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("no free port after %d attempts: %w", portAttempts, err)
}

// args returns the full redis-server command line (without the binary).
func (s *Server) args() []string {
	appendOnly := "no"
	if s.cfg.appendOnly {
		appendOnly = "yes"
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", appendOnly,
		"--dir", s.dir,
		"--logfile", s.logPath(),
		"--enable-debug-command", "local",
		"--daemonize", "no",
	}
	if s.cfg.appendOnly {
		args = append(args, "--appendfsync", "always")
	}
	return append(args, s.cfg.args...)
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

// outPath is where the standard output and error of redis-server go: errors
// found before the log file is opened, such as bad arguments, appear there.
func (s *Server) outPath() string { return filepath.Join(s.dir, "redis-server.out") }

// launchLocked starts a process and waits until it answers PING. On error no
// process is left running and s.cmd is nil. s.mu must be held.
func (s *Server) launchLocked() error {
	logOffset, outOffset := fileSize(s.logPath()), fileSize(s.outPath())
	out, err := os.OpenFile(s.outPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redis-server on %s: %w", s.Addr(), err)
	}
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	// Files, not writers, so that exec starts no copying goroutines.
	cmd.Stdout = out
	cmd.Stderr = out
	err = cmd.Start()
	_ = out.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("start %s on %s: %w", s.bin, s.Addr(), err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited, s.stopped = cmd, exited, false

	if err := s.waitReady(cmd.Process.Pid, exited); err != nil {
		s.killLocked()
		logTail, outTail := fileTail(s.logPath(), logOffset), fileTail(s.outPath(), outOffset)
		if strings.Contains(logTail+outTail, "Address already in use") {
			err = fmt.Errorf("%w: %w", err, errPortInUse)
		}
		if logTail == "" {
			logTail = "(empty or missing)"
		}
		msg := fmt.Sprintf("redis-server on %s (dir %s): %v\n--- tail of %s ---\n%s",
			s.Addr(), s.dir, err, s.logPath(), logTail)
		if outTail != "" {
			msg += fmt.Sprintf("\n--- tail of %s ---\n%s", s.outPath(), outTail)
		}
		return &startError{msg: msg, err: err}
	}
	return nil
}

// waitReady polls until the process pid answers PING on s.Addr(). It checks
// the answering server's process_id, so that another server that owns the
// port cannot be mistaken for ours, except for a server that requires a
// password: its NOAUTH answer is enough.
func (s *Server) waitReady(pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	want := "process_id:" + strconv.Itoa(pid) + "\r\n"
	var lastErr error
	for {
		select {
		case <-exited:
			return errors.New("process exited during startup")
		default:
		}
		lastErr = func() error {
			c, err := dialRESP(s.Addr(), 200*time.Millisecond)
			if err != nil {
				return err
			}
			defer c.close()
			if _, err := c.do("PING"); err != nil {
				var rerr redisError
				if errors.As(err, &rerr) && strings.HasPrefix(string(rerr), "NOAUTH") {
					return nil // started with a password (WithArgs("--requirepass", ...)): it answers
				}
				return err
			}
			info, err := c.do("INFO", "server")
			if err != nil {
				return err
			}
			if b, ok := info.([]byte); !ok || !bytes.Contains(b, []byte(want)) {
				return errors.New("port answered by another redis-server process")
			}
			return nil
		}()
		if lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING within %v: %w", startTimeout, lastErr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killLocked kills the current process, if any, and waits until it has been
// reaped. It returns false if the process could not be reaped in time. s.mu
// must be held.
func (s *Server) killLocked() bool {
	if s.cmd == nil {
		return true
	}
	// SIGKILL also ends a stopped process; errors mean it has already exited.
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-s.exited:
	case <-time.After(killTimeout):
		return false
	}
	s.cmd, s.exited, s.stopped = nil, nil, false
	return true
}

// cleanup is registered with t.Cleanup: it resumes and kills the process and
// waits until it has been reaped, so that no goroutine outlives the test.
func (s *Server) cleanup() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	// A stopped process does not act on most signals until continued.
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd, s.exited, s.stopped = nil, nil, false
}

// Addr returns the server's address, "127.0.0.1:port". It stays the same
// across Kill and Restart. Safe for concurrent use; never blocks.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// PID returns the process id of the running (or stopped) redis-server, or 0
// after Kill and before Restart. Safe for concurrent use.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Dir returns the server's data directory, which also holds redis.log. It is
// removed when the test ends. Safe for concurrent use.
func (s *Server) Dir() string { return s.dir }

// Client returns a new go-redis client for the server, with go-redis's
// default options except Addr (in particular ContextTimeoutEnabled is false:
// only the client's own socket timeouts bound a command). The client is
// closed when the test ends. Client does not connect, so it does not block
// and works even while the server is stopped or killed.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop freezes the server with SIGSTOP: it answers nothing, but its
// listening socket and client connections stay open, so clients block until
// their own timeouts. Stop returns once the kernel reports the process as
// stopped (checked where /proc exists). It is a no-op on a stopped or
// killed server; it fails the test if the signal cannot be sent.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.stopped {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("redlocktest: Stop %s: %v", s.Addr(), err)
	}
	s.stopped = true
	waitProcState(s.cmd.Process.Pid, true)
}

// Cont resumes a server frozen by Stop with SIGCONT. It is a no-op on a
// server that is running or killed; it fails the test if the signal cannot
// be sent.
func (s *Server) Cont(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || !s.stopped {
		return
	}
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("redlocktest: Cont %s: %v", s.Addr(), err)
	}
	s.stopped = false
	waitProcState(s.cmd.Process.Pid, false)
}

// Kill kills the server with SIGKILL (which also works on a stopped server)
// and blocks until the process has exited and been reaped, so its port is
// closed when Kill returns. Without WithAppendOnlyFsyncAlways its data is
// lost. It is a no-op on a killed server and fails the test if the process
// does not exit within ten seconds.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.killLocked() {
		t.Fatalf("redlocktest: Kill %s: process %d not reaped within %v", s.Addr(), s.cmd.Process.Pid, killTimeout)
	}
}

// Restart starts a new redis-server process on the same port with the same
// data directory and options, first killing the current process if there is
// one (running or stopped). It blocks until the new process answers PING,
// which with WithAppendOnlyFsyncAlways is after it has loaded its data. It
// fails the test if the old process cannot be killed or the new one does not
// start (for example because another process took the port meanwhile); the
// message includes the tail of redis.log.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.killLocked() {
		t.Fatalf("redlocktest: Restart %s: process %d not reaped within %v", s.Addr(), s.cmd.Process.Pid, killTimeout)
	}
	var err error
	for range restartAttempts {
		if err = s.launchLocked(); !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("redlocktest: Restart: %v", err)
	}
}

// Keys returns all keys of the server (of database 0), sorted, read with
// SCAN over a private connection that is closed before Keys returns. It
// fails the test if the server cannot be reached or does not answer within
// five seconds, for example because it is killed or stopped.
func (s *Server) Keys(t testing.TB) []string {
	t.Helper()
	keys, err := s.keys()
	if err != nil {
		t.Fatalf("redlocktest: Keys %s: %v", s.Addr(), err)
	}
	return keys
}

func (s *Server) keys() ([]string, error) {
	c, err := dialRESP(s.Addr(), ioTimeout)
	if err != nil {
		return nil, err
	}
	defer c.close()
	keys := []string{}
	cursor := "0"
	for {
		reply, err := c.do("SCAN", cursor, "COUNT", "1000")
		if err != nil {
			return nil, err
		}
		arr, ok := reply.([]any)
		if !ok || len(arr) != 2 {
			return nil, fmt.Errorf("unexpected SCAN reply %#v", reply)
		}
		next, ok := arr[0].([]byte)
		batch, ok2 := arr[1].([]any)
		if !ok || !ok2 {
			return nil, fmt.Errorf("unexpected SCAN reply %#v", reply)
		}
		for _, k := range batch {
			b, ok := k.([]byte)
			if !ok {
				return nil, fmt.Errorf("unexpected SCAN key %#v", k)
			}
			keys = append(keys, string(b))
		}
		if cursor = string(next); cursor == "0" {
			break
		}
	}
	// SCAN may return a key more than once.
	sort.Strings(keys)
	out := keys[:0]
	for i, k := range keys {
		if i == 0 || k != keys[i-1] {
			out = append(out, k)
		}
	}
	return out, nil
}

// Addrs returns the address of every server, in order. Never blocks.
func (c Cluster) Addrs() []string {
	addrs := make([]string, len(c))
	for i, s := range c {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Clients returns one new *redis.Client per server, in order, as
// Server.Client does; they are closed when the test ends.
func (c Cluster) Clients(t testing.TB) []redis.UniversalClient {
	t.Helper()
	clients := make([]redis.UniversalClient, len(c))
	for i, s := range c {
		clients[i] = s.Client(t)
	}
	return clients
}

// Keys returns Server.Keys of every server, in order. It fails the test as
// soon as one server cannot be read.
func (c Cluster) Keys(t testing.TB) [][]string {
	t.Helper()
	keys := make([][]string, len(c))
	for i, s := range c {
		keys[i] = s.Keys(t)
	}
	return keys
}

// waitProcState waits briefly until /proc reports the process as stopped
// (state T) or not, so that Stop returns only once the process is frozen.
// Where /proc does not exist it returns at once.
func waitProcState(pid int, stopped bool) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// The state follows the parenthesised command name.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return
		}
		if state := b[i+2]; (state == 'T' || state == 't') == stopped {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// startError is a failure to start a server, with the tails of its logs.
type startError struct {
	msg string
	err error
}

func (e *startError) Error() string { return e.msg }
func (e *startError) Unwrap() error { return e.err }

// fileTail returns the end of the file from offset on, at most logTailBytes,
// or "" if there is nothing there.
func fileTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return ""
		}
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	defer f.Close()
	size := fileSize(path)
	if size-offset > logTailBytes {
		offset = size - logTailBytes
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	return string(b)
}

// respConn is a minimal RESP2 connection, used for readiness probes and Keys
// so that they start no goroutines and hold no pool.
type respConn struct {
	c net.Conn
	r *bufio.Reader
}

// redisError is an error reply of the server.
type redisError string

func (e redisError) Error() string { return "redis: " + string(e) }

// dialRESP connects to addr; every later operation must finish within
// timeout of the dial.
func dialRESP(addr string, timeout time.Duration) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		_ = c.Close()
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReader(c)}, nil
}

func (c *respConn) close() { _ = c.c.Close() }

// do sends a command and reads its reply: string for status replies, []byte
// (or nil) for bulk strings, int64, []any for arrays; error replies are
// returned as a redisError.
func (c *respConn) do(args ...string) (any, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.c.Write(b.Bytes()); err != nil {
		return nil, err
	}
	return c.read()
}

func (c *respConn) read() (any, error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return nil, fmt.Errorf("malformed reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return nil, redisError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		return c.readBulk(body)
	case '*':
		return c.readArray(body)
	default:
		return nil, fmt.Errorf("unexpected reply type %q", kind)
	}
}

// readBulk reads a bulk string of length body (nil for -1).
func (c *respConn) readBulk(body string) (any, error) {
	n, err := strconv.Atoi(body)
	if err != nil {
		return nil, fmt.Errorf("malformed bulk length %q", body)
	}
	if n < 0 {
		return nil, nil
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(c.r, buf); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// readArray reads an array of length body (nil for -1).
func (c *respConn) readArray(body string) (any, error) {
	n, err := strconv.Atoi(body)
	if err != nil {
		return nil, fmt.Errorf("malformed array length %q", body)
	}
	if n < 0 {
		return nil, nil
	}
	arr := make([]any, n)
	for i := range arr {
		if arr[i], err = c.read(); err != nil {
			return nil, err
		}
	}
	return arr, nil
}
