package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Where the server connection does not keep pgx's named prepared
// statements (PgBouncer before 1.21; here the handler's statement
// deallocated), the handler's statement that fails so is learnt from, and
// from then on the handler gets nolock's wrapper of the DB's transaction,
// which sends its statements unnamed: they work.
func TestHandlerStatementsUnnamedOnceLearnt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := testenv.PostgresSchema(t, 1)
	pool := testenv.PoolWith(t, testenv.PostgresDSNFor(t, schema), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1                                                      // one connection; its search_path makes it an endpoint of its own
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement // the mode the fallback is for, whatever the DSN says
	})
	newInbox(t, pool)
	in, err := inbox.New(ownDB{pool}, "billing")
	if err != nil {
		t.Fatal(err)
	}
	var own bool
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, own = tx.(*ownTx)
		return record(ctx, tx, m)
	}
	if _, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0)}, h); err != nil || !own {
		t.Fatalf("first message: %v, the DB's own Tx %v; want nil, true", err, own)
	}
	// The handler's statement is now a named prepared statement on the
	// connection: drop it, as a server connection that never had it.
	var name string
	if err := pool.QueryRow(ctx, `SELECT name FROM pg_prepared_statements WHERE statement LIKE 'INSERT INTO effects%'`,
		pgx.QueryExecModeSimpleProtocol).Scan(&name); err != nil {
		t.Fatalf("the handler's prepared statement: %v", err)
	}
	if _, err := pool.Exec(ctx, `DEALLOCATE `+pgx.Identifier{name}.Sanitize(), pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	_, err = in.Process(ctx, []kafka.Message{msg("b", 0, 1)}, h)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "26000" || !own {
		t.Fatalf("second message: %v (the DB's own Tx %v); want the handler's 26000, prepared statement missing", err, own)
	}
	if _, err := in.Process(ctx, []kafka.Message{msg("b", 0, 1)}, h); err != nil || own {
		t.Fatalf("second message again: %v, the DB's own Tx %v; want nil, nolock's wrapper (statements sent unnamed)", err, own)
	}
	if got := effects(t, pool); got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("effects %v; want a and b once each", got)
	}
}
