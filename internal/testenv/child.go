package testenv

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// envChild names the test a child process runs (see StartChild).
const envChild = "NOLOCK_TEST_CHILD"

// ChildOnly marks a test that is the body of a child process: it runs only
// when StartChild started this binary for it, and is skipped otherwise.
func ChildOnly(t *testing.T) {
	t.Helper()
	if os.Getenv(envChild) != t.Name() {
		t.Skip("a child process's entry point: runs only under testenv.StartChild")
	}
}

// Child is a participant in its own process: the test binary re-executed
// to run one test (the usual Go idiom), so a test can pause it (SIGSTOP),
// resume it and kill it (SIGKILL) like a real crashed or frozen server.
type Child struct {
	t     testing.TB
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
	err   error
}

// StartChild runs the test named test (which calls ChildOnly first) in a
// new process of this test binary, with env added to the environment. Its
// stdout lines are available to WaitFor; its stderr goes to the test log.
// The child is killed, if still running, when the test ends.
func StartChild(t testing.TB, test string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(append(os.Environ(), envChild+"="+test), env...)
	cmd.Stderr = testWriter{t}
	return start(t, cmd, "child "+test)
}

// StartProcess runs the program at path (a binary the test built) with
// exactly env as its environment. Its stdout and stderr lines are both
// available to WaitFor, and logged. It is killed, if still running, when
// the test ends.
func StartProcess(t testing.TB, path string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(path)
	cmd.Env = env
	errs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	return start(t, cmd, path, errs)
}

// start starts cmd and reads its stdout, and the extra pipes, into lines.
func start(t testing.TB, cmd *exec.Cmd, what string, extra ...io.Reader) *Child {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", what, err)
	}
	c := &Child{t: t, cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	var read sync.WaitGroup
	for _, r := range append([]io.Reader{out}, extra...) {
		read.Add(1)
		go func() {
			defer read.Done()
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				if len(extra) > 0 {
					t.Logf("%s: %s", filepath.Base(what), sc.Text())
				}
				select {
				case c.lines <- sc.Text():
				default: // nobody is reading: drop rather than block the child
				}
			}
		}()
	}
	go func() {
		read.Wait()
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.Kill()
		<-c.done
	})
	return c
}

// Pid is the child's process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// WaitFor waits until the child prints a line containing s and returns it;
// it fails the test after timeout or if the child exits first.
func (c *Child) WaitFor(s string, timeout time.Duration) string {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line := <-c.lines:
			if strings.Contains(line, s) {
				return line
			}
		case <-c.done:
			// The reader finished before done closed, so every line the
			// child printed is buffered by now: look through them first.
			for line, ok := c.TryLine(); ok; line, ok = c.TryLine() {
				if strings.Contains(line, s) {
					return line
				}
			}
			c.t.Fatalf("testenv: child exited (%v) before printing %q", c.err, s)
		case <-deadline:
			c.t.Fatalf("testenv: child did not print %q within %v", s, timeout)
		}
	}
}

// TryLine returns the next line the child printed, if one is waiting.
func (c *Child) TryLine() (string, bool) {
	select {
	case line := <-c.lines:
		return line, true
	default:
		return "", false
	}
}

// Pause stops the child with SIGSTOP: it keeps its connections and state
// but runs no instruction, like a long GC pause or a frozen VM. It returns
// once the kernel reports the child stopped, so nothing the child does
// happens after Pause returns.
func (c *Child) Pause() {
	c.t.Helper()
	c.signal(syscall.SIGSTOP)
	Until(c.t, "the child is stopped", func() (bool, error) {
		select {
		case <-c.done:
			return true, nil // exited: it does nothing either
		default:
		}
		return c.stopped(), nil
	})
}

// stopped reports whether the kernel shows the child stopped by a signal.
func (c *Child) stopped() bool { return procState(c.Pid()) == 'T' }

// Resume continues a paused child with SIGCONT.
func (c *Child) Resume() { c.signal(syscall.SIGCONT) }

// Kill ends the child with SIGKILL: no cleanup, no goodbye, like a crash.
func (c *Child) Kill() {
	select {
	case <-c.done:
	default:
		c.signal(syscall.SIGKILL)
	}
}

// Terminate asks the child to stop (SIGTERM), as a service manager does.
func (c *Child) Terminate() { c.signal(syscall.SIGTERM) }

// Wait waits for the child to exit and returns its error (nil on exit 0).
func (c *Child) Wait() error {
	<-c.done
	return c.err
}

// ExitCode waits for the child to exit and returns its exit code (-1 if a
// signal ended it).
func (c *Child) ExitCode() int {
	<-c.done
	return c.cmd.ProcessState.ExitCode()
}

func (c *Child) signal(sig syscall.Signal) {
	if err := c.cmd.Process.Signal(sig); err != nil && err.Error() != "os: process already finished" {
		c.t.Errorf("testenv: signal child: %v", err)
	}
}

// testWriter sends a child's stderr to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("child: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
