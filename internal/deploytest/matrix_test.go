package deploytest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/pgoutcome"
)

// The lost-reply matrix: every public PostgreSQL write (apis) × {direct,
// PgBouncer} × every pgx query mode × {reply lost before the commit, reply
// lost after it}. A subtest per cell, named deployment/api/mode/point.
//
// Before the commit: a write with a COMMIT of its own loses the reply of
// its last statement before COMMIT (the connection is cut, so the
// transaction rolls back); a one-statement write has its connection break
// as the client writes the statement. The caller must get a definite
// failure (not sent or refused: not ErrAmbiguousCommit), and the database
// must hold nothing.
//
// After the commit: the reply reporting the commit (COMMIT's, or the
// one-statement write's) is dropped and the connection cut. The caller
// must get its package's ErrAmbiguousCommit, and the database must hold the
// write.
//
// Either way, no committed write may be reported as a definite failure,
// and no uncommitted one as a success. Then the caller does what the docs
// say (send it again with the same key or condition, or read the state and
// send it again if it did not apply), and the write must hold exactly once.
//
// Behind PgBouncer 1.18 a mode that needs named prepared statements to
// outlive a transaction may fail on its own (26000, 42P05): such a cell is
// skipped naming the error, since it says nothing about classification.
func TestLostReplyMatrix(t *testing.T) {
	t.Parallel()
	// The groups (a deployment and an api, their cells in turn) wait on
	// the network, not the CPU: run several at once, more than -parallel's
	// default of GOMAXPROCS would.
	sem := make(chan struct{}, groupsAtOnce)
	var wg sync.WaitGroup
	for _, dep := range []string{"direct", "pgbouncer"} {
		for _, a := range apis {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				t.Run(dep+"/"+a.name, func(t *testing.T) { lostReplyGroup(t, dep, a) })
			}()
		}
	}
	wg.Wait()
}

// groupsAtOnce bounds the matrix's groups in flight; each holds a few
// server connections and, behind PgBouncer, a PgBouncer process.
const groupsAtOnce = 6

// lostReplyGroup runs a's cells in deployment dep, one after another, on a
// schema of their own.
func lostReplyGroup(t *testing.T, dep string, a api) {
	w := newWire(t, dep)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	if err := a.schema(ctx, w.admin); err != nil {
		t.Fatal(err)
	}
	if a.app {
		w.dsn = testenv.AppRoleDSN(t, w.dsn, w.schema)
	}
	for _, mode := range testenv.QueryExecModes {
		for _, point := range []string{"before", "after"} {
			t.Run(mode.String()+"/"+point, func(t *testing.T) { lostReply(t, w, a, mode, point) })
		}
	}
}

// lostReply runs one cell of the matrix.
func lostReply(t *testing.T, w *wire, a api, mode pgx.QueryExecMode, point string) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	key := mode.String() + "-" + point
	if err := a.seed(ctx, w.admin, key); err != nil {
		t.Fatal(err)
	}
	tag := a.after
	if point == "before" && a.tx {
		tag = a.before
	}
	drops := w.cell(t, tag)
	call := a.open(t, w.pool(t, mode))

	faulted := func() (fired int64, err error) {
		broken, dropped := w.brk.broken.Load(), drops[tag].Dropped()
		switch {
		case point == "before" && !a.tx:
			w.brk.arm(a.before)
		case !a.tx:
			w.armOn(a.before, drops[tag]) // earlier statements may share the tag
		default:
			drops[tag].Arm()
		}
		err = call(ctx, key)
		w.brk.disarm()
		w.trig.Store(nil)
		return drops[tag].Dropped() - dropped + w.brk.broken.Load() - broken, err
	}
	fired, err := faulted()
	if unsupported(err) {
		// Behind PgBouncer in cache_statement mode a statement met a
		// missing prepared statement before the fault: it ran nothing
		// (checked), and the library now sends its statements unnamed, so
		// the cell is run again and must work.
		if n, aerr := a.applied(ctx, w.admin, key); aerr != nil || n != 0 {
			t.Fatalf("refused as a missing prepared statement (%v), yet applied %d (%v)", err, n, aerr)
		}
		t.Logf("first try refused, nothing applied: %v", err)
		if fired, err = faulted(); unsupported(err) {
			t.Fatalf("the mode still fails after the library's fallback: %v", err)
		}
	}
	n, aerr := a.applied(ctx, w.admin, key)
	if aerr != nil {
		t.Fatal(aerr)
	}
	t.Logf("fault fired %d; call: %v (ambiguous %v, pgoutcome %v); applied %d", fired, err, a.ambiguous(err), pgoutcome.Of(err), n)
	switch {
	case fired != 1:
		t.Fatalf("the fault fired %d times, want once (error %v)", fired, err)
	case n > 1:
		t.Fatalf("applied %d times", n)
	case n == 1 && err != nil && !a.ambiguous(err):
		t.Errorf("MISCLASSIFIED: a committed write reported as a definite failure: %v", err)
	case n == 0 && err == nil:
		t.Errorf("MISCLASSIFIED: an uncommitted write reported as a success")
	case point == "before" && (n != 0 || a.ambiguous(err)):
		t.Errorf("reply lost before the commit: %v, applied %d; want a definite failure, nothing applied", err, n)
	case point == "after" && (n != 1 || !a.ambiguous(err)):
		t.Errorf("reply lost after the commit: %v, applied %d; want ErrAmbiguousCommit, applied", err, n)
	}

	if a.rerun || n == 0 {
		again := call(ctx, key)
		if unsupported(again) { // ran nothing, as above: once more, unnamed
			again = call(ctx, key)
		}
		if again != nil && !(n == 1 && a.again != nil && errors.Is(again, a.again)) {
			t.Errorf("the retry: %v", again)
		}
	}
	if n, err := a.applied(ctx, w.admin, key); err != nil || n != 1 {
		t.Errorf("after the retry: applied %d times (%v), want once", n, err)
	}
}

// unsupported reports an error that says the query mode cannot work on
// this connection (a named prepared statement missing, or already there,
// on the server connection a transaction pooler handed out; a bind of
// another client's unnamed statement), not what became of a write.
func unsupported(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "26000", "42P05":
		return true
	case "08P01":
		return strings.Contains(pgErr.Message, "bind message supplies")
	}
	return false
}
