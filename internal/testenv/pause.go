package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Pause stops the server with SIGSTOP, as a frozen machine or a long GC
// pause would: its connections stay open and take requests in, and nothing
// answers until Resume. It returns once the kernel shows it stopped. A
// server left paused is resumed before the test's cleanup kills it.
func (s *DDBServer) Pause() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("testenv: Pause: dynalite is not running")
	}
	pid := s.cmd.Process.Pid
	s.t.Cleanup(func() { continueAll(s.t, []int{pid}) })
	stopAll(s.t, []int{pid})
}

// Resume continues a paused server with SIGCONT: it answers what it took
// in meanwhile, late.
func (s *DDBServer) Resume() {
	if s.cmd != nil {
		continueAll(s.t, []int{s.cmd.Process.Pid})
	}
}

// Pause stops every process of the server with SIGSTOP (the postmaster
// first, so it starts no new one meanwhile), as a frozen machine would:
// connections stay open and new ones are taken into the listen queue, and
// nothing answers until Resume. It returns once the kernel shows them all
// stopped. A server left paused is resumed before the test's cleanup
// stops it.
func (s *PGServer) Pause() {
	s.t.Helper()
	pm, _, err := postmaster(s.data())
	if err != nil {
		s.t.Fatalf("testenv: Pause: %v", err)
	}
	stopAll(s.t, []int{pm})
	s.paused = append([]int{pm}, children(pm)...)
	paused := s.paused
	s.t.Cleanup(func() { continueAll(s.t, paused) })
	stopAll(s.t, s.paused)
}

// Resume continues the processes Pause stopped, with SIGCONT.
func (s *PGServer) Resume() {
	continueAll(s.t, s.paused)
	s.paused = nil
}

// postmaster returns the pid in data's postmaster.pid, and the file's lines.
func postmaster(data string) (int, []string, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, nil, fmt.Errorf("the server is not running: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil {
		return 0, nil, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pm, lines, nil
}

// stopAll stops pids with SIGSTOP and returns once the kernel shows each
// stopped (or gone), so nothing they do happens after it returns.
func stopAll(t testing.TB, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && err != syscall.ESRCH {
			t.Fatalf("testenv: SIGSTOP %d: %v", pid, err)
		}
	}
	Until(t, fmt.Sprintf("processes %v stopped", pids), func() (bool, error) {
		for _, pid := range pids {
			if s := procState(pid); s != 'T' && s != 0 && s != 'Z' {
				return false, nil
			}
		}
		return true, nil
	})
}

// continueAll continues pids with SIGCONT (gone ones are skipped).
func continueAll(t testing.TB, pids []int) {
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && err != syscall.ESRCH {
			t.Errorf("testenv: SIGCONT %d: %v", pid, err)
		}
	}
}
