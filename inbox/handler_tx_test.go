package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
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

// The handler receives the transaction the user's DB began, as is: it can
// type-assert the DB's own Tx type.
func TestHandlerGetsTheDBsTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	newInbox(t, pool) // the schema and the effects table
	in, err := inbox.New(ownDB{pool}, "billing")
	if err != nil {
		t.Fatal(err)
	}
	var calls, own int
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		calls++
		if _, ok := tx.(*ownTx); ok {
			own++
		} else {
			t.Errorf("the handler got a %T, not the *ownTx the DB began", tx)
		}
		return record(ctx, tx, m)
	}
	if _, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1)}, h); err != nil {
		t.Fatal(err)
	}
	if calls != 2 || own != 2 {
		t.Fatalf("%d handler calls, %d with the DB's own Tx; want 2, 2", calls, own)
	}
	if got := effects(t, pool); got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("effects %v; want a and b once each", got)
	}
}
