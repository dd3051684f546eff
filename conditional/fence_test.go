package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// newDocuments creates the caller's own table, with row 1 at fence 0, and
// a Fenced for it.
func newDocuments(t *testing.T, db conditional.DB) *conditional.Fenced {
	t.Helper()
	_, err := db.Exec(context.Background(), `CREATE TABLE documents (
    id    int    PRIMARY KEY,
    body  text   NOT NULL,
    note  text,
    fence bigint NOT NULL DEFAULT 0);
INSERT INTO documents (id, body) VALUES (1, 'v0')`)
	if err != nil {
		t.Fatal(err)
	}
	f, err := conditional.NewFenced("documents", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

type document struct {
	Body  string
	Note  *string
	Fence int64
}

func readDocument(t *testing.T, db conditional.DB, id int) document {
	t.Helper()
	var d document
	if err := db.QueryRow(context.Background(), "SELECT body, note, fence FROM documents WHERE id = $1", id).Scan(&d.Body, &d.Note, &d.Fence); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestFencedUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	f := newDocuments(t, pool)
	check := func(what string, body string, fence int64) {
		t.Helper()
		if d := readDocument(t, pool, 1); d.Body != body || d.Fence != fence {
			t.Fatalf("%s: row %q at fence %d, want %q at %d", what, d.Body, d.Fence, body, fence)
		}
	}

	// Equal tokens pass: one holder writes many times.
	for i, body := range []string{"a", "b"} {
		if err := f.Update(ctx, pool, 1, 5, map[string]any{"body": body}); err != nil {
			t.Fatalf("write #%d with token 5: %v", i+1, err)
		}
	}
	check("two writes with token 5", "b", 5)

	if err := f.Update(ctx, pool, 1, 7, map[string]any{"body": "c", "note": "by 7"}); err != nil {
		t.Fatalf("higher token: %v", err)
	}
	check("token 7", "c", 7)
	if d := readDocument(t, pool, 1); d.Note == nil || *d.Note != "by 7" {
		t.Fatalf("note %v, want \"by 7\"", d.Note)
	}

	err := f.Update(ctx, pool, 1, 6, map[string]any{"body": "stale", "note": nil})
	if !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("lower token: %v, want ErrFenced", err)
	}
	check("refused token 6", "c", 7)
	if d := readDocument(t, pool, 1); d.Note == nil || *d.Note != "by 7" {
		t.Fatalf("the fenced write changed note: %v", d.Note)
	}

	// An empty set only advances the fence.
	if err := f.Update(ctx, pool, 1, 9, nil); err != nil {
		t.Fatalf("fence-only update: %v", err)
	}
	check("fence-only token 9", "c", 9)
	if err := f.Update(ctx, pool, 1, 8, map[string]any{"body": "stale"}); !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("token 8 after the fence moved to 9: %v, want ErrFenced", err)
	}
	check("refused token 8", "c", 9)
	if err := f.Update(ctx, pool, 1, math.MaxInt64, map[string]any{"body": "max"}); err != nil {
		t.Fatalf("the largest token: %v", err)
	}
	check("token MaxInt64", "max", math.MaxInt64)

	if err := f.Update(ctx, pool, 99, 100, map[string]any{"body": "x"}); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("unknown key: %v, want ErrNotFound", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM documents").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v), want 1: Update must not create rows", n, err)
	}
}

