package idempotency

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/observe"
)

// Do runs fn at most once per (scope, key): it claims the key, runs fn,
// and stores fn's result with the key, in one transaction (Read Committed;
// on a Store made on a pgx.Tx, a savepoint of the caller's transaction,
// committed by the caller: see DB).
//
//   - A key not used yet (or whose record expired): fn runs; if it
//     succeeds, or fails with an error marked Terminal, its writes and the
//     record commit together and Do returns the result (Replayed false,
//     nil error). Any other error of fn rolls everything back, stores
//     nothing and is returned as is: retrying with the same key is safe.
//   - A key with a live record and the same fingerprint: fn does not run;
//     Do returns the stored result with Replayed set. A replay writes
//     nothing. Read in the claim's transaction, it holds the key's lock
//     until that transaction ends, one round trip later (a duplicate that
//     meets the lock waits, as below); a call that has waited for the
//     key, or of a Store whose recent calls were mostly replays, reads
//     the record first, outside a transaction, and takes no lock. On a
//     server with a synchronous standby it returns once the standby holds
//     the record (a record whose own wait for the standby was cancelled
//     is never acknowledged before).
//   - A key with a live record and another fingerprint: fn does not run;
//     Do returns a *MismatchError holding the stored record (ErrMismatch).
//   - A key claimed by a transaction still running (a concurrent
//     duplicate): Do waits for it, bounded by WithWait and ctx's deadline,
//     holding no connection meanwhile (a call of the same Store waits in
//     the process; another's is polled, with backoff from 2 ms up to 50
//     ms). If it commits, Do replays its result (or reports a mismatch);
//     if it rolls back, Do claims the key and runs fn. If the bound runs
//     out (or ctx ends), Do returns ErrInProgress and nothing ran.
//
// ErrAmbiguousCommit means the connection failed after COMMIT was sent;
// call Do again with the same key to learn the outcome: it replays the
// result if the commit happened and runs fn if it did not. Cancelling ctx
// before the commit rolls back. Once fn has returned, the commit is never
// cancelled: no CancelRequest cuts it short (a cancelled wait for a
// synchronous standby would leave it visible but not replicated). If ctx
// ends while it is in flight, Do stops waiting and returns
// ErrAmbiguousCommit; the commit goes on to its end on the server's terms.
//
// Arguments are checked before any I/O (ErrInvalid): key must be 1 to
// MaxKeyLen bytes, scope at most MaxScopeLen ("" is a scope like any
// other), both UTF-8 without NUL; fingerprint at most MaxFingerprintLen
// bytes (nil equals empty; see Fingerprint); fn not nil.
//
// Do does not promise anything about effects fn makes outside tx, and does
// not detect a fingerprint collision: use a cryptographic hash.
func (s *Store) Do(ctx context.Context, scope, key string, fingerprint []byte, fn Func) (Result, error) {
	ctx, c := idemrecord.Start(s.obs, ctx, CallDo, key)
	defer c.Unwound()
	res, err := s.do(ctx, scope, key, fingerprint, fn)
	s.observe(ctx, &c, key, res, err)
	return res, err
}

func (s *Store) do(ctx context.Context, scope, key string, fingerprint []byte, fn Func) (Result, error) {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return Result{}, err
	}
	if err := idemrecord.ValidRequest(scope, key, fingerprint, fn == nil); err != nil {
		return Result{}, err
	}
	if fingerprint == nil {
		fingerprint = []byte{}
	}
	return s.retried(ctx, &s.doPlan, scope, key, fingerprint, func(ctx context.Context, dup bool) (Result, error) {
		return s.once(ctx, &s.doPlan, dup, scope, key, fingerprint, false, runAndRecord(fn))
	})
}

