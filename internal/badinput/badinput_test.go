package badinput_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/idempotency/dynamoidempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/partition"
	"github.com/nolock/nolock/pgoutcome"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noDB is a database that fails the test on any call: every case here
// must be refused before any I/O.
type noDB struct{ t *testing.T }

func (d noDB) fail(call string) error {
	d.t.Errorf("%s called: bad input reached the database", call)
	return errors.New("no I/O allowed")
}

func (d noDB) Acquire(context.Context) (*pgxpool.Conn, error) { return nil, d.fail("Acquire") }
func (d noDB) Begin(context.Context) (pgx.Tx, error)          { return nil, d.fail("Begin") }
func (d noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, d.fail("Exec")
}
func (d noDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, d.fail("Query")
}
func (d noDB) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{d.fail("QueryRow")} }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// noDynamo is a DynamoDB client that fails the test on any call.
type noDynamo struct{ t *testing.T }

func (d noDynamo) fail(call string) error {
	d.t.Errorf("%s called: bad input reached DynamoDB", call)
	return errors.New("no I/O allowed")
}

func (d noDynamo) GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return nil, d.fail("GetItem")
}
func (d noDynamo) BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return nil, d.fail("BatchGetItem")
}
func (d noDynamo) PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return nil, d.fail("PutItem")
}
func (d noDynamo) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return nil, d.fail("UpdateItem")
}
func (d noDynamo) DeleteItem(context.Context, *dynamodb.DeleteItemInput, ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return nil, d.fail("DeleteItem")
}
func (d noDynamo) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return nil, d.fail("TransactWriteItems")
}

// refusal is one bad input: call must fail with an error that Is want
// and whose text contains names (the parameter).
type refusal struct {
	name  string
	want  error
	names string
	call  func() error
}

func check(t *testing.T, cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("got %v; want %v naming %q", err, tc.want, tc.names)
			}
		})
	}
}

// nilCtx is a nil context, typed so that vet accepts passing it.
var nilCtx context.Context

// Typed nils of the handles users pass: each is nil for the library.
var (
	nilPool   *pgxpool.Pool
	nilConn   *pgx.Conn
	nilClient *dynamodb.Client
)

// badIdents are PostgreSQL identifiers the server cannot keep apart from
// others (or refuses only once sent), with the words the error must use.
func badIdents(maxLen int) []struct{ label, name, says string } {
	return []struct{ label, name, says string }{
		{"empty", "", "is empty"},
		{"one byte too long", strings.Repeat("x", maxLen+1), fmt.Sprintf("is %d bytes, more than", maxLen+1)},
		{"NUL", "sto\x00ck_a", "contains a NUL byte"},
		{"not UTF-8", "stock\xff", "is not valid UTF-8"},
	}
}

