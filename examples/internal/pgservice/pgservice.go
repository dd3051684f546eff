// Package pgservice is what the example services on PostgreSQL share
// besides package service: the pool on DATABASE_URL, and the HTTP status
// of package conditional's errors. It is apart from package service so
// that a service on DynamoDB alone links no pgx.
package pgservice

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/service"
)

// Pool opens a pool on DATABASE_URL (a libpq URL or key=value string;
// pgx reads the PG* variables for what it leaves out), checks it answers,
// registers its health check ("postgres": a ping) and closes it at the
// end. It exits 2 when DATABASE_URL is not set, 1 when the database does
// not answer.
func Pool(s *service.Service) *pgxpool.Pool {
	s.Require("DATABASE_URL")
	pool, err := pgxpool.New(s.Context(), s.Env("DATABASE_URL", ""))
	if err == nil {
		err = pool.Ping(s.Context())
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		s.Fatal(fmt.Errorf("DATABASE_URL: %w", err))
	}
	s.OnStop(func() error { pool.Close(); return nil })
	s.Check("postgres", pool.Ping)
	return pool
}

// Status is the HTTP status a conditional error means: 409 for a refusal
// (sold out, held, confirmed, not the holder, fenced), 404 for an unknown
// key, 400 for bad input, 503 when the outcome is unknown (the client
// reads the state, or retries what is idempotent), 500 otherwise.
func Status(err error) int {
	switch {
	case errors.Is(err, conditional.ErrSoldOut), errors.Is(err, conditional.ErrHeld), errors.Is(err, conditional.ErrConfirmed),
		errors.Is(err, conditional.ErrNotHolder), errors.Is(err, conditional.ErrFenced):
		return http.StatusConflict
	case errors.Is(err, conditional.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, conditional.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, conditional.ErrAmbiguousCommit):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
