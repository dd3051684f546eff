package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
)

// The example runs end to end on the test services and its own checks
// (which return an error when an invariant breaks) pass, on PostgreSQL
// directly and behind PgBouncer (see testenv.ExampleDeployments).
func TestExample(t *testing.T) {
	for _, d := range testenv.ExampleDeployments() {
		for _, via := range []string{"do", "exec"} {
			t.Run(d.Name+"/"+via, func(t *testing.T) {
				// An attempt cut short closes its connection; behind a
				// pooler each new one costs a login, so there attempts
				// get more room to finish (testenv.Scale: more under
				// -race), or cut attempts feed on each other.
				cut := 5 * time.Millisecond
				if strings.HasPrefix(d.Name, "pgbouncer") {
					cut = testenv.Scale(10 * time.Millisecond)
				}
				if err := run(context.Background(), d.DSN(t), 3, 100, 3, 8, via, cut); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
