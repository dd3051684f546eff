package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/nolock/nolock/internal/errfmt"
)

// Reap deletes this Inbox's consumer's records older than retention (other
// consumers sharing the tables keep theirs), at most batch rows per
// statement, until none is left, and returns how many it deleted. Keep
// retention at least as long as the longest redelivery horizon (the topic's
// retention, or how far back a consumer group can be reset): a record
// reaped earlier lets a redelivered message run again. Attempt counters
// untouched for retention go too.
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
	var total int64
	for {
		tag, err := in.db.Exec(ctx, in.reapSQL, in.over.Args(iv, batch, in.consumer)...)
		if err != nil {
			return total, errfmt.Errorf("inbox: reap: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	if _, err := in.db.Exec(ctx, in.reapAttemptsSQL, in.over.Args(iv, in.consumer)...); err != nil {
		return total, errfmt.Errorf("inbox: reap attempts: %w", err)
	}
	return total, nil
}
