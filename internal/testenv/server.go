package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// PGServer is a PostgreSQL cluster of the test's own, for fault tests that
// crash and restart the server: doing that to the shared one would break
// every other test running. It is made from the same Debian binaries
// scripts/services installs (initdb, about a second), listens on a free
// loopback port, and is stopped and removed when the test ends.
type PGServer struct {
	t        testing.TB
	bin, dir string
	port     int
	paused   []int // the processes Pause stopped
}

// PostgresServer starts a PGServer. Without PostgreSQL's server binaries
// the test fails under CI (and scripts/test) and skips otherwise, as for a
// missing service.
func PostgresServer(t testing.TB) *PGServer {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		msg := "PostgreSQL's server binaries are not installed: run `scripts/services up` (or scripts/test)"
		if Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	sort.Strings(bins) // one digit versions, 13 to 17: text order is version order
	s := &PGServer{t: t, bin: filepath.Dir(bins[len(bins)-1])}
	// Not t.TempDir: the server runs as the postgres user when the tests
	// run as root (initdb refuses root), and must reach its directory.
	s.dir = ownedTempDir(t, "nolock-pg-")
	s.port = freePort(t)

	s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
	conf := fmt.Sprintf(`listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 60
shared_buffers = 32MB
fsync = on
synchronous_commit = on
`, s.port, s.dir)
	f, err := os.OpenFile(filepath.Join(s.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("testenv: configure the private server: %v", err)
	}
	s.Start()
	t.Cleanup(func() { // the test may have left it stopped
		_ = s.command("pg_ctl", "-D", s.data(), "stop", "-m", "immediate").Run()
	})
	return s
}

// DSN returns the server's DSN.
func (s *PGServer) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Crash stops the server the way a crash would: every server process is
// killed at once, with no checkpoint, and its clients' connections break.
// What had committed (fsync is on) survives; the next Start recovers it.
func (s *PGServer) Crash() { s.pgctl("stop", "-m", "immediate") }

// CrashFor crashes the server, keeps it down for d, and starts it again:
// a restart after a crash, as its clients see one.
func (s *PGServer) CrashFor(d time.Duration) {
	s.Crash()
	time.Sleep(d)
	s.Start()
}

// Start starts the server and waits until it accepts connections; it
// fails the test with the server's log if it cannot.
func (s *PGServer) Start() {
	s.t.Helper()
	log := filepath.Join(s.dir, "log")
	unhold(s.port)
	if out, err := s.command("pg_ctl", "-D", s.data(), "start", "-w", "-t", "60", "-l", log).CombinedOutput(); err != nil {
		text, _ := os.ReadFile(log)
		s.t.Fatalf("testenv: start the private server on port %d: %v\n%s\n%s", s.port, err, out, text)
	}
	prioritisePostgres(s.data())
}

func (s *PGServer) data() string { return filepath.Join(s.dir, "data") }

func (s *PGServer) pgctl(args ...string) {
	s.run("pg_ctl", append([]string{"-D", s.data()}, args...)...)
}

// run runs one of the server's programs, as the postgres user when the
// tests run as root, and fails the test if it fails.
func (s *PGServer) run(prog string, args ...string) {
	s.t.Helper()
	if out, err := s.command(prog, args...).CombinedOutput(); err != nil {
		s.t.Fatalf("testenv: %s %v: %v\n%s", prog, args, err, out)
	}
}

// command returns the command that runs prog: as the postgres user when
// the tests run as root.
func (s *PGServer) command(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, prog)
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}