func TestPostgresIdentifiersRefused(t *testing.T) {
	t.Parallel()
	db := noDB{t}
	var cases []refusal
	add := func(pkg string, want error, param string, maxLen int, skipEmpty bool, make func(name string) error) {
		for _, b := range badIdents(maxLen) {
			if b.name == "" && skipEmpty {
				continue
			}
			cases = append(cases, refusal{pkg + " " + param + " " + b.label, want, param + " " + b.says, func() error { return make(b.name) }})
		}
	}
	// "" means DefaultTable for pgcas.NewBackend and the default
	// Table for partition.Config.
	add("cas", cas.ErrInvalid, "WithTable", 63, true, func(n string) error { _, err := pgcas.NewBackend(db, pgcas.WithTable(n)); return err })
	add("stock", conditional.ErrInvalid, "table", 63, false, func(n string) error {
		_, err := conditional.NewStock(db, conditional.WithTable(n))
		return err
	})
	add("accounts", conditional.ErrInvalid, "table", 63, false, func(n string) error {
		_, err := conditional.NewAccounts(db, conditional.WithTable(n))
		return err
	})
	add("holds", conditional.ErrInvalid, "table", 63, false, func(n string) error {
		_, err := conditional.NewHolds(db, conditional.WithTable(n))
		return err
	})
	add("fenced", conditional.ErrInvalid, "table", 63, false, func(n string) error { _, err := conditional.NewFenced(n, "id", "fence"); return err })
	add("fenced", conditional.ErrInvalid, "key column", 63, false, func(n string) error { _, err := conditional.NewFenced("docs", n, "fence"); return err })
	add("fenced", conditional.ErrInvalid, "fence column", 63, false, func(n string) error { _, err := conditional.NewFenced("docs", "id", n); return err })
	add("idempotency", idempotency.ErrInvalid, "table", 63-len("_expires_at"), false, func(n string) error {
		_, err := idempotency.New(db, idempotency.WithTable(n))
		return err
	})
	add("inbox", inbox.ErrInvalid, "table prefix", 63-len("_processed_at"), false, func(n string) error {
		_, err := inbox.New(db, "consumer", inbox.WithTable(n))
		return err
	})
	add("partition", partition.ErrInvalid, "Table", 63-len("_parked"), true, func(n string) error {
		_, err := newPartition(db, partition.WithTable(n))
		return err
	})
	// A set column of Fenced.Update is an identifier too.
	f, err := conditional.NewFenced("docs", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	add("fenced update", conditional.ErrInvalid, "set column", 63, false, func(n string) error {
		return f.Update(context.Background(), db, 1, 1, map[string]any{n: 1})
	})
	check(t, cases)
}

// newPartition is partition.New for brokers that do not exist.
func newPartition(db partition.DB, opts ...partition.Option) (*partition.Consumer, error) {
	return partition.New(db, []string{"127.0.0.1:1"}, "g", []string{"t"}, opts...)
}

func TestNilDatabaseRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, err := conditional.NewFenced("docs", "id", "fence")
	if err != nil {
		t.Fatal(err)
	}
	stock, err := conditional.NewStock(noDB{t})
	if err != nil {
		t.Fatal(err)
	}
	defer stock.Close()
	accounts, err := conditional.NewAccounts(noDB{t})
	if err != nil {
		t.Fatal(err)
	}
	defer accounts.Close()
	var cases []refusal
	for _, nilDB := range []struct {
		label string
		pool  *pgxpool.Pool // nil interface when both are nil and untyped is set
		conn  *pgx.Conn
		typed bool
	}{{"nil", nil, nil, false}, {"nil *pgxpool.Pool", nilPool, nil, true}, {"nil *pgx.Conn", nil, nilConn, true}} {
		// db returns the nil database as each package's interface.
		pick := func() any {
			switch {
			case !nilDB.typed:
				return nil
			case nilDB.label == "nil *pgx.Conn":
				return nilDB.conn
			}
			return nilDB.pool
		}
		casDB, _ := pick().(pgcas.DB)
		condDB, _ := pick().(conditional.DB)
		idemDB, _ := pick().(idempotency.DB)
		inboxDB, _ := pick().(inbox.DB)
		partDB, _ := pick().(partition.DB)
		leaseDB, _ := pick().(lease.DB)
		begin, _ := pick().(pgcas.Beginner)
		execer, _ := pick().(pgcas.Execer)
		l := nilDB.label + " "
		cases = append(cases,
			refusal{l + "pgcas.NewBackend", cas.ErrInvalid, "db is nil", func() error { _, err := pgcas.NewBackend(casDB); return err }},
			refusal{l + "pgcas.Retry", cas.ErrInvalid, "db is nil", func() error {
				return pgcas.Retry(ctx, begin, func(context.Context, pgx.Tx) error { return nil })
			}},
			refusal{l + "pgcas.Exec", cas.ErrInvalid, "db is nil", func() error { return pgcas.Exec(ctx, execer, "SELECT 1") }},
			refusal{l + "conditional.NewStock", conditional.ErrInvalid, "db is nil", func() error { _, err := conditional.NewStock(condDB); return err }},
			refusal{l + "conditional.NewAccounts", conditional.ErrInvalid, "db is nil", func() error { _, err := conditional.NewAccounts(condDB); return err }},
			refusal{l + "conditional.NewHolds", conditional.ErrInvalid, "db is nil", func() error { _, err := conditional.NewHolds(condDB); return err }},
			refusal{l + "Fenced.Update", conditional.ErrInvalid, "db is nil", func() error { return f.Update(ctx, condDB, 1, 1, nil) }},
			refusal{l + "Stock.TakeIn", conditional.ErrInvalid, "tx is nil", func() error { return stock.TakeIn(ctx, condDB, "k", 1) }},
			refusal{l + "Accounts.DebitIn", conditional.ErrInvalid, "tx is nil", func() error { return accounts.DebitIn(ctx, condDB, "k", 1) }},
			refusal{l + "Accounts.CreditIn", conditional.ErrInvalid, "tx is nil", func() error { return accounts.CreditIn(ctx, condDB, "k", 1) }},
			refusal{l + "idempotency.New", idempotency.ErrInvalid, "db is nil", func() error { _, err := idempotency.New(idemDB); return err }},
			refusal{l + "inbox.New", inbox.ErrInvalid, "db is nil", func() error { _, err := inbox.New(inboxDB, "c"); return err }},
			refusal{l + "partition.New", partition.ErrInvalid, "db is nil", func() error { _, err := newPartition(partDB); return err }},
			refusal{l + "lease.New", lease.ErrInvalid, "db is nil", func() error {
				c, err := lease.New(leaseDB)
				if err == nil {
					c.Close()
				}
				return err
			}},
		)
	}
	// The other handles a call takes: a nil *kafka.Reader (whose methods
	// would panic), a nil commit.
	in, err := inbox.New(noDB{t}, "c")
	must(t, err)
	var nilReader *kafka.Reader
	cases = append(cases,
		refusal{"nil *kafka.Reader inbox.Run", inbox.ErrInvalid, "reader is nil", func() error {
			return in.Run(ctx, nilReader, func(context.Context, pgx.Tx, kafka.Message) error { return nil })
		}},
		refusal{"nil commit pgoutcome.Commit", pgoutcome.ErrInvalid, "commit is nil", func() error { return pgoutcome.Commit(ctx, nil) }},
	)
	check(t, cases)
	if o := pgoutcome.Of(pgoutcome.Commit(ctx, nil)); o != pgoutcome.NotSent {
		t.Errorf("pgoutcome.Commit(ctx, nil) is %v; want NotSent", o)
	}
}

// must stops the test on an error of its setup.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// casFixtures returns a cas backend on each fake, and a Store on the
// PostgreSQL one that is closed when the test ends.
func casFixtures(t *testing.T, db noDB, ddb noDynamo) (*pgcas.Backend, *dynamocas.Backend, *cas.Store[int]) {
	t.Helper()
	pgBackend, err := pgcas.NewBackend(db)
	must(t, err)
	ddbBackend, err := dynamocas.NewBackend(ddb, "table")
	must(t, err)
	store, err := cas.NewStore[int](pgBackend, nil)
	must(t, err)
	t.Cleanup(func() { store.Close() })
	return pgBackend, ddbBackend, store
}

