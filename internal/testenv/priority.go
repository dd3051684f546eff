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
// Elsewhere it does nothing. Linux keeps a nice value per thread: every
// thread of each is changed, and threads and processes started later
// inherit it.
func prioritise(pid int) {
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, -10); err != nil {
		return // not permitted (or gone)
	}
	pids := []int{pid}
	for i := 0; i < len(pids); i++ {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pids[i]))
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, -10)
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pids[i], tid))
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					pids = append(pids, c)
				}
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
