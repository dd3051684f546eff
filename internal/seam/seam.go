// Package seam carries hooks that nolock's own command puts into a call's
// context to stage what the public API does not offer, such as a
// partition owner that stalls between reading a batch and writing it.
// Only packages of this module can import it, so its hooks are no part of
// nolock's API; a package's own tests set theirs in export_test.go.
package seam

import (
	"context"

	"github.com/segmentio/kafka-go"
)

type beforeBatchKey struct{}

// WithBeforeBatch returns ctx carrying f for partition.Consumer.Run, given
// that ctx: each worker then calls f with each batch it is about to apply,
// before each attempt's transaction begins and before the attempt's batch
// timeout starts, holding no transaction and no lock. f's context carries
// the worker's partition.Claim (partition.FromContext). Blocking in f
// plays an owner paused between reading a batch and writing it.
func WithBeforeBatch(ctx context.Context, f func(ctx context.Context, msgs []kafka.Message)) context.Context {
	return context.WithValue(ctx, beforeBatchKey{}, f)
}

// BeforeBatch returns the f that ctx carries (see WithBeforeBatch), or nil.
func BeforeBatch(ctx context.Context) func(ctx context.Context, msgs []kafka.Message) {
	f, _ := ctx.Value(beforeBatchKey{}).(func(context.Context, []kafka.Message))
	return f
}
