package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/timepart"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/partition"
)

// schema prints the PostgreSQL DDL, then the DynamoDB table definitions
// as SQL comments, so that the whole output applies with psql.
func schema(out io.Writer, partitioned bool) error {
	if err := postgresSchema(out, partitioned); err != nil {
		return err
	}
	if _, err := fmt.Fprint(out, "\n-- DynamoDB tables, one per DynamoDB-backed type (\"nolock schema dynamodb\"\n-- prints them as a shell script). Rename the tables at will and pass the\n-- names to the constructors.\n--\n"); err != nil {
		return err
	}
	return dynamoSchema(out, "-- ")
}

// postgresSchema prints the DDL of every PostgreSQL table the packages
// need, with their default names, for migration tools. Nothing connects
// anywhere: the constructors only render SQL. With partitioned, the
// time-partitioned layout of the idempotency records and inbox ids comes
// first (internal/timepart), and the rest's IF NOT EXISTS leaves it.
func postgresSchema(out io.Writer, partitioned bool) error {
	if partitioned {
		if _, err := fmt.Fprintf(out, "-- idempotency.Store and inbox.Inbox, time-partitioned\n%s\n", timepart.DDL(idempotency.DefaultTable, inbox.DefaultTable)); err != nil {
			return err
		}
	}
	var db offline
	stock, err := conditional.NewStock(db)
	if err != nil {
		return err
	}
	defer stock.Close()
	accounts, err := conditional.NewAccounts(db)
	if err != nil {
		return err
	}
	defer accounts.Close()
	holds, err := conditional.NewHolds(db)
	if err != nil {
		return err
	}
	store, err := pgcas.NewBackend(db)
	if err != nil {
		return err
	}
	in, err := inbox.New(db, "schema")
	if err != nil {
		return err
	}
	keys, err := idempotency.New(db)
	if err != nil {
		return err
	}
	locks, err := lease.New(db)
	if err != nil {
		return err
	}
	partitions, err := partition.Schema(partition.DefaultTable)
	if err != nil {
		return err
	}
	for _, part := range []struct{ name, ddl string }{
		{"conditional.Stock", stock.Schema()},
		{"conditional.Accounts", accounts.Schema()},
		{"conditional.Holds", holds.Schema()},
		{"pgcas.Backend", store.Schema()},
		{"idempotency.Store", keys.Schema()},
		{"inbox.Inbox", in.Schema()},
		{"partition.Consumer", partitions},
		{"lease.Client", locks.Schema()},
	} {
		if _, err := fmt.Fprintf(out, "-- %s\n%s\n", part.name, strings.TrimRight(part.ddl, "\n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// dynamoTable is one DynamoDB-backed type's table: its key schema, and
// what else the type needs of it.
type dynamoTable struct {
	typ, table, use string
	hashKey         string
	after           string // a command to run once the table exists, or ""
}

// dynamoTables are the tables of every DynamoDB-backed type, with names
// that mirror the PostgreSQL defaults and the key attribute each type
// expects. dynamoconditional.Fenced is absent: it guards your own table.
func dynamoTables() []dynamoTable {
	return []dynamoTable{
		{typ: "dynamolock.Client", table: "nolock_locks", hashKey: "key",
			use: `dynamolock.New(client, "nolock_locks"); "key" is the default partition key attribute (WithKeyAttributes for others, or a sort key)`},
		{typ: "dynamoconditional.Stock", table: "nolock_stock", hashKey: "pk",
			use: `dynamoconditional.NewStock(client, "nolock_stock"); "pk" is the default partition key attribute (WithKeyAttributes for others, or a sort key)`},
		{typ: "dynamoconditional.Accounts", table: "nolock_accounts", hashKey: "pk",
			use: `dynamoconditional.NewAccounts(client, "nolock_accounts"); "pk" is the default partition key attribute (WithKeyAttributes for others, or a sort key)`},
		{typ: "dynamoconditional.Holds", table: "nolock_holds", hashKey: "pk",
			use: `dynamoconditional.NewHolds(client, "nolock_holds"); "pk" is the default partition key attribute (WithKeyAttributes for others, or a sort key)`},
		{typ: "dynamocas.Backend", table: "nolock_cas", hashKey: "pk",
			use: `dynamocas.NewBackend(client, "nolock_cas"); "pk" is the default partition key attribute (WithKeyAttributes for others, or a sort key)`},
		{typ: "dynamoidempotency.Store", table: "nolock_idempotency", hashKey: "pk",
			use:   `dynamoidempotency.New(client, "nolock_idempotency"); "pk" is the default partition key attribute (WithKeyAttributes for others, or a sort key); TTL on "ttl" deletes expired records`,
			after: `aws dynamodb update-time-to-live --table-name nolock_idempotency --time-to-live-specification Enabled=true,AttributeName=ttl`},
	}
}

// createTableInput is the JSON of `aws dynamodb create-table
// --cli-input-json`: an on-demand table with a string partition key.
func (t dynamoTable) createTableInput() ([]byte, error) {
	type attr struct{ AttributeName, AttributeType string }
	type key struct{ AttributeName, KeyType string }
	return json.Marshal(struct {
		TableName            string
		AttributeDefinitions []attr
		KeySchema            []key
		BillingMode          string
	}{
		TableName:            t.table,
		AttributeDefinitions: []attr{{t.hashKey, "S"}},
		KeySchema:            []key{{t.hashKey, "HASH"}},
		BillingMode:          "PAY_PER_REQUEST",
	})
}

// dynamoSchema prints one create-table command per DynamoDB-backed type,
// each line prefixed with prefix ("" for a shell script, "-- " inside SQL).
func dynamoSchema(out io.Writer, prefix string) error {
	var b strings.Builder
	for i, t := range dynamoTables() {
		in, err := t.createTableInput()
		if err != nil {
			return err
		}
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "# %s: %s\n", t.typ, t.use)
		fmt.Fprintf(&b, "aws dynamodb create-table --cli-input-json '%s'\n", in)
		if t.after != "" {
			fmt.Fprintln(&b, t.after)
		}
	}
	lines := strings.SplitAfter(b.String(), "\n")
	for _, l := range lines {
		if l == "" {
			continue
		}
		if _, err := io.WriteString(out, strings.TrimRight(prefix+l, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// offline satisfies the packages' DB interfaces without a database: the
// schema command only asks for SQL text.
type offline struct{}

func (offline) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errOffline
}
func (offline) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errOffline }
func (offline) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow{} }
func (offline) Begin(context.Context) (pgx.Tx, error)                   { return nil, errOffline }
func (offline) Acquire(context.Context) (*pgxpool.Conn, error)          { return nil, errOffline }

type errRow struct{}

func (errRow) Scan(...any) error { return errOffline }

var errOffline = fmt.Errorf("nolock schema: no database")
