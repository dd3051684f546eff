package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nolock/nolock/examples/compaction"
	"github.com/nolock/nolock/examples/nightlycron"
)

// pausedHolder runs examples/compaction's story on the demo's services.
func pausedHolder(ctx context.Context, env *demoEnv) ([]row, error) {
	rep, err := compaction.Run(ctx, compaction.Config{DynamoDB: env.dynamo, DSN: env.dsn, Lease: time.Second, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	return []row{
		{what: "baseline: lease only, storage checks nothing",
			outcome: fmt.Sprintf("stale commit (token %d) accepted: manifest lists %s", rep.TokenA, rep.Unchecked),
			ok:      rep.Unchecked == "b-0001"},
		{what: "lease + fencing token checked by the row",
			outcome: fmt.Sprintf("stale commit (token %d) refused; manifest lists %s (token %d)", rep.TokenA, rep.Files, rep.TokenB),
			ok:      rep.Refused && rep.Files == "b-0001" && rep.Fence == rep.TokenB},
	}, nil
}

// cron runs examples/nightlycron's story on the demo's DynamoDB.
func cron(ctx context.Context, env *demoEnv) ([]row, error) {
	const replicas, nights = 6, 5
	rep, err := nightlycron.Run(ctx, nightlycron.Config{DynamoDB: env.dynamo, Replicas: replicas, Nights: nights,
		Lease: 2 * time.Second, Job: 500 * time.Millisecond, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	var runs []int
	once := len(rep.Nights) == nights
	for _, n := range rep.Nights {
		runs = append(runs, n.Runs)
		once = once && n.Runs == 1
	}
	return []row{{what: "six replicas, one lock per date (dynamolock)",
		outcome: fmt.Sprintf("%d nights, report runs per night: %v; %s crashed mid-job, replaced", nights, runs, rep.Crashed),
		ok:      once && rep.Crashed != ""}}, nil
}