// once is one attempt of Do, or of Exec: it claims the key in a
// transaction, and finish writes the effect and the record in it and
// commits. A first run costs two round trips besides fn's own statements
// (begin and claim; record and commit), as many as a bare transaction; a
// replay costs two (begin and claim; commit). A call that waited for the
// key (dup) reads the record first, outside a transaction, as retried
// does for every call once most of p's calls were replays: a replay then
// costs that read (and, on a server with a synchronous standby, one more
// round trip to wait for it), and a first run one round trip more.
// bounded (Exec) makes the claim set lock_timeout to the call's wait
// (claimBoundSQL), which finish gets.
func (s *Store) once(ctx context.Context, p *plan, dup bool, scope, key string, fp []byte, bounded bool, finish finisher) (Result, error) {
	if dup {
		if res, done, err := s.replayFirst(ctx, p, scope, key, fp); done {
			return res, err
		}
	}
	h, err := s.acquire(ctx)
	if err != nil {
		return Result{}, err
	}
	// A connection left inside a transaction is closed, not reused. The
	// commit releases it itself: it may outlive this call (see detached).
	defer h.done()

	var wait time.Duration
	claim, args := s.claimSQL, []any{scope, key}
	if bounded {
		var bound any
		wait, bound = s.bound(ctx)
		claim, args = s.claimBoundSQL, append(args, bound)
	}
	tx, f, err := s.claim(ctx, h, claim, args)
	if err != nil {
		return Result{}, err
	}
	live := f.exists && !f.expired
	p.observe(live)
	if live {
		return s.replay(ctx, h, tx, f, fp)
	}
	if f.exists { // an expired record counts as absent: take the key over
		observed.Event(s.obs, ctx, observe.Event{Name: EventExpired, Key: key})
	}
	// The times a record inserted or taken over in tx gets (Do's
	// takeover reads them back).
	rec := Record{Scope: scope, Key: key, Fingerprint: fp, CreatedAt: f.now, ExpiresAt: f.now.Add(s.retention.Truncate(time.Microsecond))}
	if err := finish(ctx, s, h, tx, &rec, f.exists, wait); err != nil {
		return Result{}, err
	}
	return Result{Record: rec}, nil
}

// replayFirst reads the key's record, outside a transaction, before a
// call claims the key: done is true when that answers the call (a live
// record, or a failed read). A live record counts as a replay in p.
func (s *Store) replayFirst(ctx context.Context, p *plan, scope, key string, fp []byte) (res Result, done bool, err error) {
	switch f, err := s.lookup(ctx, scope, key); {
	case err == nil && !f.expired:
		p.observe(true)
		res, err := s.replayFound(ctx, f, fp)
		return res, true, err
	case err != nil && !errors.Is(err, ErrNotFound):
		return Result{}, true, err
	}
	return Result{}, false, nil
}

// finisher writes the effect of a call and its record rec, in tx, the
// key's claimed transaction on h, and commits it through s.commit; or
// rolls it back and says why. takeover says the key's record had expired
// when it was claimed, and is replaced; wait is the lock_timeout the
// claim set (Exec), or 0.
type finisher func(ctx context.Context, s *Store, h *handle, tx pgx.Tx, rec *Record, takeover bool, wait time.Duration) error

// runAndRecord is Do's finisher: fn, then its record inserted with COMMIT.
func runAndRecord(fn Func) finisher {
	return func(ctx context.Context, s *Store, h *handle, tx pgx.Tx, rec *Record, takeover bool, _ time.Duration) error {
		body, terminal, err := runFn(ctx, s.pg, h, tx, rec.Key, fn)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		args := []any{rec.Scope, rec.Key, rec.Fingerprint, terminal, body, s.retention.Microseconds()}
		if takeover {
			b.Queue(s.takeoverSQL, args...).QueryRow(func(row pgx.Row) error {
				return row.Scan(&rec.CreatedAt, &rec.ExpiresAt)
			})
		} else {
			b.Queue(s.recordSQL, args...)
		}
		if err := s.commit(ctx, h, tx, rec.Key, b); err != nil {
			return err
		}
		rec.Body, rec.Terminal = body, terminal
		return nil
	}
}

