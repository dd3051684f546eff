package main

import (
	"context"
	"fmt"

	"github.com/nolock/nolock/examples/pausedowner"
)

// zombie runs examples/pausedowner's story on the demo's services.
func zombie(ctx context.Context, env *demoEnv) ([]row, error) {
	const messages = 300
	rep, err := pausedowner.Run(ctx, pausedowner.Config{Brokers: env.brokers, DSN: env.dsn, Messages: messages, StallAt: 100, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	refusal := "refused by partition.ErrFenced"
	if !rep.ByFence {
		refusal = "NOT refused by the fence"
	}
	return []row{{what: "paused ex-owner of a partition (epoch fence)",
		outcome: fmt.Sprintf("%d offsets, %d rows, %d in order; the ex-owner's late rows: %d, its late batch %s", rep.Distinct, rep.Rows, rep.InOrder, rep.Late, refusal),
		ok:      rep.Held(messages)}}, nil
}
