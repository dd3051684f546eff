package pausedowner_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nolock/nolock/examples/pausedowner"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test services: the paused owner's late
// batch is refused by the epoch fence, and every offset is applied once,
// in order.
func TestRun(t *testing.T) {
	const messages = 120
	var out strings.Builder
	rep, err := pausedowner.Run(context.Background(), pausedowner.Config{
		Brokers: testenv.Kafka(t), DSN: testenv.PostgresFreshDSN(t), Messages: messages, StallAt: 40, Out: &out,
	})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Held(messages) {
		t.Fatalf("report %+v: want %d offsets once each, in order, and the late batch refused by partition.ErrFenced", rep, messages)
	}
}
