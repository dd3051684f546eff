package idempotency

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/nolock/nolock/internal/pgerr"
)

// errTxOwned is what fn gets from tx.Commit and tx.Rollback.
var errTxOwned = errors.New("idempotency: the transaction belongs to Do: return from fn to commit it, or return an error to roll it back")

// fnTx is the transaction fn sees: Do's, begun in the claim's round trip.
// Do commits it together with the record, so fn may not end it, and it
// refuses use once fn has returned (its connection is back in the pool by
// then). Begin still gives savepoints, which fn may commit or roll back,
// refused as well once fn has returned: they share the closed flag. Its
// statements go unnamed to an endpoint that keeps no named prepared
// statements (see internal/pgmode).
type fnTx struct {
	pgx.Tx
	pg        *pgerr.Committer // the Store's: what its statements learn
	closed    *atomic.Bool
	savepoint bool
}

func (t *fnTx) Commit(ctx context.Context) error {
	switch {
	case !t.savepoint:
		return errTxOwned
	case t.closed.Load():
		return pgx.ErrTxClosed
	}
	return t.Tx.Commit(ctx)
}

func (t *fnTx) Rollback(ctx context.Context) error {
	switch {
	case !t.savepoint:
		return errTxOwned
	case t.closed.Load():
		return pgx.ErrTxClosed
	}
	return t.Tx.Rollback(ctx)
}

func (t *fnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &fnTx{Tx: sp, pg: t.pg, closed: t.closed, savepoint: true}, nil
}

func (t *fnTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	tag, err := t.Tx.Exec(ctx, sql, t.pg.ForEach(t.Tx).Args(args...)...)
	t.pg.Learn(t.Tx, err)
	return tag, err
}

func (t *fnTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return closedRows{}, pgx.ErrTxClosed
	}
	rows, err := t.Tx.Query(ctx, sql, t.pg.ForEach(t.Tx).Args(args...)...)
	t.pg.Learn(t.Tx, err)
	return rows, err
}

func (t *fnTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return closedRows{}
	}
	return t.Tx.QueryRow(ctx, sql, t.pg.ForEach(t.Tx).Args(args...)...)
}

func (t *fnTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.pg.SendBatch(ctx, t.Tx.Conn(), b)
}

func (t *fnTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *fnTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// closedRows is the empty result of a query on a closed fnTx.
type closedRows struct{}

func (closedRows) Close()                                       {}
func (closedRows) Err() error                                   { return pgx.ErrTxClosed }
func (closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (closedRows) Next() bool                                   { return false }
func (closedRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (closedRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (closedRows) RawValues() [][]byte                          { return nil }
func (closedRows) Conn() *pgx.Conn                              { return nil }
func (closedRows) TypeMap() *pgtype.Map                         { return nil }

// end rolls back tx unless conn is already outside a transaction.
func end(ctx context.Context, conn *pgx.Conn, tx pgx.Tx) {
	if conn.PgConn().TxStatus() != 'I' {
		rollback(ctx, tx)
	}
}

// rollbackTimeout bounds a rollback, which no caller's ctx cancels.
const rollbackTimeout = 10 * time.Second

// rollback ends tx even when ctx is cancelled. A failure closes the
// connection, which the pool then drops; a closed tx returns ErrTxClosed.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx)
}
