package nightlycron_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/examples/nightlycron"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test DynamoDB: every night's report
// is written once, by another replica than the one that crashed on the
// second night.
func TestRun(t *testing.T) {
	var out strings.Builder
	rep, err := nightlycron.Run(context.Background(), nightlycron.Config{
		DynamoDB: testenv.DynamoDB(t), Replicas: 6, Nights: 3, Lease: 2 * time.Second, Job: 500 * time.Millisecond, Out: &out,
	})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Nights) != 3 || rep.Crashed == "" || rep.Nights[1].WrittenBy == rep.Crashed {
		t.Fatalf("report %+v: want 3 nights and night 2 written by another replica than the one that crashed", rep)
	}
}
