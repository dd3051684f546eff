package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// runHandler runs h on m as the call CallHandle: the observer's Start
// first, whose context h gets, then End with EventHandled or
// EventHandleFailed (a panic of h, which goes on to Process's caller,
// included).
func (in *Inbox) runHandler(ctx context.Context, h Handler, tx pgx.Tx, m kafka.Message) error {
	if in.obs == nil {
		return h(ctx, tx, m)
	}
	key := kafkapark.EventKey(m.Topic, m.Partition, m.Offset)
	ctx, sp := observed.Start(in.obs, ctx, observe.Call{Name: CallHandle, Key: key, Message: kafkapark.Observed(m)})
	start := time.Now()
	defer func() {
		sp.Unwound(observe.Event{Name: EventHandleFailed, Key: key, N: 1, Duration: time.Since(start)})
	}()
	err := h(ctx, tx, m)
	e := observe.Event{Name: EventHandled, Key: key, N: 1, Duration: time.Since(start), Err: err}
	if err != nil {
		e.Name = EventHandleFailed
	}
	sp.End(e)
	return err
}
