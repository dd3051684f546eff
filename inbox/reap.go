package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkapark"
)

// Reap deletes this Inbox's consumer's records older than retention (other
// consumers sharing the tables keep theirs), at most batch rows per
// statement, until none is left, and returns how many it deleted. Keep
// retention at least as long as the longest redelivery horizon (the topic's
// retention, or how far back a consumer group can be reset): a record
// reaped earlier lets a redelivered message run again. Attempt counters
// untouched for retention go too, in batches as well.
//
// On a pool, each statement is a transaction of its own, so writers never
// wait long behind Reap; rows another transaction holds are skipped, not
// waited for. Cancelling ctx stops it between batches; what was deleted
// stays deleted, and is counted in the total returned with the error.
func (in *Inbox) Reap(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	if err := checkCtx(ctx); err != nil {
		return 0, err
	}
	switch {
	case retention <= 0:
		return 0, invalid("retention %v is not positive", retention)
	case batch < 1:
		return 0, invalid("batch %d is below 1", batch)
	}
	iv := fmt.Sprintf("%d microseconds", retention.Microseconds())
	reap := func(sql string) func() (int64, error) {
		return func() (int64, error) {
			tag, err := in.db.Exec(ctx, sql, in.over.Args(iv, batch, in.consumer)...)
			return tag.RowsAffected(), err
		}
	}
	total, err := kafkapark.Batches(ctx, batch, reap(in.reapSQL))
	if err != nil {
		return total, errfmt.Errorf("inbox: reap: %w", err)
	}
	if _, err := kafkapark.Batches(ctx, batch, reap(in.reapAttemptsSQL)); err != nil {
		return total, errfmt.Errorf("inbox: reap attempts: %w", err)
	}
	return total, nil
}
