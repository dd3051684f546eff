package pgoutcome_test

import (
	"context"
	"errors"
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

// A commit that outlives its caller's deadline: the caller is told the
// outcome is unknown, and the commit is not cancelled on the server.
func ExampleCommit() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller's deadline has passed
	release := make(chan struct{})
	err := pgoutcome.Commit(ctx, func(ctx context.Context) error {
		<-release        // the COMMIT, waiting for a synchronous standby
		return ctx.Err() // never cancelled
	})
	close(release)
	fmt.Println(pgoutcome.Of(err), errors.Is(err, pgoutcome.ErrStoppedWaiting))
	// Output: unknown true
}
