package lease_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// Test settings, stretched by testenv.Scale (4x under -race, more on a
// machine marked slow), so the tests check the algorithm rather than the
// machine's speed.
var (
	testLease = testenv.Scale(600 * time.Millisecond).Round(time.Millisecond)
	testPoll  = testenv.Scale(20 * time.Millisecond)
)

// newClient returns a Client on db with the test defaults (lease
// testLease, poll testPoll) before opts, its table created, closed when
// the test ends.
func newClient(t testing.TB, db lease.DB, opts ...lease.Option) *lease.Client {
	t.Helper()
	base := []lease.Option{lease.WithLease(testLease), lease.WithPoll(testPoll)}
	c, err := lease.New(db, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	if err := c.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustAcquire(t testing.TB, c *lease.Client, key string, opts ...lease.AcquireOption) *lease.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("acquire %q: %v", key, err)
	}
	return l
}

// leaseRow is a lock row as a test reads it, with the database's clock.
type leaseRow struct {
	Owner     string
	Token     int64
	Released  bool
	ExpiresAt time.Time
	Now       time.Time
}

func readRow(t testing.TB, db lease.DB, key string) leaseRow {
	t.Helper()
	var r leaseRow
	err := db.QueryRow(context.Background(), `SELECT owner, token, released, expires_at, clock_timestamp()
FROM nolock_lease WHERE key = $1`, key).Scan(&r.Owner, &r.Token, &r.Released, &r.ExpiresAt, &r.Now)
	if err != nil {
		t.Fatalf("read row %q: %v", key, err)
	}
	return r
}

// unanswered reports whether err is a lock's expiry with a renewal
// unanswered within the lease: the loss a server too busy to answer
// causes, which breaks a test's precondition, not the lock's promise.
func unanswered(err error) bool {
	var lost *lease.LostError
	return errors.As(err, &lost) && lost.Cause == lease.Expired && errors.Is(err, context.DeadlineExceeded)
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// kind names a Client statement by its text.
func kind(sql string) string {
	switch {
	case strings.Contains(sql, "WITH won"), strings.HasPrefix(sql, "INSERT"):
		return "acquire"
	case strings.Contains(sql, "SET expires_at"):
		return "renew"
	case strings.Contains(sql, "nonce = ANY"):
		return "cleanup"
	case strings.Contains(sql, "SET released"):
		return "release"
	case strings.HasPrefix(sql, "SELECT token"):
		return "read"
	}
	return "other"
}

// faultDB wraps a DB: it counts statements by kind, and can turn the
// answer of a statement that ran into a lost one (lose), or refuse to
// send one at all (block), per kind.
type faultDB struct {
	lease.DB
	mu     sync.Mutex
	counts map[string]int
	lose   map[string]int  // kind → how many more answers to lose
	block  map[string]bool // kind → fail before sending
}

func newFaultDB(db lease.DB) *faultDB {
	return &faultDB{DB: db, counts: map[string]int{}, lose: map[string]int{}, block: map[string]bool{}}
}

// errLostAnswer is what a lost answer looks like to pgerr: the connection
// broke after the statement was sent (outcome unknown).
var errLostAnswer = &pgconn.PgError{Severity: "FATAL", Code: "08006", Message: "test: answer lost"}

// errNotSent is a refusal before the statement was sent.
var errNotSent = &pgconn.PgError{Severity: "ERROR", Code: "53300", Message: "test: too many connections"}

func (f *faultDB) before(sql string) (lose bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := kind(sql)
	f.counts[k]++
	if f.block[k] {
		return false, errNotSent
	}
	if f.lose[k] > 0 {
		f.lose[k]--
		return true, nil
	}
	return false, nil
}

func (f *faultDB) set(fn func(f *faultDB)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *faultDB) count(k string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[k]
}

func (f *faultDB) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.counts {
		n += c
	}
	return n
}

func (f *faultDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	lose, err := f.before(sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := f.DB.Exec(ctx, sql, args...)
	if lose && err == nil {
		return pgconn.CommandTag{}, errLostAnswer
	}
	return tag, err
}

func (f *faultDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	lose, err := f.before(sql)
	if err != nil {
		return errRow{err}
	}
	return lossyRow{f.DB.QueryRow(ctx, sql, args...), lose}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type lossyRow struct {
	pgx.Row
	lose bool
}

func (r lossyRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if r.lose && err == nil {
		return errLostAnswer
	}
	return err
}
