package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// prioritise runs the server pid, and the processes it has started so far,
// at nice -10 where this process may raise a priority (root, or
// CAP_SYS_NICE), as scripts/services runs the test bed's services: on a
// busy machine the test binaries wait, not the servers they test.
// Elsewhere it does nothing. Processes the server starts later inherit it.
func prioritise(pid int) {
	pids := []int{pid}
	for i := 0; i < len(pids); i++ {
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, pids[i], -10); err != nil && i == 0 {
			return // not permitted (or gone): leave the rest alone too
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pids[i], pids[i]))
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				pids = append(pids, c)
			}
		}
	}
}

// prioritisePostgres prioritises the PostgreSQL server running on data.
func prioritisePostgres(data string) {
	if pm, _, err := postmaster(data); err == nil {
		prioritise(pm)
	}
}
