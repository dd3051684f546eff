package deploytest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
)

// api is one public PostgreSQL write as the matrix drives it, on a key of
// the cell's own.
type api struct {
	name string
	amb  error // the package's ErrAmbiguousCommit
	// tx says the write commits with a COMMIT of its own; before is then
	// the tag of the statement whose reply is dropped before COMMIT is
	// sent. Otherwise the write is one statement that commits on its own,
	// and before is a piece of its text: the client's connection breaks
	// as it writes it.
	tx     bool
	before string
	after  string // the tag of the reply that reports the commit
	// schema makes the group's tables; seed makes key's rows.
	schema func(ctx context.Context, admin *pgxpool.Pool) error
	seed   func(ctx context.Context, admin *pgxpool.Pool, key string) error
	// open returns the write on db.
	open func(t *testing.T, db *pgxpool.Pool) func(ctx context.Context, key string) error
	// applied counts how many times key's write took effect.
	applied func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error)
	// rerun says the write may be sent again after any failure (its key or
	// condition makes it idempotent); otherwise the caller reads the state
	// and sends it again only if it did not apply. again, if set, is what
	// a rerun of an applied write may answer instead of nil.
	rerun bool
	again error
	// app says the write runs as a role that may not create objects in
	// the schema (testenv.AppRoleDSN), not as the schema's owner.
	app bool
}

func exec(ctx context.Context, db *pgxpool.Pool, sql string, args ...any) error {
	_, err := db.Exec(ctx, sql, args...)
	return err
}

func count(ctx context.Context, db *pgxpool.Pool, sql string, args ...any) (int, error) {
	var n int
	err := db.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// must returns v, or ends the test on err.
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// stock makes the Stock's (or Accounts') table through a throwaway Stock.
func stockSchema(opts ...conditional.Option) func(context.Context, *pgxpool.Pool) error {
	return func(ctx context.Context, admin *pgxpool.Pool) error {
		s, err := conditional.NewStock(admin, opts...)
		if err != nil {
			return err
		}
		defer s.Close()
		return s.CreateSchema(ctx)
	}
}

func accountsSchema(ctx context.Context, admin *pgxpool.Pool) error {
	a, err := conditional.NewAccounts(admin)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.CreateSchema(ctx)
}

func accountSeed(ctx context.Context, admin *pgxpool.Pool, key string) error {
	return exec(ctx, admin, `INSERT INTO nolock_accounts (key, bucket, balance) VALUES ($1, 0, 100)`, key)
}

func holdsSchema(ctx context.Context, admin *pgxpool.Pool) error {
	h, err := conditional.NewHolds(admin)
	if err != nil {
		return err
	}
	return h.CreateSchema(ctx)
}

func casSchema(ctx context.Context, admin *pgxpool.Pool) error {
	b, err := pgcas.NewBackend(admin)
	if err != nil {
		return err
	}
	return b.CreateSchema(ctx)
}

func casStore(t *testing.T, db *pgxpool.Pool) *cas.Store[int] {
	b := must(pgcas.NewBackend(db))(t)
	s := must(cas.NewStore(b, cas.JSON[int]{}))(t)
	t.Cleanup(func() { s.Close() })
	return s
}

func walletSchema(ctx context.Context, admin *pgxpool.Pool) error {
	s, err := idempotency.New(admin)
	if err != nil {
		return err
	}
	if err := s.CreateSchema(ctx); err != nil {
		return err
	}
	return exec(ctx, admin, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))`)
}

func walletSeed(ctx context.Context, admin *pgxpool.Pool, key string) error {
	return exec(ctx, admin, `INSERT INTO wallets VALUES ($1, 100)`, key)
}

func walletPaid(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
	return count(ctx, admin, `SELECT (100 - balance) / 5 FROM wallets WHERE account = $1`, key)
}

func holdSeed(state string) func(context.Context, *pgxpool.Pool, string) error {
	return func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		if state == "free" {
			return exec(ctx, admin, `INSERT INTO nolock_holds (resource) VALUES ($1)`, key)
		}
		return exec(ctx, admin, `INSERT INTO nolock_holds (resource, state, holder, hold_until) VALUES ($1, 'held', 'h1', now() + interval '1 hour')`, key)
	}
}

func holdState(state string) func(context.Context, *pgxpool.Pool, string) (int, error) {
	return func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT count(*) FROM nolock_holds WHERE resource = $1 AND state = $2`, key, state)
	}
}

