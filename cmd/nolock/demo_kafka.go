package main

import (
	"context"
	"fmt"

	"github.com/nolock/nolock/examples/kafkaworker"
)

// kafkaWorker runs examples/kafkaworker's story on the demo's services.
func kafkaWorker(ctx context.Context, env *demoEnv) ([]row, error) {
	const payments = 500
	rep, err := kafkaworker.Run(ctx, kafkaworker.Config{Brokers: env.brokers, DSN: env.dsn, Payments: payments, Partitions: 4, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	return []row{{what: "crash before the offset commit (inbox)",
		outcome: fmt.Sprintf("%d messages, %d payments, %d applied before the crash, %d applied, %d rows", rep.Messages, payments, rep.BeforeCrash, rep.Applied, rep.Rows),
		ok:      rep.Applied == payments && rep.Rows == payments}}, nil
}
