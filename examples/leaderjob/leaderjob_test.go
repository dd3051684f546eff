package leaderjob_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/examples/leaderjob"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test database: every page recorded
// once, the frozen leader's late page refused by the fence, and tokens
// growing with each leadership.
func TestRun(t *testing.T) {
	var out strings.Builder
	rep, err := leaderjob.Run(context.Background(), leaderjob.Config{
		DSN: testenv.PostgresFreshDSN(t), Replicas: 3, Pages: 12, Lease: testenv.Scale(time.Second), Out: &out,
	})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Leaders) < 2 {
		t.Fatalf("leaders %v: want a takeover", rep.Leaders)
	}
	for i := 1; i < len(rep.Leaders); i++ {
		if rep.Leaders[i] <= rep.Leaders[i-1] {
			t.Fatalf("leaders' tokens %v do not grow", rep.Leaders)
		}
	}
}