const fp = "fingerprint"

// apis lists every public PostgreSQL write.
var apis = []api{{
	name: "Stock.Take", amb: conditional.ErrAmbiguousCommit,
	before: `"qty" = "qty" -`, after: "UPDATE 1",
	schema: stockSchema(),
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO nolock_stock (key, bucket, qty) VALUES ($1, 0, 10)`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := must(conditional.NewStock(db))(t)
		t.Cleanup(func() { s.Close() })
		return func(ctx context.Context, key string) error { return s.Take(ctx, key, 1) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT 10 - sum(qty) FROM nolock_stock WHERE key = $1`, key)
	},
}, {
	// Two buckets of one unit each and a take of two: the take goes across
	// the buckets, in a transaction.
	name: "Stock.Take2buckets", amb: conditional.ErrAmbiguousCommit,
	tx: true, before: "UPDATE 2", after: "COMMIT",
	schema: stockSchema(),
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO nolock_stock (key, bucket, qty) VALUES ($1, 0, 1), ($1, 1, 1)`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := must(conditional.NewStock(db, conditional.WithBuckets(2)))(t)
		t.Cleanup(func() { s.Close() })
		return func(ctx context.Context, key string) error { return s.Take(ctx, key, 2) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT (2 - sum(qty)) / 2 FROM nolock_stock WHERE key = $1`, key)
	},
}, {
	name: "Stock.Put", amb: conditional.ErrAmbiguousCommit,
	before: `DO UPDATE SET`, after: "INSERT 0 1",
	schema: stockSchema(),
	seed:   func(context.Context, *pgxpool.Pool, string) error { return nil },
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := must(conditional.NewStock(db))(t)
		t.Cleanup(func() { s.Close() })
		return func(ctx context.Context, key string) error { return s.Put(ctx, key, 5) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT coalesce(sum(qty), 0) / 5 FROM nolock_stock WHERE key = $1`, key)
	},
}, {
	name: "Accounts.Debit", amb: conditional.ErrAmbiguousCommit,
	before: `"balance" = "balance" -`, after: "UPDATE 1",
	schema: accountsSchema, seed: accountSeed,
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		a := must(conditional.NewAccounts(db))(t)
		t.Cleanup(func() { a.Close() })
		return func(ctx context.Context, key string) error { return a.Debit(ctx, key, 7) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT (100 - sum(balance)) / 7 FROM nolock_accounts WHERE key = $1`, key)
	},
}, {
	name: "Accounts.Credit", amb: conditional.ErrAmbiguousCommit,
	before: `"balance" = "balance" +`, after: "UPDATE 1",
	schema: accountsSchema, seed: accountSeed,
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		a := must(conditional.NewAccounts(db))(t)
		t.Cleanup(func() { a.Close() })
		return func(ctx context.Context, key string) error { return a.Credit(ctx, key, 5) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT (sum(balance) - 100) / 5 FROM nolock_accounts WHERE key = $1`, key)
	},
}, {
	name: "Accounts.Open", amb: conditional.ErrAmbiguousCommit,
	before: `WITH first AS`, after: "INSERT 0 0",
	schema: accountsSchema,
	seed:   func(context.Context, *pgxpool.Pool, string) error { return nil },
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		a := must(conditional.NewAccounts(db))(t)
		t.Cleanup(func() { a.Close() })
		return func(ctx context.Context, key string) error { return a.Open(ctx, key, 100) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT count(*) FROM nolock_accounts WHERE key = $1`, key)
	},
	rerun: true,
}, {
	name: "Holds.Add", amb: conditional.ErrAmbiguousCommit,
	before: `unnest(`, after: "INSERT 0 1",
	schema: holdsSchema,
	seed:   func(context.Context, *pgxpool.Pool, string) error { return nil },
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		h := must(conditional.NewHolds(db))(t)
		return func(ctx context.Context, key string) error { return h.Add(ctx, key) }
	},
	applied: holdState("free"),
	rerun:   true,
}, {
	name: "Holds.Hold", amb: conditional.ErrAmbiguousCommit,
	before: `SET state = 'held'`, after: "SELECT 1",
	schema: holdsSchema, seed: holdSeed("free"),
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		h := must(conditional.NewHolds(db))(t)
		return func(ctx context.Context, key string) error { _, err := h.Hold(ctx, key, "h1", time.Hour); return err }
	},
	applied: holdState("held"),
	rerun:   true,
}, {
	name: "Holds.HoldAll", amb: conditional.ErrAmbiguousCommit,
	tx: true, before: "UPDATE 2", after: "COMMIT",
	schema: holdsSchema,
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO nolock_holds (resource) VALUES ($1 || '/a'), ($1 || '/b')`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		h := must(conditional.NewHolds(db))(t)
		return func(ctx context.Context, key string) error {
			_, err := h.HoldAll(ctx, []string{key + "/a", key + "/b"}, "h1", time.Hour)
			return err
		}
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT count(*) / 2 FROM nolock_holds WHERE resource LIKE $1 || '/%' AND state = 'held'`, key)
	},
	rerun: true,
}, {
	name: "Holds.Confirm", amb: conditional.ErrAmbiguousCommit,
	before: `SET state = 'confirmed'`, after: "SELECT 1",
	schema: holdsSchema, seed: holdSeed("held"),
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		h := must(conditional.NewHolds(db))(t)
		return func(ctx context.Context, key string) error { return h.Confirm(ctx, key, "h1") }
	},
	applied: holdState("confirmed"),
	rerun:   true,
}, {
	name: "Holds.Release", amb: conditional.ErrAmbiguousCommit,
	before: `SET state = 'free'`, after: "SELECT 1",
	schema: holdsSchema, seed: holdSeed("held"),
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		h := must(conditional.NewHolds(db))(t)
		return func(ctx context.Context, key string) error { return h.Release(ctx, key, "h1") }
	},
	applied: holdState("free"),
	rerun:   true, again: conditional.ErrNotHolder,
}, {
	name: "Fenced.Update", amb: conditional.ErrAmbiguousCommit,
	before: `IS NULL OR`, after: "SELECT 1",
	schema: func(ctx context.Context, admin *pgxpool.Pool) error {
		return exec(ctx, admin, `CREATE TABLE fenced (k text PRIMARY KEY, fence bigint, v int NOT NULL)`)
	},
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO fenced VALUES ($1, 1, 0)`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		f := must(conditional.NewFenced("fenced", "k", "fence"))(t)
		return func(ctx context.Context, key string) error {
			return f.Update(ctx, db, key, 2, map[string]any{"v": 42})
		}
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT count(*) FROM fenced WHERE k = $1 AND fence = 2 AND v = 42`, key)
	},
	rerun: true,
}, {
	name: "cas.Store.Update", amb: cas.ErrAmbiguousCommit,
	before: `upd AS (UPDATE`, after: "SELECT 1",
	schema: casSchema,
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO nolock_cas (key, version, value) VALUES ($1, 1, '0')`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := casStore(t, db)
		return func(ctx context.Context, key string) error {
			_, err := s.Update(ctx, key, func(n int) (int, error) { return n + 1, nil })
			return err
		}
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT convert_from(value, 'UTF8')::int FROM nolock_cas WHERE key = $1`, key)
	},
}, {
	name: "cas.Store.Create", amb: cas.ErrAmbiguousCommit,
	before: `(key, version, value)`, after: "INSERT 0 1",
	schema: casSchema,
	seed:   func(context.Context, *pgxpool.Pool, string) error { return nil },
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := casStore(t, db)
		return func(ctx context.Context, key string) error { return s.Create(ctx, key, 1) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT count(*) FROM nolock_cas WHERE key = $1`, key)
	},
	rerun: true, again: cas.ErrExists,
}, {
	name: "cas.Store.Delete", amb: cas.ErrAmbiguousCommit,
	before: `del AS (DELETE`, after: "SELECT 1",
	schema: casSchema,
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO nolock_cas (key, version, value) VALUES ($1, 1, '0')`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := casStore(t, db)
		return func(ctx context.Context, key string) error { return s.Delete(ctx, key, 1) }
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT 1 - count(*) FROM nolock_cas WHERE key = $1`, key)
	},
	rerun: true, again: cas.ErrNotFound,
}, {
	name: "pgcas.Retry", amb: cas.ErrAmbiguousCommit,
	tx: true, before: "UPDATE 1", after: "COMMIT",
	schema: func(ctx context.Context, admin *pgxpool.Pool) error {
		return exec(ctx, admin, `CREATE TABLE docs (id text PRIMARY KEY, n int NOT NULL, version bigint NOT NULL)`)
	},
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO docs VALUES ($1, 0, 1)`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		return func(ctx context.Context, key string) error {
			return pgcas.Retry(ctx, db, func(ctx context.Context, tx pgx.Tx) error {
				var ver int64
				if err := tx.QueryRow(ctx, `SELECT version FROM docs WHERE id = $1`, key).Scan(&ver); err != nil {
					return err
				}
				return pgcas.Exec(ctx, tx, `UPDATE docs SET n = n + 1, version = version + 1 WHERE id = $1 AND version = $2`, key, ver)
			})
		}
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT n FROM docs WHERE id = $1`, key)
	},
}, {
	name: "idempotency.Do", amb: idempotency.ErrAmbiguousCommit,
	tx: true, before: "UPDATE 1", after: "COMMIT",
	schema: walletSchema, seed: walletSeed, applied: walletPaid,
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := must(idempotency.New(db))(t)
		return func(ctx context.Context, key string) error {
			_, err := s.Do(ctx, "matrix", key, []byte(fp), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				_, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance - 5 WHERE account = $1`, key)
				return []byte("paid"), err
			})
			return err
		}
	},
	rerun: true,
}, {
	// Exec claims the key (sent with BEGIN; its tag is the claim's
	// SELECT), then sends the statement and the record with COMMIT, as a
	// role that may not create objects.
	name: "idempotency.Exec", amb: idempotency.ErrAmbiguousCommit,
	tx: true, before: "SELECT 1", after: "COMMIT", app: true,
	schema: walletSchema, seed: walletSeed, applied: walletPaid,
	open:  execDebit(),
	rerun: true,
}, {
	name: "inbox.Process", amb: inbox.ErrAmbiguousCommit,
	tx: true, before: "UPDATE 1", after: "COMMIT",
	schema: func(ctx context.Context, admin *pgxpool.Pool) error {
		in, err := inbox.New(admin, "matrix")
		if err != nil {
			return err
		}
		if err := in.CreateSchema(ctx); err != nil {
			return err
		}
		return exec(ctx, admin, `CREATE TABLE effects (id text PRIMARY KEY, n int NOT NULL)`)
	},
	seed: func(ctx context.Context, admin *pgxpool.Pool, key string) error {
		return exec(ctx, admin, `INSERT INTO effects VALUES ($1, 0)`, key)
	},
	open: func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		in := must(inbox.New(db, "matrix"))(t)
		return func(ctx context.Context, key string) error {
			msg := kafka.Message{Topic: "matrix", Offset: 1, Key: []byte(key), Headers: []kafka.Header{{Key: "id", Value: []byte(key)}}}
			_, err := in.Process(ctx, []kafka.Message{msg}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
				_, err := tx.Exec(ctx, `UPDATE effects SET n = n + 1 WHERE id = $1`, string(m.Key))
				return err
			})
			return err
		}
	},
	applied: func(ctx context.Context, admin *pgxpool.Pool, key string) (int, error) {
		return count(ctx, admin, `SELECT n FROM effects WHERE id = $1`, key)
	},
	rerun: true,
}}

// ambiguous reports whether err is the api's ErrAmbiguousCommit.
func (a api) ambiguous(err error) bool { return errors.Is(err, a.amb) }

func (a api) String() string { return fmt.Sprintf("%s (tx %v)", a.name, a.tx) }

// execDebit is the matrix's write through idempotency.Store.Exec.
func execDebit(opts ...idempotency.Option) func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
	return func(t *testing.T, db *pgxpool.Pool) func(context.Context, string) error {
		s := must(idempotency.New(db, opts...))(t)
		return func(ctx context.Context, key string) error {
			_, err := s.Exec(ctx, "matrix", key, []byte(fp), `UPDATE wallets SET balance = balance - $2 WHERE account = $1 RETURNING balance`, key, 5)
			return err
		}
	}
}
