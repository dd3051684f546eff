package testenv_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
)

// TestChildTicker is the child's body: every 10 ms it prints a tick with
// the wall-clock time it printed it at.
func TestChildTicker(t *testing.T) {
	testenv.ChildOnly(t)
	for i := 0; ; i++ {
		fmt.Println("tick", i, time.Now().UnixNano())
		time.Sleep(10 * time.Millisecond)
	}
}

// A paused child makes no progress; resumed, it goes on; killed, it exits.
// No tick is printed after Pause returns, however long the lines take to
// reach the parent.
func TestChildPauseResumeKill(t *testing.T) {
	t.Parallel()
	c := testenv.StartChild(t, "TestChildTicker")
	c.WaitFor("tick", 30*time.Second)
	c.Pause()
	paused := time.Now()
	time.Sleep(300 * time.Millisecond) // 30 ticks' time, paused
	for _, line := range drain(c) {
		var i, at int64
		if _, err := fmt.Sscanf(line, "tick %d %d", &i, &at); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if at > paused.UnixNano() {
			t.Fatalf("tick %d printed %v after Pause returned", i, time.Unix(0, at).Sub(paused))
		}
	}
	c.Resume()
	c.WaitFor("tick", 30*time.Second)
	c.Kill()
	if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("killed child exited with %v", err)
	}
}

// A line printed just before the child exits is found by WaitFor, though the
// exit and the line arrive together.
func TestChildLastLineBeforeExit(t *testing.T) {
	t.Parallel()
	for i := 0; i < 5; i++ {
		c := testenv.StartChild(t, "TestChildPrintsAndExits")
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
		c.WaitFor("last words", time.Second)
	}
}

// TestChildPrintsAndExits is a child's body: one line, then exit.
func TestChildPrintsAndExits(t *testing.T) {
	testenv.ChildOnly(t)
	fmt.Println("last words")
}

// drain returns the ticks printed so far without waiting.
func drain(c *testenv.Child) []string {
	var got []string
	for {
		line, ok := c.TryLine()
		if !ok {
			return got
		}
		got = append(got, line)
	}
}