// replay answers from f, the live record the claim read in tx, and ends
// tx: with a replay of f or a *MismatchError.
//
// On a server with a synchronous standby, tx writes WAL before it
// commits: its COMMIT then returns only once the standby holds all WAL up
// to it, the record's commit included, so a replay never acknowledges a
// record that a failover could lose (one whose own wait for the standby
// was cancelled). Without a synchronous standby it commits nothing, and
// inside the caller's transaction it rolls back to its savepoint, which
// releases the key's lock the claim took.
func (s *Store) replay(ctx context.Context, h *handle, tx pgx.Tx, f found, fp []byte) (Result, error) {
	b := &pgx.Batch{}
	switch {
	case f.standby:
		b.Queue(syncMarkSQL)
	case h.nested(): // keep nothing: the key's lock goes with the savepoint
		b.Queue("rollback to savepoint " + savepoint)
	}
	ending, _ := h.ending()
	b.Queue(ending)
	err := s.detached(ctx, h, func(ctx context.Context) error {
		err := s.pg.SendBatch(ctx, h.conn, b).Close()
		s.pg.Learn(h.conn, err)
		if err != nil || !h.nested() {
			h.rollback(ctx, tx)
		}
		h.saved = false
		return err
	})
	switch {
	case errors.Is(err, pgerr.ErrStoppedWaiting):
		return Result{}, errfmt.Errorf("idempotency: key %q: stopped waiting for its record to reach the synchronous standby; nothing was run: %w", f.Key, err)
	case err != nil:
		return Result{}, errfmt.Errorf("idempotency: replay %q: %w", f.Key, err)
	}
	return replayOf(f.Record, fp)
}

// runFn runs fn in tx, the key's claimed transaction on conn, and returns
// its result and whether fn marked it Terminal, with tx still open and
// healthy. An error of fn not marked Terminal rolls tx back and is
// returned as is; so is a success after a failed statement (as an error).
// A tx that fn ended itself is reported: its effect may have committed
// without the key.
func runFn(ctx context.Context, pg *pgerr.Committer, h *handle, tx pgx.Tx, key string, fn Func) (body []byte, terminal bool, err error) {
	ftx := &fnTx{Tx: tx, pg: pg, closed: new(atomic.Bool)}
	body, ferr := func() ([]byte, error) {
		defer ftx.closed.Store(true)
		return fn(ctx, ftx)
	}()
	terminal = ferr != nil && idemrecord.IsTerminal(ferr)
	if ferr != nil && !terminal {
		h.rollback(ctx, tx)
		return nil, false, ferr
	}
	switch h.conn.PgConn().TxStatus() {
	case 'T':
	case 'E':
		h.rollback(ctx, tx)
		return nil, false, errfmt.Errorf("idempotency: key %q: fn returned success but a statement of its transaction failed; rolled back", key)
	default:
		return nil, false, errfmt.Errorf("idempotency: key %q: fn ended the transaction itself; its effect may have committed without the key", key)
	}
	return body, terminal, nil
}

// commit sends b, the statements that store the key's result in its
// claimed row, and COMMIT (inside the caller's transaction, the release
// of the attempt's savepoint), in one round trip. The commit runs to its
// end on the server's terms even if the caller stops waiting (see
// detached). nil means the effect and the record committed together (or,
// inside the caller's transaction, are kept in it); an error says what it
// proves (see commitError).
func (s *Store) commit(ctx context.Context, h *handle, tx pgx.Tx, key string, b *pgx.Batch) error {
	var tag pgconn.CommandTag
	ending, want := h.ending()
	b.Queue(ending).Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	err := s.detached(ctx, h, func(ctx context.Context) error {
		err := s.pg.SendBatch(ctx, h.conn, b).Close()
		if err != nil {
			s.pg.Learn(h.conn, err)
			h.rollback(ctx, tx) // when the record failed, the COMMIT was skipped
		}
		h.saved = false
		return err
	})
	switch {
	case err != nil && h.nested():
		return errfmt.Errorf("idempotency: key %q: record: %w", key, pgmode.Explain(err))
	case err != nil:
		return commitError(key, err)
	case tag.String() != want:
		return errfmt.Errorf("idempotency: key %q: commit rolled back (%s)", key, tag)
	}
	return nil
}

