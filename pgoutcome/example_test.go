package pgoutcome_test

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/pgoutcome"
)

// What three failed commits prove.
func ExampleOf() {
	for _, err := range []error{
		&pgconn.PgError{Severity: "ERROR", Code: "23505"},                                  // unique violation
		&pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "server conn crashed?"}, // PgBouncer
		fmt.Errorf("commit: %w", io.ErrUnexpectedEOF),                                      // connection lost
		nil,
	} {
		fmt.Println(pgoutcome.Of(err))
	}
	// Output:
	// refused
	// unknown
	// unknown
	// committed
}

// A commit whose caller's deadline has passed: it still runs, never
// cancelled by the caller's context, and Commit returns its own outcome.
func ExampleCommit() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller's deadline has passed
	err := pgoutcome.Commit(ctx, func(ctx context.Context) error {
		return ctx.Err() // the COMMIT: its context is not the caller's
	})
	fmt.Println(pgoutcome.Of(err))
	// Output: committed
}
