package testenv

import (
	"fmt"
	"os"
	"testing"
)

// EnvStress turns the fault trials' stress mode on: NOLOCK_STRESS=1 (see
// scripts/stress).
const EnvStress = "NOLOCK_STRESS"

// Stress reports whether the fault trials run at stress scale.
func Stress() bool { return os.Getenv(EnvStress) == "1" }

// Trials returns how many trials a fault test runs: normal in the default
// suite, stress under NOLOCK_STRESS=1.
func Trials(normal, stress int) int {
	if Stress() {
		return stress
	}
	return normal
}

// Figures logs a fault test's outcome on one line that scripts/stress
// collects into its summary: the pattern and fault, then what was counted,
// e.g. Figures(t, "dynamolock SIGSTOP zombie", "%d trials, %d stale writes
// accepted", n, stale).
func Figures(t testing.TB, trial, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURES %s: %s", trial, fmt.Sprintf(format, args...))
}