// A NULL fence has never been fenced: any token passes, then fences.
// Keys of any type go as parameters; names that need quoting are quoted.
func TestFencedNullFenceAndQuotedNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE "Legacy Docs" ("doc key" text PRIMARY KEY, "Body" text, "epoch" int);
INSERT INTO "Legacy Docs" VALUES ('k''1', 'old', NULL)`); err != nil {
		t.Fatal(err)
	}
	f, err := conditional.NewFenced("Legacy Docs", "doc key", "epoch")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, pool, "k'1", 3, map[string]any{"Body": "by 3"}); err != nil {
		t.Fatalf("token 3 on a NULL fence: %v", err)
	}
	if err := f.Update(ctx, pool, "k'1", 2, map[string]any{"Body": "by 2"}); !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("token 2 after 3: %v, want ErrFenced", err)
	}
	var body string
	var epoch int
	if err := pool.QueryRow(ctx, `SELECT "Body", epoch FROM "Legacy Docs"`).Scan(&body, &epoch); err != nil || body != "by 3" || epoch != 3 {
		t.Fatalf("row %q at %d (%v), want \"by 3\" at 3", body, epoch, err)
	}
}

func TestFencedBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	f := newDocuments(t, pool)
	if err := f.Update(ctx, pool, 1, 5, map[string]any{"body": "ok"}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("c", 64)
	for _, tc := range []struct {
		name, want string
		op         func() error
	}{
		{"empty table", "table is empty", func() error { _, err := conditional.NewFenced("", "id", "fence"); return err }},
		{"empty key column", "key column is empty", func() error { _, err := conditional.NewFenced("documents", "", "fence"); return err }},
		{"empty fence column", "fence column is empty", func() error { _, err := conditional.NewFenced("documents", "id", ""); return err }},
		{"long table", "table is 64 bytes", func() error { _, err := conditional.NewFenced(long, "id", "fence"); return err }},
		{"NUL column", "key column contains a NUL", func() error { _, err := conditional.NewFenced("documents", "i\x00d", "fence"); return err }},
		{"same columns", `both "id"`, func() error { _, err := conditional.NewFenced("documents", "id", "id"); return err }},
		{"negative token", "token -1 is negative", func() error { return f.Update(ctx, pool, 1, -1, map[string]any{"body": "x"}) }},
		{"nil key", "key is nil", func() error { return f.Update(ctx, pool, nil, 6, map[string]any{"body": "x"}) }},
		{"nil db", "db is nil", func() error { return f.Update(ctx, nil, 1, 6, map[string]any{"body": "x"}) }},
		{"empty set column", "set column is empty", func() error { return f.Update(ctx, pool, 1, 6, map[string]any{"body": "x", "": 1}) }},
		{"long set column", "set column is 64 bytes", func() error { return f.Update(ctx, pool, 1, 6, map[string]any{long: 1}) }},
		{"set fence column", `fence column "fence"`, func() error { return f.Update(ctx, pool, 1, 6, map[string]any{"fence": 100}) }},
		{"set key column", `key column "id"`, func() error { return f.Update(ctx, pool, 1, 6, map[string]any{"id": 2}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if d := readDocument(t, pool, 1); d.Body != "ok" || d.Fence != 5 {
		t.Fatalf("bad input changed the row: %+v", d)
	}
}

// 32 writers with distinct tokens race on one row, each in its own
// transaction that also appends its token to a log. The writes that apply
// carry non-decreasing tokens in the order they applied, the highest token
// always applies, and the row ends with its token and value.
func TestFencedConcurrentTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	f := newDocuments(t, pool)
	if _, err := pool.Exec(ctx, "CREATE TABLE writes (seq bigserial PRIMARY KEY, token bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const rounds, writers = 10, 32
	var applied, fenced int64
	for round := 0; round < rounds; round++ {
		base := int64(round * 1000)
		tokens := rand.Perm(writers)
		start := make(chan struct{})
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for _, i := range tokens {
			token := base + int64(i) + 1
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := f.Update(ctx, tx, 1, token, map[string]any{"body": fmt.Sprintf("w%d", token)}); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, "INSERT INTO writes (token) VALUES ($1)", token)
					return err
				})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, conditional.ErrFenced):
					refused.Add(1)
				default:
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		if ok.Load()+refused.Load() != writers || ok.Load() == 0 {
			t.Fatalf("round %d: %d applied, %d fenced; want %d in all", round, ok.Load(), refused.Load(), writers)
		}
		top := base + writers
		if d := readDocument(t, pool, 1); d.Fence != top || d.Body != fmt.Sprintf("w%d", top) {
			t.Fatalf("round %d: row %q at fence %d, want w%d at %d", round, d.Body, d.Fence, top, top)
		}
		applied += ok.Load()
		fenced += refused.Load()
	}
	rows, err := pool.Query(ctx, "SELECT token FROM writes ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	log, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(log)) != applied || !slices.IsSorted(log) {
		t.Fatalf("log of %d writes (%d applied), in order %v: want every applied write, tokens non-decreasing", len(log), applied, log)
	}
	t.Logf("%d applied, %d fenced", applied, fenced)
}

// Holder A (token 33) reads, then pauses; B (token 34), the newer holder,
// writes; A wakes and writes: refused, and the row shows B's write.
func TestFencedPausedHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	f := newDocuments(t, pool)
	if err := f.Update(ctx, pool, 1, 32, map[string]any{"body": "by 32"}); err != nil {
		t.Fatal(err)
	}

	paused, read := make(chan struct{}), make(chan struct{})
	wake := sync.OnceFunc(func() { close(paused) })
	defer wake()
	resultA := make(chan error, 1)
	go func() {
		defer close(read)
		var fence int64
		if err := pool.QueryRow(ctx, "SELECT fence FROM documents WHERE id = 1").Scan(&fence); err != nil || fence != 32 {
			resultA <- fmt.Errorf("A read fence %d (%v) before pausing, want 32", fence, err)
			return
		}
		read <- struct{}{}
		<-paused // a GC pause, a stopped VM: A's lease ends meanwhile
		resultA <- f.Update(ctx, pool, 1, 33, map[string]any{"body": "by A", "note": "A woke up"})
	}()

	if _, ok := <-read; !ok {
		t.Fatal(<-resultA)
	}
	if err := f.Update(ctx, pool, 1, 34, map[string]any{"body": "by B"}); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	wake()
	if err := <-resultA; !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("A's write after waking: %v, want ErrFenced", err)
	}
	if d := readDocument(t, pool, 1); d.Body != "by B" || d.Fence != 34 || d.Note != nil {
		t.Fatalf("row %+v, want B's write at fence 34", d)
	}
}

// In a caller's transaction the fence commits or rolls back with the
// caller's writes; a concurrent writer waits for it, then is judged
// against what committed.
func TestFencedInCallerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	f := newDocuments(t, pool)

	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) // after a failure; a no-op once it ended
		if err := f.Update(ctx, tx, 1, 33, map[string]any{"body": "by 33"}); err != nil {
			t.Fatal(err)
		}
		// Token 32 waits for the row lock, then meets the outcome.
		waiter := make(chan error, 1)
		go func() { waiter <- f.Update(ctx, pool, 1, 32, map[string]any{"body": "by 32"}) }()
		testenv.WaitLockWaiters(t, pool, 1)
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		err = <-waiter
		d := readDocument(t, pool, 1)
		switch {
		case !commit && (err != nil || d.Body != "by 32" || d.Fence != 32):
			t.Fatalf("after a rollback of 33: token 32 got %v, row %+v; want it applied", err, d)
		case commit && (!errors.Is(err, conditional.ErrFenced) || d.Body != "by 33" || d.Fence != 33):
			t.Fatalf("after a commit of 33: token 32 got %v, row %+v; want ErrFenced, 33's write", err, d)
		}
	}
}
