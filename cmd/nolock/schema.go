package main

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
)

// schema prints the DDL of every PostgreSQL table the packages need, with
// their default names, for migration tools. Nothing connects anywhere: the
// constructors only render SQL.
func schema(out io.Writer) error {
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
	store, err := cas.NewPostgresBackend(db, "")
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
	for _, part := range []struct{ name, ddl string }{
		{"conditional.Stock", stock.Schema()},
		{"conditional.Accounts", accounts.Schema()},
		{"conditional.Holds", holds.Schema()},
		{"cas.PostgresBackend", store.Schema()},
		{"idempotency.Store", keys.Schema()},
		{"inbox.Inbox", in.Schema()},
	} {
		if _, err := fmt.Fprintf(out, "-- %s\n%s\n", part.name, part.ddl); err != nil {
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
