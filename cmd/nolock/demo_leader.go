package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nolock/nolock/examples/leaderjob"
)

// leaderJob runs examples/leaderjob's story on the demo's database.
func leaderJob(ctx context.Context, env *demoEnv) ([]row, error) {
	const replicas, pages = 3, 30
	rep, err := leaderjob.Run(ctx, leaderjob.Config{DSN: env.dsn, Replicas: replicas, Pages: pages, Lease: time.Second, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	return []row{{what: "three replicas, one lease on PostgreSQL (lease), writes fenced by its token",
		outcome: fmt.Sprintf("%d of %d pages sent once; leaders' tokens %v; late writes refused: %d", rep.Pages, pages, rep.Leaders, rep.Refused),
		ok:      rep.Pages == pages && rep.Duplicates == 0 && rep.Refused == 1}}, nil
}
