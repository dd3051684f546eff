package pgmode

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SendBatch sends b on conn as one pipeline, as conn.SendBatch does; but
// a batch takes its connection's mode, so on a cache_statement connection
// to an endpoint m has learnt to drop named statements (see Modes.Learn)
// it sends each queued query on its own round trip, unnamed, and stops at
// the first error. That is the pipeline's outcome only inside a transaction
// (a pipeline outside one commits or rolls back as a whole): so b must not
// begin a transaction itself (pgx.Batch.BeginTx) and, unless conn is in
// one, must hold one statement.
func (m *Modes) SendBatch(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) pgx.BatchResults {
	if !m.Unnamed(conn) {
		return conn.SendBatch(ctx, b)
	}
	return &eachResults{ctx: ctx, conn: conn, queue: b.QueuedQueries}
}

// eachResults are the results of a batch sent one query at a time.
type eachResults struct {
	ctx   context.Context
	conn  *pgx.Conn
	queue []*pgx.QueuedQuery
	err   error // the first error: later queries are not sent
}

// next removes and returns the next query's SQL and arguments (with the
// unnamed mode), or false once the queue is empty or a query has failed.
func (r *eachResults) next() (string, []any, bool) {
	if len(r.queue) == 0 || r.err != nil {
		return "", nil, false
	}
	q := r.queue[0]
	r.queue = r.queue[1:]
	return q.SQL, append([]any{pgx.QueryExecModeCacheDescribe}, q.Arguments...), true
}

func (r *eachResults) Exec() (pgconn.CommandTag, error) {
	sql, args, ok := r.next()
	if !ok {
		return pgconn.CommandTag{}, r.done()
	}
	tag, err := r.conn.Exec(r.ctx, sql, args...)
	r.fail(err)
	return tag, err
}

func (r *eachResults) Query() (pgx.Rows, error) {
	sql, args, ok := r.next()
	if !ok {
		return nil, r.done()
	}
	rows, err := r.conn.Query(r.ctx, sql, args...)
	r.fail(err)
	return rows, err
}

func (r *eachResults) QueryRow() pgx.Row {
	sql, args, ok := r.next()
	if !ok {
		return errRow{r.done()}
	}
	return failingRow{r.conn.QueryRow(r.ctx, sql, args...), r}
}

// Close sends the queries not read yet, calling their callbacks, and
// returns the first error.
func (r *eachResults) Close() error {
	for len(r.queue) > 0 && r.err == nil {
		if fn := r.queue[0].Fn; fn != nil {
			r.fail(fn(r))
		} else {
			_, _ = r.Exec()
		}
	}
	r.queue = nil
	return r.err
}

// Tx is nil: the batch began no transaction.
func (r *eachResults) Tx() pgx.Tx { return nil }

func (r *eachResults) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// done is the error of reading past the queue or past a failed query.
func (r *eachResults) done() error {
	if r.err != nil {
		return r.err
	}
	return errNoMoreResults
}

var errNoMoreResults = errors.New("pgmode: no more results in batch")

// failingRow is a row whose Scan error, other than finding no row, becomes
// the batch's.
type failingRow struct {
	pgx.Row
	r *eachResults
}

func (f failingRow) Scan(dest ...any) error {
	err := f.Row.Scan(dest...)
	if !errors.Is(err, pgx.ErrNoRows) {
		f.r.fail(err)
	}
	return err
}

type errRow struct{ err error }

func (e errRow) Scan(...any) error { return e.err }
