package inbox

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/parkedhttp"
)

// ParkedHandler serves in's parked messages as JSON, for operators and
// `nolock parked -service URL`, and describes the consumer for `nolock
// doctor -service URL`: mount it in your service, behind your own
// authentication (it has none), e.g.
// mux.Handle("/admin/parked/", inbox.ParkedHandler(in, handle)). Relative
// to where it is mounted:
//
//	GET  ?after=ID&limit=N      a page of ListParked (limit 1 to 1000, default 100)
//	POST replay?id=ID           ReplayParked(id, h): the same exactly-once path
//	POST purge?id=ID            PurgeParked(id)
//	POST purge?older_than=DUR   PurgeParkedOlderThan(DUR), a Go duration, 1,000 rows a statement
//	GET  consumer               the inbox as Run reads in this process
//
// Each message lists its id, position, parked_at, attempts, error,
// message_id, and the first 256 bytes of its key and of its value (as
// text, bad bytes as U+FFFD) with value_bytes, the value's size. A failure answers
// {"code", "error"}: 400 invalid (ErrInvalid, a bad id or flag), 404
// not_parked (ErrNotParked), 405 a wrong method, 422 handler_failed
// (a *HandlerError: the message stays parked with this error recorded),
// 500 ambiguous_commit (ErrAmbiguousCommit: replay again) or internal.
//
// The consumer call answers {"kind": "inbox", "name", "group", "topics",
// "isolation_level", "running", "partitions"}: the consumer name given to
// New; what Run read from its Reader's Config(): GroupID, topics and
// IsolationLevel, "read_committed" or "read_uncommitted" ("unknown" for a
// Reader without Config, whose aborted transactions Run cannot tell);
// whether Run is running, and how many partitions it has met messages of
// since it began. While no Run runs they are the last Run's; several Runs
// at once are merged, with the least safe isolation level. It is kept in
// memory: no I/O.
//
// Each call runs under the request's context. It is safe for concurrent
// use, as the calls it makes are.
func ParkedHandler(in *Inbox, h Handler) http.Handler {
	return parkedhttp.Handler(parkedhttp.Backend{
		List: func(ctx context.Context, after kafkapark.ID, limit int) ([]parkedhttp.Message, error) {
			ps, err := in.ListParked(ctx, ParkedID(after), limit)
			out := make([]parkedhttp.Message, len(ps))
			for i, p := range ps {
				out[i] = parkedhttp.Summary(p.Msg, p.ParkedAt, p.Attempts, p.Error, p.MessageID, 0)
			}
			return out, err
		},
		Replay: func(ctx context.Context, id kafkapark.ID) error { return in.ReplayParked(ctx, ParkedID(id), h) },
		Purge:  func(ctx context.Context, id kafkapark.ID) error { return in.PurgeParked(ctx, ParkedID(id)) },
		PurgeOlder: func(ctx context.Context, d time.Duration) (int64, error) {
			return in.PurgeParkedOlderThan(ctx, d, kafkapark.PurgeBatch)
		},
		Consumer: in.describe,
		Invalid:  ErrInvalid, NotParked: ErrNotParked, Ambiguous: ErrAmbiguousCommit,
		HandlerFailed: func(err error) bool { var he *HandlerError; return errors.As(err, &he) },
	})
}
