package partition_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// ownDB is a user's DB that hands out transactions of its own type, as a
// DB wrapped for metrics or tracing does.
type ownDB struct{ *pgxpool.Pool }

func (d ownDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &ownTx{Tx: tx}, nil
}

type ownTx struct{ pgx.Tx }

// The Handler receives the transaction the user's DB began, as is: it can
// type-assert the DB's own Tx type.
func TestHandlerGetsTheDBsTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts, per = 2, 30
	b := newBed(t, parts)
	produce(t, b.brokers, b.topic, parts, 0, per)
	var calls, other atomic.Int64
	h := record("a")
	cfg := b.config("a", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		calls.Add(1)
		if _, ok := tx.(*ownTx); !ok {
			other.Add(1)
		}
		return h(ctx, tx, msgs)
	})
	c, err := newConsumer(ownDB{b.pool}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := runMember(t, c, cfg.handler)
	if err := waitRows(ctx, b.pool, parts*per); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := other.Load(); calls.Load() == 0 || n != 0 {
		t.Fatalf("%d of %d handler calls got a transaction other than the *ownTx the DB began", n, calls.Load())
	}
	tl, err := count(ctx, b.pool, parts, per)
	if err != nil || !tl.exact() || tl.rows != parts*per {
		t.Fatalf("results: %v (%v); want %d rows, each offset once, in order", tl, err, parts*per)
	}
}
