package partition

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/parkedhttp"
)

// ParkedHandler serves the group's parked messages as JSON, for
// operators and `nolock parked -service URL`, as inbox.ParkedHandler does
// an inbox's: GET lists a page (ListParked; each message with its epoch),
// POST replay?id=ID replays through h (ReplayParked: the same exactly-once
// path, between the owner's batches), POST purge?id=ID or
// purge?older_than=DUR purges (PurgeParked, PurgeParkedOlderThan), and
// GET consumer describes the consumer as it runs in this process, for
// `nolock doctor -service URL`: {"kind": "partition", "name" and "group"
// (the group), "topics", "isolation_level" ("read_committed", or
// "read_uncommitted" with WithReadUncommitted(true)), "running" (Run has not
// returned), "partitions" (owned now, as Stats)}. Mount
// it in your service behind your own authentication (it has none), e.g.
// mux.Handle("/admin/parked/", partition.ParkedHandler(c, apply)); c need
// not be running, the calls do no Kafka I/O. Failures answer
// {"code", "error"} with 400 (ErrInvalid), 404 (ErrNotParked), 405, 422
// (a *HandlerError: the message stays parked), or 500 (ErrAmbiguousCommit:
// replay again; or another failure). docs/operating.md has the protocol.
// It is safe for concurrent use.
func ParkedHandler(c *Consumer, h Handler) http.Handler {
	return parkedhttp.Handler(parkedhttp.Backend{
		List: func(ctx context.Context, after kafkapark.ID, limit int) ([]parkedhttp.Message, error) {
			ps, err := c.ListParked(ctx, ParkedID(after), limit)
			out := make([]parkedhttp.Message, len(ps))
			for i, p := range ps {
				out[i] = parkedhttp.Summary(p.Msg, p.ParkedAt, p.Attempts, p.Error, "", p.Epoch)
			}
			return out, err
		},
		Replay: func(ctx context.Context, id kafkapark.ID) error { return c.ReplayParked(ctx, ParkedID(id), h) },
		Purge:  func(ctx context.Context, id kafkapark.ID) error { return c.PurgeParked(ctx, ParkedID(id)) },
		PurgeOlder: func(ctx context.Context, d time.Duration) (int64, error) {
			return c.PurgeParkedOlderThan(ctx, d, kafkapark.PurgeBatch)
		},
		Consumer: c.describe,
		Invalid:  ErrInvalid, NotParked: ErrNotParked, Ambiguous: ErrAmbiguousCommit,
		HandlerFailed: func(err error) bool { var he *HandlerError; return errors.As(err, &he) },
	})
}

// describe tells the consumer as it runs in this process, from its
// settings and Stats.
func (c *Consumer) describe() parkedhttp.Consumer {
	return parkedhttp.Consumer{
		Kind: parkedhttp.KindPartition, Name: c.cfg.GroupID, Group: c.cfg.GroupID,
		Topics: slices.Clone(c.cfg.Topics), IsolationLevel: parkedhttp.Isolation(c.cfg.isolation()),
		Running: c.inRun.Load(), Partitions: len(c.Stats()),
	}
}