func TestNilContextRefused(t *testing.T) {
	t.Parallel()
	db, ddb := noDB{t}, noDynamo{t}
	pgBackend, ddbBackend, store := casFixtures(t, db, ddb)
	stock, err := conditional.NewStock(db)
	must(t, err)
	defer stock.Close()
	accounts, err := conditional.NewAccounts(db)
	must(t, err)
	defer accounts.Close()
	holds, err := conditional.NewHolds(db)
	must(t, err)
	fenced, err := conditional.NewFenced("docs", "id", "fence")
	must(t, err)
	dstock, err := dynamoconditional.NewStock(ddb, "table")
	must(t, err)
	daccounts, err := dynamoconditional.NewAccounts(ddb, "table")
	must(t, err)
	dholds, err := dynamoconditional.NewHolds(ddb, "table")
	must(t, err)
	dfenced, err := dynamoconditional.NewFenced("table", "pk", "fence")
	must(t, err)
	idem, err := idempotency.New(db)
	must(t, err)
	didem, err := dynamoidempotency.New(ddb, "table")
	must(t, err)
	in, err := inbox.New(db, "c")
	must(t, err)
	consumer, err := newPartition(db)
	must(t, err)
	locks, err := dynamolock.New(ddb, "table")
	must(t, err)
	defer locks.Close()
	leases, err := lease.New(db)
	must(t, err)
	defer leases.Close()

	fn := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	c := nilCtx
	e := func(pkg error, name string, call func() error) refusal { return refusal{name, pkg, "ctx is nil", call} }
	cases := []refusal{
		e(cas.ErrInvalid, "pgcas.Retry", func() error { return pgcas.Retry(c, db, func(context.Context, pgx.Tx) error { return nil }) }),
		e(cas.ErrInvalid, "pgcas.Exec", func() error { return pgcas.Exec(c, db, "SELECT 1") }),
		e(cas.ErrInvalid, "pgcas.Backend.CreateSchema", func() error { return pgBackend.CreateSchema(c) }),
		e(cas.ErrInvalid, "pgcas.Backend.Get", func() error { _, _, err := pgBackend.Get(c, "k"); return err }),
		e(cas.ErrInvalid, "pgcas.Backend.Create", func() error { return pgBackend.Create(c, "k", nil) }),
		e(cas.ErrInvalid, "pgcas.Backend.Put", func() error { _, err := pgBackend.Put(c, "k", nil, 1); return err }),
		e(cas.ErrInvalid, "pgcas.Backend.Delete", func() error { return pgBackend.Delete(c, "k", 1) }),
		e(cas.ErrInvalid, "dynamocas.Backend.Get", func() error { _, _, err := ddbBackend.Get(c, "k"); return err }),
		e(cas.ErrInvalid, "dynamocas.Backend.Create", func() error { return ddbBackend.Create(c, "k", nil) }),
		e(cas.ErrInvalid, "dynamocas.Backend.Put", func() error { _, err := ddbBackend.Put(c, "k", nil, 1); return err }),
		e(cas.ErrInvalid, "dynamocas.Backend.Delete", func() error { return ddbBackend.Delete(c, "k", 1) }),
		e(cas.ErrInvalid, "Store.Get", func() error { _, err := store.Get(c, "k"); return err }),
		e(cas.ErrInvalid, "Store.Create", func() error { return store.Create(c, "k", 1) }),
		e(cas.ErrInvalid, "Store.Delete", func() error { return store.Delete(c, "k", 1) }),
		e(cas.ErrInvalid, "Store.Update", func() error { _, err := store.Update(c, "k", func(v int) (int, error) { return v, nil }); return err }),
		e(cas.ErrInvalid, "Store.Update alone", func() error {
			_, err := store.Update(c, "k", func(v int) (int, error) { return v, nil }, cas.NoCoalescing())
			return err
		}),

		e(conditional.ErrInvalid, "Stock.Take", func() error { return stock.Take(c, "k", 1) }),
		e(conditional.ErrInvalid, "Stock.TakeIn", func() error { return stock.TakeIn(c, db, "k", 1) }),
		e(conditional.ErrInvalid, "Stock.Put", func() error { return stock.Put(c, "k", 1) }),
		e(conditional.ErrInvalid, "Stock.Available", func() error { _, err := stock.Available(c, "k"); return err }),
		e(conditional.ErrInvalid, "Stock.CreateSchema", func() error { return stock.CreateSchema(c) }),
		e(conditional.ErrInvalid, "Accounts.Open", func() error { return accounts.Open(c, "a", 1) }),
		e(conditional.ErrInvalid, "Accounts.Debit", func() error { return accounts.Debit(c, "a", 1) }),
		e(conditional.ErrInvalid, "Accounts.DebitIn", func() error { return accounts.DebitIn(c, db, "a", 1) }),
		e(conditional.ErrInvalid, "Accounts.Credit", func() error { return accounts.Credit(c, "a", 1) }),
		e(conditional.ErrInvalid, "Accounts.CreditIn", func() error { return accounts.CreditIn(c, db, "a", 1) }),
		e(conditional.ErrInvalid, "Accounts.Balance", func() error { _, err := accounts.Balance(c, "a"); return err }),
		e(conditional.ErrInvalid, "Accounts.CreateSchema", func() error { return accounts.CreateSchema(c) }),
		e(conditional.ErrInvalid, "Holds.Add", func() error { return holds.Add(c, "r") }),
		e(conditional.ErrInvalid, "Holds.Add none", func() error { return holds.Add(c) }),
		e(conditional.ErrInvalid, "Holds.Hold", func() error { _, err := holds.Hold(c, "r", "h", time.Second); return err }),
		e(conditional.ErrInvalid, "Holds.HoldAll", func() error { _, err := holds.HoldAll(c, []string{"r"}, "h", time.Second); return err }),
		e(conditional.ErrInvalid, "Holds.Confirm", func() error { return holds.Confirm(c, "r", "h") }),
		e(conditional.ErrInvalid, "Holds.Release", func() error { return holds.Release(c, "r", "h") }),
		e(conditional.ErrInvalid, "Holds.CreateSchema", func() error { return holds.CreateSchema(c) }),
		e(conditional.ErrInvalid, "Holds.Get", func() error { _, err := holds.Get(c, "r"); return err }),
		e(conditional.ErrInvalid, "Holds.Free", func() error { _, err := holds.Free(c, []string{"r"}); return err }),
		e(conditional.ErrInvalid, "Holds.HoldAny", func() error { _, _, err := holds.HoldAny(c, []string{"r"}, "h", time.Second); return err }),
		e(conditional.ErrInvalid, "Fenced.Update", func() error { return fenced.Update(c, db, 1, 1, nil) }),
		e(conditional.ErrInvalid, "dynamoconditional.Stock.Take", func() error { return dstock.Take(c, "k", 1) }),
		e(conditional.ErrInvalid, "dynamoconditional.Stock.Put", func() error { return dstock.Put(c, "k", 1) }),
		e(conditional.ErrInvalid, "dynamoconditional.Stock.Available", func() error { _, err := dstock.Available(c, "k"); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Accounts.Open", func() error { return daccounts.Open(c, "a", 1) }),
		e(conditional.ErrInvalid, "dynamoconditional.Accounts.Debit", func() error { return daccounts.Debit(c, "a", 1) }),
		e(conditional.ErrInvalid, "dynamoconditional.Accounts.Credit", func() error { return daccounts.Credit(c, "a", 1) }),
		e(conditional.ErrInvalid, "dynamoconditional.Accounts.Balance", func() error { _, err := daccounts.Balance(c, "a"); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.Add", func() error { return dholds.Add(c, "r") }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.Hold", func() error { _, err := dholds.Hold(c, "r", "h", time.Second); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.HoldAll", func() error { _, err := dholds.HoldAll(c, []string{"r"}, "h", time.Second); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.Confirm", func() error { return dholds.Confirm(c, "r", "h") }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.Release", func() error { return dholds.Release(c, "r", "h") }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.Get", func() error { _, err := dholds.Get(c, "r"); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.Free", func() error { _, err := dholds.Free(c, []string{"r"}); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Holds.HoldAny", func() error { _, _, err := dholds.HoldAny(c, []string{"r"}, "h", time.Second); return err }),
		e(conditional.ErrInvalid, "dynamoconditional.Fenced.Update", func() error { return dfenced.Update(c, ddb, nil, 1, nil) }),

		e(idempotency.ErrInvalid, "Store.Do", func() error { _, err := idem.Do(c, "", "k", nil, fn); return err }),
		e(idempotency.ErrInvalid, "Store.Exec", func() error { _, err := idem.Exec(c, "", "k", nil, "SELECT 1"); return err }),
		e(idempotency.ErrInvalid, "Store.Get", func() error { _, err := idem.Get(c, "", "k"); return err }),
		e(idempotency.ErrInvalid, "Store.Reap", func() error { _, err := idem.Reap(c, 10); return err }),
		e(idempotency.ErrInvalid, "Store.CreateSchema", func() error { return idem.CreateSchema(c) }),
		e(idempotency.ErrInvalid, "dynamoidempotency.Store.Do", func() error {
			_, err := didem.Do(c, "", "k", nil, func(context.Context) ([]types.TransactWriteItem, []byte, error) { return nil, nil, nil })
			return err
		}),
		e(idempotency.ErrInvalid, "dynamoidempotency.Store.Get", func() error { _, err := didem.Get(c, "", "k"); return err }),

		e(inbox.ErrInvalid, "Inbox.CreateSchema", func() error { return in.CreateSchema(c) }),
		e(inbox.ErrInvalid, "Inbox.Process", func() error {
			_, err := in.Process(c, []kafka.Message{{}}, func(context.Context, pgx.Tx, kafka.Message) error { return nil })
			return err
		}),
		e(inbox.ErrInvalid, "Inbox.Reap", func() error { _, err := in.Reap(c, time.Hour, 10); return err }),
		e(inbox.ErrInvalid, "Inbox.Run", func() error { return in.Run(c, nil, nil) }),
		e(inbox.ErrInvalid, "Inbox.ListParked", func() error { _, err := in.ListParked(c, inbox.ParkedID{}, 10); return err }),
		e(inbox.ErrInvalid, "Inbox.ReplayParked", func() error {
			return in.ReplayParked(c, inbox.ParkedID{Topic: "t", Offset: 1}, func(context.Context, pgx.Tx, kafka.Message) error { return nil })
		}),
		e(inbox.ErrInvalid, "Inbox.PurgeParked", func() error { return in.PurgeParked(c, inbox.ParkedID{Topic: "t", Offset: 1}) }),
		e(inbox.ErrInvalid, "Inbox.PurgeParkedOlderThan", func() error { _, err := in.PurgeParkedOlderThan(c, time.Hour, 1000); return err }),

		e(partition.ErrInvalid, "Consumer.CreateSchema", func() error { return consumer.CreateSchema(c) }),
		e(partition.ErrInvalid, "Consumer.Run", func() error {
			return consumer.Run(c, func(context.Context, pgx.Tx, []kafka.Message) error { return nil })
		}),
		e(partition.ErrInvalid, "Consumer.ListParked", func() error { _, err := consumer.ListParked(c, partition.ParkedID{}, 10); return err }),
		e(partition.ErrInvalid, "Consumer.ReplayParked", func() error {
			return consumer.ReplayParked(c, partition.ParkedID{Topic: "t", Offset: 1}, func(context.Context, pgx.Tx, []kafka.Message) error { return nil })
		}),
		e(partition.ErrInvalid, "Consumer.PurgeParked", func() error { return consumer.PurgeParked(c, partition.ParkedID{Topic: "t", Offset: 1}) }),
		e(partition.ErrInvalid, "Consumer.PurgeParkedOlderThan", func() error { _, err := consumer.PurgeParkedOlderThan(c, time.Hour, 1000); return err }),

		e(lease.ErrInvalid, "lease.Client.Acquire", func() error { _, err := leases.Acquire(c, "k"); return err }),
		e(lease.ErrInvalid, "lease.Client.TryAcquire", func() error { _, err := leases.TryAcquire(c, "k"); return err }),
		e(lease.ErrInvalid, "lease.Client.CreateSchema", func() error { return leases.CreateSchema(c) }),

		e(pgoutcome.ErrInvalid, "pgoutcome.Commit", func() error {
			return pgoutcome.Commit(c, func(context.Context) error { t.Error("commit ran"); return nil })
		}),

		e(dynamolock.ErrInvalid, "Client.Acquire", func() error { _, err := locks.Acquire(c, "k"); return err }),
		e(dynamolock.ErrInvalid, "Client.TryAcquire", func() error { _, err := locks.TryAcquire(c, "k"); return err }),
	}
	check(t, cases)
	if tx, ok := idempotency.TxFromContext(c); tx != nil || ok {
		t.Errorf("idempotency.TxFromContext(nil) = %v, %v; want nil, false", tx, ok)
	}
	if _, ok := partition.FromContext(c); ok {
		t.Errorf("partition.FromContext(nil) reports a claim")
	}
}

func TestDynamoDBNamesRefused(t *testing.T) {
	t.Parallel()
	ddb := noDynamo{t}
	tables := []struct{ label, name, says string }{
		{"empty", "", "table is empty"},
		{"too short", "ab", "table is 2 bytes"},
		{"too long", strings.Repeat("t", 256), "table is 256 bytes"},
		{"space", "my table", "table has ' '"},
		{"NUL", "tab\x00le", "table has '\\x00'"},
		{"not ASCII", "tablé", "table has"},
		{"ARN too long", "arn:" + strings.Repeat("a", 1021), "table is an ARN of 1025 bytes"},
	}
	attrs := []struct{ label, name, says string }{
		{"empty", "", "is empty"},
		{"too long", strings.Repeat("a", 256), "is 256 bytes"},
		{"not UTF-8", "pk\xff", "is not valid UTF-8"},
	}
	var cases []refusal
	for _, b := range tables {
		n := b.name
		cases = append(cases,
			refusal{"cas table " + b.label, cas.ErrInvalid, b.says, func() error { _, err := dynamocas.NewBackend(ddb, n); return err }},
			refusal{"dynamoconditional.Stock table " + b.label, conditional.ErrInvalid, b.says, func() error { _, err := dynamoconditional.NewStock(ddb, n); return err }},
			refusal{"dynamoconditional.Accounts table " + b.label, conditional.ErrInvalid, b.says, func() error { _, err := dynamoconditional.NewAccounts(ddb, n); return err }},
			refusal{"dynamoconditional.Holds table " + b.label, conditional.ErrInvalid, b.says, func() error { _, err := dynamoconditional.NewHolds(ddb, n); return err }},
			refusal{"dynamoconditional.Fenced table " + b.label, conditional.ErrInvalid, b.says, func() error { _, err := dynamoconditional.NewFenced(n, "pk", "fence"); return err }},
			refusal{"idempotency table " + b.label, idempotency.ErrInvalid, b.says, func() error { _, err := dynamoidempotency.New(ddb, n); return err }},
			refusal{"dynamolock table " + b.label, dynamolock.ErrInvalid, b.says, func() error { _, err := dynamolock.New(ddb, n); return err }},
		)
	}
	for _, b := range attrs {
		n := b.name
		cases = append(cases,
			refusal{"cas key attribute " + b.label, cas.ErrInvalid, "key attribute " + b.says, func() error {
				_, err := dynamocas.NewBackend(ddb, "table", dynamocas.WithKeyAttributes(n, ""))
				return err
			}},
			refusal{"dynamoconditional.Fenced key attribute " + b.label, conditional.ErrInvalid, "key attribute " + b.says, func() error { _, err := dynamoconditional.NewFenced("table", n, "fence"); return err }},
			refusal{"idempotency partition key " + b.label, idempotency.ErrInvalid, "partition key attribute " + b.says, func() error {
				_, err := dynamoidempotency.New(ddb, "table", dynamoidempotency.WithKeyAttributes(n, ""))
				return err
			}},
			refusal{"dynamolock partition key " + b.label, dynamolock.ErrInvalid, "partition key attribute " + b.says, func() error {
				_, err := dynamolock.New(ddb, "table", dynamolock.WithKeyAttributes(n, ""))
				return err
			}},
		)
		if n != "" { // "" means no sort key
			cases = append(cases,
				refusal{"idempotency sort key " + b.label, idempotency.ErrInvalid, "sort key attribute " + b.says, func() error {
					_, err := dynamoidempotency.New(ddb, "table", dynamoidempotency.WithKeyAttributes("pk", n))
					return err
				}},
				refusal{"cas sort key " + b.label, cas.ErrInvalid, "sort key attribute " + b.says, func() error {
					_, err := dynamocas.NewBackend(ddb, "table", dynamocas.WithKeyAttributes("pk", n))
					return err
				}},
				refusal{"dynamolock sort key " + b.label, dynamolock.ErrInvalid, "sort key attribute " + b.says, func() error {
					_, err := dynamolock.New(ddb, "table", dynamolock.WithKeyAttributes("key", n))
					return err
				}},
			)
		}
	}
	for _, c := range []struct {
		label string
		api   any
	}{{"nil", nil}, {"nil *dynamodb.Client", nilClient}} {
		casAPI, _ := c.api.(dynamocas.DynamoDBAPI)
		condAPI, _ := c.api.(dynamoconditional.DynamoDBAPI)
		idemAPI, _ := c.api.(dynamoidempotency.DynamoDBAPI)
		lockAPI, _ := c.api.(dynamolock.DynamoDBAPI)
		dfenced, err := dynamoconditional.NewFenced("table", "pk", "fence")
		if err != nil {
			t.Fatal(err)
		}
		l := c.label + " "
		cases = append(cases,
			refusal{l + "cas", cas.ErrInvalid, "client is nil", func() error { _, err := dynamocas.NewBackend(casAPI, "table"); return err }},
			refusal{l + "dynamoconditional.Stock", conditional.ErrInvalid, "client is nil", func() error { _, err := dynamoconditional.NewStock(condAPI, "table"); return err }},
			refusal{l + "dynamoconditional.Accounts", conditional.ErrInvalid, "client is nil", func() error { _, err := dynamoconditional.NewAccounts(condAPI, "table"); return err }},
			refusal{l + "dynamoconditional.Holds", conditional.ErrInvalid, "client is nil", func() error { _, err := dynamoconditional.NewHolds(condAPI, "table"); return err }},
			refusal{l + "dynamoconditional.Fenced.Update", conditional.ErrInvalid, "client is nil", func() error { return dfenced.Update(context.Background(), condAPI, nil, 1, nil) }},
			refusal{l + "idempotency", idempotency.ErrInvalid, "client is nil", func() error { _, err := dynamoidempotency.New(idemAPI, "table"); return err }},
			refusal{l + "dynamolock", dynamolock.ErrInvalid, "client is nil", func() error { _, err := dynamolock.New(lockAPI, "table"); return err }},
		)
	}
	// Names DynamoDB takes are taken.
	for _, n := range []string{"abc", "My.Table-1_x", strings.Repeat("t", 255), "arn:aws:dynamodb:us-east-1:123456789012:table/locks"} {
		if _, err := dynamocas.NewBackend(ddb, n); err != nil {
			t.Errorf("table %q: %v", n, err)
		}
	}
	check(t, cases)
}

func TestMiddlewareMethodsRefused(t *testing.T) {
	t.Parallel()
	store, err := idempotency.New(noDB{t})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		methods []string
		says    string
	}{
		{"none", nil, "methods is empty"},
		{"empty list", []string{}, "methods is empty"},
		{"lower case", []string{"post"}, `methods[0] is "post": methods are case-sensitive`},
		{"mixed case after a good one", []string{"POST", "Patch"}, `methods[1] is "Patch"`},
		{"unknown", []string{"PSOT"}, `methods[0] "PSOT" is not an HTTP method`},
		{"empty name", []string{""}, `methods[0] "" is not an HTTP method`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := idempotency.Middleware(store, idempotency.WithMethods(tc.methods...))
			if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("WithMethods(%q): %v; want ErrInvalid saying %q", tc.methods, err, tc.says)
			}
		})
	}
	if _, err := idempotency.Middleware(store, idempotency.WithMethods("PUT", "DELETE")); err != nil {
		t.Fatalf("WithMethods(PUT, DELETE): %v", err)
	}
}

// Names PostgreSQL would merge are refused, on a real database, and
// nothing is written: a table whose name is a NUL-stripped or truncated
// twin of another's is never created, and the other's rows are unchanged.
func TestCollidingTablesRefusedNothingWritten(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t, 4)
	ctx := context.Background()
	long := strings.Repeat("s", 63)
	made := map[string]bool{}
	for _, name := range []string{"stock_a", long} {
		s, err := conditional.NewStock(pool, conditional.WithTable(name))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSchema(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, "k", 10); err != nil {
			t.Fatal(err)
		}
		s.Close()
		made[name] = true
	}
	idem, err := idempotency.New(pool, idempotency.WithTable("idem_a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := idem.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	made["idem_a"] = true

	twins := []refusal{
		{"stock NUL twin", conditional.ErrInvalid, "table contains a NUL", func() error {
			_, err := conditional.NewStock(pool, conditional.WithTable("sto\x00ck_a"))
			return err
		}},
		{"stock truncated twin", conditional.ErrInvalid, "table is 64 bytes", func() error {
			_, err := conditional.NewStock(pool, conditional.WithTable(long+"x"))
			return err
		}},
		{"accounts NUL twin", conditional.ErrInvalid, "table contains a NUL", func() error {
			_, err := conditional.NewAccounts(pool, conditional.WithTable("stock_a\x00"))
			return err
		}},
		{"holds truncated twin", conditional.ErrInvalid, "table is 64 bytes", func() error {
			_, err := conditional.NewHolds(pool, conditional.WithTable(long+"y"))
			return err
		}},
		{"cas truncated twin", cas.ErrInvalid, "WithTable is 64 bytes", func() error { _, err := pgcas.NewBackend(pool, pgcas.WithTable(long+"z")); return err }},
		{"idempotency NUL twin", idempotency.ErrInvalid, "table contains a NUL", func() error {
			_, err := idempotency.New(pool, idempotency.WithTable("idem\x00_a"))
			return err
		}},
		{"idempotency index twin", idempotency.ErrInvalid, "table is 53 bytes", func() error {
			_, err := idempotency.New(pool, idempotency.WithTable(strings.Repeat("i", 53)))
			return err
		}},
		{"inbox NUL twin", inbox.ErrInvalid, "table prefix contains a NUL", func() error {
			_, err := inbox.New(pool, "c", inbox.WithTable("stock\x00_a"))
			return err
		}},
		{"partition parked twin", partition.ErrInvalid, "Table is 57 bytes", func() error {
			_, err := newPartition(pool, partition.WithTable(strings.Repeat("p", 57)))
			return err
		}},
	}
	check(t, twins)

	rows, err := pool.Query(ctx, `SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')`, schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range tables {
		if !made[name] {
			t.Errorf("table %q exists: a refused constructor created it", name)
		}
	}
	if len(tables) != len(made) {
		t.Errorf("tables %q; want exactly %d", tables, len(made))
	}
	for _, name := range []string{"stock_a", long} {
		var qty int64
		if err := pool.QueryRow(ctx, `SELECT sum(qty) FROM `+pgx.Identifier{name}.Sanitize()+` WHERE key = 'k'`).Scan(&qty); err != nil || qty != 10 {
			t.Errorf("%s holds %d for k (%v); want 10, untouched", name, qty, err)
		}
	}
}

// Every constructor and every call that takes options refuses a nil one
// (a nil func, or an interface option holding a nil func), and an
// explicit empty value that would otherwise be read as the default, with
// the package's ErrInvalid naming it, before any I/O.
func TestNilAndEmptyOptionsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, ddb := noDB{t}, noDynamo{t}
	pgBackend, ddbBackend, store := casFixtures(t, db, ddb)
	idem, err := idempotency.New(db)
	must(t, err)
	leases, err := lease.New(db)
	must(t, err)
	defer leases.Close()
	locks, err := dynamolock.New(ddb, "table")
	must(t, err)
	defer locks.Close()

	txFn := func(context.Context, pgx.Tx) error { return nil }
	inc := func(v int) (int, error) { return v + 1, nil }
	nilOpt := "option 1 is nil"
	r := func(name string, want error, names string, call func() error) refusal {
		return refusal{name, want, names, call}
	}
	cases := []refusal{
		// A nil option, second in the list (the first is valid).
		r("pgcas.NewBackend", cas.ErrInvalid, nilOpt, func() error {
			_, err := pgcas.NewBackend(db, pgcas.WithTable("t"), nil)
			return err
		}),
		r("cas.NewStore", cas.ErrInvalid, nilOpt, func() error {
			_, err := cas.NewStore[int](pgBackend, nil, cas.WithAttempts(2), nil)
			return err
		}),
		r("cas.NewStore typed nil", cas.ErrInvalid, nilOpt, func() error {
			_, err := cas.NewStore[int](pgBackend, nil, cas.WithMaxBatch(2), cas.Option(nil))
			return err
		}),
		r("pgcas.Retry", cas.ErrInvalid, nilOpt, func() error { return pgcas.Retry(ctx, db, txFn, cas.WithAttempts(2), nil) }),
		r("pgcas.Retry typed nil", cas.ErrInvalid, nilOpt, func() error {
			return pgcas.Retry(ctx, db, txFn, cas.WithAttempts(2), cas.Option(nil))
		}),
		r("cas.Store.Update", cas.ErrInvalid, nilOpt, func() error {
			_, err := store.Update(ctx, "k", inc, cas.NoCoalescing(), nil)
			return err
		}),
		r("cas.NewStore", cas.ErrInvalid, nilOpt, func() error {
			_, err := cas.NewStore[int](ddbBackend, nil, cas.WithAttempts(2), nil)
			return err
		}),
		r("conditional.NewStock", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewStock(db, conditional.WithBuckets(2), nil)
			return err
		}),
		r("conditional.NewStock typed nil", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewStock(db, conditional.WithBuckets(2), conditional.Option(nil))
			return err
		}),
		r("conditional.NewAccounts", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewAccounts(db, conditional.WithBuckets(2), nil)
			return err
		}),
		r("conditional.NewAccounts typed nil", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewAccounts(db, conditional.WithBuckets(2), conditional.Option(nil))
			return err
		}),
		r("conditional.NewHolds", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewHolds(db, conditional.WithTable("h"), nil)
			return err
		}),
		r("conditional.NewHolds typed nil", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewHolds(db, conditional.WithObserver(nil), conditional.Option(nil))
			return err
		}),
		r("conditional.NewFenced", conditional.ErrInvalid, nilOpt, func() error {
			_, err := conditional.NewFenced("t", "k", "f", conditional.WithObserver(nil), nil)
			return err
		}),
		r("dynamoconditional.NewAccounts", conditional.ErrInvalid, nilOpt, func() error {
			_, err := dynamoconditional.NewAccounts(ddb, "table", dynamoconditional.WithObserver(nil), nil)
			return err
		}),
		r("dynamoconditional.NewFenced", conditional.ErrInvalid, nilOpt, func() error {
			_, err := dynamoconditional.NewFenced("table", "pk", "fence", dynamoconditional.WithObserver(nil), nil)
			return err
		}),
		r("dynamoconditional.NewStock", conditional.ErrInvalid, nilOpt, func() error {
			_, err := dynamoconditional.NewStock(ddb, "table", dynamoconditional.WithBuckets(2), nil)
			return err
		}),
		r("dynamoconditional.NewHolds", conditional.ErrInvalid, nilOpt, func() error {
			_, err := dynamoconditional.NewHolds(ddb, "table", dynamoconditional.WithClock(time.Now), nil)
			return err
		}),
		r("idempotency.New", idempotency.ErrInvalid, nilOpt, func() error {
			_, err := idempotency.New(db, idempotency.WithAttempts(2), nil)
			return err
		}),
		r("idempotency.Middleware", idempotency.ErrInvalid, nilOpt, func() error {
			_, err := idempotency.Middleware(idem, idempotency.WithOptionalKey(), nil)
			return err
		}),
		r("dynamoidempotency.New", idempotency.ErrInvalid, nilOpt, func() error {
			_, err := dynamoidempotency.New(ddb, "table", dynamoidempotency.WithWait(time.Second), nil)
			return err
		}),
		r("inbox.New", inbox.ErrInvalid, nilOpt, func() error {
			_, err := inbox.New(db, "c", inbox.WithAttempts(2), nil)
			return err
		}),
		r("lease.New", lease.ErrInvalid, nilOpt, func() error {
			_, err := lease.New(db, lease.WithLease(time.Minute), nil)
			return err
		}),
		r("lease.Client.Acquire", lease.ErrInvalid, nilOpt, func() error {
			_, err := leases.Acquire(ctx, "k", lease.WithWait(time.Second), nil)
			return err
		}),
		r("lease.Client.TryAcquire", lease.ErrInvalid, nilOpt, func() error {
			_, err := leases.TryAcquire(ctx, "k", lease.WithData(nil), nil)
			return err
		}),
		r("dynamolock.New", dynamolock.ErrInvalid, nilOpt, func() error {
			_, err := dynamolock.New(ddb, "table", dynamolock.WithLease(time.Minute), nil)
			return err
		}),
		r("dynamolock.Client.Acquire", dynamolock.ErrInvalid, nilOpt, func() error {
			_, err := locks.Acquire(ctx, "k", dynamolock.WithWait(time.Second), nil)
			return err
		}),
		r("dynamolock.Client.TryAcquire", dynamolock.ErrInvalid, nilOpt, func() error {
			_, err := locks.TryAcquire(ctx, "k", dynamolock.WithData(nil), nil)
			return err
		}),
		r("partition.New", partition.ErrInvalid, nilOpt, func() error {
			_, err := newPartition(db, partition.WithMaxBatch(2), nil)
			return err
		}),

		// An explicit empty value is judged as given, never read as the
		// default it would otherwise stand for.
		r("lease WithOwner empty", lease.ErrInvalid, `WithOwner("")`, func() error {
			_, err := lease.New(db, lease.WithOwner(""))
			return err
		}),
		r("lease WithWait 0", lease.ErrInvalid, "wait", func() error {
			_, err := leases.Acquire(ctx, "k", lease.WithWait(0))
			return err
		}),
		r("lease WithMaxHold 0", lease.ErrInvalid, "max hold", func() error {
			_, err := leases.Acquire(ctx, "k", lease.WithMaxHold(0))
			return err
		}),
		r("dynamolock WithOwner empty", dynamolock.ErrInvalid, `WithOwner("")`, func() error {
			_, err := dynamolock.New(ddb, "table", dynamolock.WithOwner(""))
			return err
		}),
		r("dynamolock WithWait 0", dynamolock.ErrInvalid, "wait 0s must be positive", func() error {
			_, err := locks.Acquire(ctx, "k", dynamolock.WithWait(0))
			return err
		}),
		r("dynamolock WithMaxHold 0", dynamolock.ErrInvalid, "max hold 0s must be positive", func() error {
			_, err := locks.TryAcquire(ctx, "k", dynamolock.WithMaxHold(0))
			return err
		}),
		r("dynamolock WithSortKey empty without a sort key name", dynamolock.ErrInvalid, `sort key "" given`, func() error {
			_, err := locks.TryAcquire(ctx, "k", dynamolock.WithSortKey(""))
			return err
		}),
		r("idempotency WithScope nil", idempotency.ErrInvalid, "WithScope(nil)", func() error {
			_, err := idempotency.Middleware(idem, idempotency.WithScope(nil))
			return err
		}),
		r("inbox WithBackoff base 0", inbox.ErrInvalid, "WithBackoff(0s, 1s)", func() error {
			_, err := inbox.New(db, "c", inbox.WithBackoff(0, time.Second))
			return err
		}),
		r("inbox WithBackoff cap 0", inbox.ErrInvalid, "WithBackoff(0s, 0s)", func() error {
			_, err := inbox.New(db, "c", inbox.WithBackoff(0, 0))
			return err
		}),
		r("partition WithBackoff base 0", partition.ErrInvalid, "WithBackoff(0s, 1s)", func() error {
			_, err := newPartition(db, partition.WithBackoff(0, time.Second))
			return err
		}),
		r("inbox WithBatchTimeout 0", inbox.ErrInvalid, "WithBatchTimeout(0s)", func() error {
			_, err := inbox.New(db, "c", inbox.WithBatchTimeout(0))
			return err
		}),
		r("cas.NewStore WithBackoff base 0", cas.ErrInvalid, "WithBackoff base 0s", func() error {
			_, err := cas.NewStore[int](pgBackend, nil, cas.WithBackoff(0, time.Second))
			return err
		}),
		r("pgcas.Retry WithBackoff cap 0", cas.ErrInvalid, "cap 0s must be positive", func() error {
			return pgcas.Retry(ctx, db, txFn, cas.WithBackoff(0, 0))
		}),
		r("cas.NewStore WithBackoff base 0", cas.ErrInvalid, "WithBackoff base 0s", func() error {
			_, err := cas.NewStore[int](ddbBackend, nil, cas.WithBackoff(0, time.Second))
			return err
		}),
	}
	check(t, cases)

	// Left out, each option's default still holds.
	if leases.Owner() == "" {
		t.Error("lease: no owner name generated without WithOwner")
	}
	if _, err := idempotency.Middleware(idem, idempotency.WithScope(func(*http.Request, []byte) string { return "a" })); err != nil {
		t.Errorf("WithScope(f): %v", err)
	}
}
