package testenv_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
)

// TestChildTicker is the child's body: it prints a tick every 10 ms.
func TestChildTicker(t *testing.T) {
	testenv.ChildOnly(t)
	for i := 0; ; i++ {
		fmt.Println("tick", i)
		time.Sleep(10 * time.Millisecond)
	}
}

// A paused child makes no progress; resumed, it goes on; killed, it exits.
func TestChildPauseResumeKill(t *testing.T) {
	t.Parallel()
	c := testenv.StartChild(t, "TestChildTicker")
	tick := func() int {
		line := c.WaitFor("tick", 30*time.Second)
		n, err := strconv.Atoi(strings.TrimPrefix(line, "tick "))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	tick()
	c.Pause()
	time.Sleep(50 * time.Millisecond) // let ticks in flight land
	before := len(drain(c))
	time.Sleep(300 * time.Millisecond)
	if n := len(drain(c)); n != 0 {
		t.Fatalf("a paused child printed %d ticks (%d before the pause settled)", n, before)
	}
	c.Resume()
	tick()
	c.Kill()
	if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("killed child exited with %v", err)
	}
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