// claim begins the attempt's transaction on h (inside the caller's
// transaction, a savepoint), tries the key's lock and reads its record, in
// one round trip: claimSQL (or Exec's claimBoundSQL) with args, then
// readSQL. It returns the transaction, open, and the record it read:
// f.exists false, or f.expired, means the key is this transaction's to
// write; a live record is to be replayed (the transaction holds the key's
// lock until it ends). Otherwise the transaction is ended and the error
// says why: errBusy when another transaction holds the key's lock (ended
// with a COMMIT of nothing, which the server does not count as a
// rollback), errResend when the server connection did not keep a named
// prepared statement (see pgmode.Modes.Learn).
func (s *Store) claim(ctx context.Context, h *handle, claimSQL string, args []any) (tx pgx.Tx, f found, err error) {
	scope, key := args[0].(string), args[1].(string)
	opts := pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	b := &pgx.Batch{}
	send := s.pg.SendBatch
	switch {
	case h.nested():
		tx = h.outer
		b.Queue("savepoint " + savepoint)
		h.saved = true
	case s.pg.Unnamed(h.conn): // the begin on its own round trip (see pgmode.Modes.SendBatch)
		if tx, err = h.conn.BeginTx(ctx, opts); err != nil {
			return nil, found{}, claimError(key, err)
		}
	default:
		// The batch begins the transaction, so it goes as one pipeline
		// even if another call learns meanwhile that the endpoint drops
		// named statements: it then fails having run nothing, and is
		// sent again unnamed (errResend).
		b.BeginTx(opts)
		send = func(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) pgx.BatchResults {
			return conn.SendBatch(ctx, b)
		}
	}
	var locked bool
	b.Queue(claimSQL, args...).QueryRow(func(row pgx.Row) error {
		if len(args) > 2 {
			return row.Scan(&locked, &f.now, nil) // and Exec's lock_timeout
		}
		return row.Scan(&locked, &f.now)
	})
	f.Scope, f.Key = scope, key
	b.Queue(s.readSQL, scope, key).QueryRow(func(row pgx.Row) error {
		err := f.scan(row)
		f.exists = err == nil
		return noRows(err)
	})
	br := send(ctx, h.conn, b)
	if tx == nil {
		tx = br.Tx()
	}
	if err := br.Close(); err != nil {
		h.rollback(ctx, tx)
		if s.pg.Learn(h.conn, err) { // nothing ran: claim again, unnamed
			return nil, found{}, errfmt.Errorf("%w: %w", errResend, err)
		}
		return nil, found{}, claimError(key, err)
	}
	if locked {
		return tx, f, nil
	}
	if h.nested() {
		h.rollback(ctx, tx)
	} else {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if cerr := tx.Commit(ctx); cerr != nil {
			end(ctx, h.conn, tx)
		}
	}
	return nil, found{}, errBusy
}

// noRows turns "no row" into nil: a claim that met a row returns none.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// claimError wraps the error of a failed claim. Nothing was committed.
func claimError(key string, err error) error {
	return errfmt.Errorf("idempotency: claim %q: %w", key, pgmode.Explain(err))
}

// commitError classifies a failed record-and-commit round trip by what it
// proves (see pgerr.Of): the connection lost, a timeout, a FATAL such as
// pg_terminate_backend, or the caller no longer waiting may have come after
// the commit: ErrAmbiguousCommit. Anything else rolled the transaction
// back: the server refused a statement (a failed record, a deferred
// constraint, a serialization failure), or nothing was sent.
func commitError(key string, err error) error {
	if !pgerr.Ambiguous(err) {
		return errfmt.Errorf("idempotency: commit %q: rolled back: %w", key, pgmode.Explain(err))
	}
	return errfmt.Errorf("%w: key %q: %w", ErrAmbiguousCommit, key, err)
}
