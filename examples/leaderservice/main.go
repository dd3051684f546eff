// Command leaderservice runs a job on one replica at a time: every replica
// waits for the job's lease (package lease, a row in PostgreSQL); the one
// that holds it sends the job's next page every JOB_INTERVAL, and each
// page's write is fenced by the lease's token (conditional.Fenced), so a
// leader that paused past its lease (a GC pause, a frozen VM) and wakes to
// write after a newer leader has is refused, and no page is sent twice.
//
// On SIGTERM the leader finishes the page in hand, releases the lease (the
// next replica takes over at once, without waiting for the lease to run
// out), and exits.
//
// Environment:
//
//	DATABASE_URL  PostgreSQL (required); the lease and job tables are created at start
//	JOB           the job's name, the lease's key (default invoicing)
//	JOB_INTERVAL  time between pages (default 1s)
//	LEASE         the lease (default 15s): how long a crashed leader blocks the job
//	ADDR          listen address (default :8080)
//
// The lease package deletes no rows (one per job, kept for its token), so
// this service schedules no reaper.
//
// Try it (two replicas):
//
//	export DATABASE_URL=postgres://postgres@localhost:5432/postgres
//	ADDR=:8080 go run ./examples/leaderservice & ADDR=:8081 go run ./examples/leaderservice &
//	curl localhost:8080/leader; curl localhost:8081/leader
//	kill %1   # if :8080 led, :8081 takes over with a higher token
package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/pgservice"
	"github.com/nolock/nolock/examples/internal/service"
	"github.com/nolock/nolock/lease"
)

const schema = `
CREATE TABLE IF NOT EXISTS job_cursor (job text PRIMARY KEY, next_page bigint NOT NULL, fence bigint);
CREATE TABLE IF NOT EXISTS job_pages (job text NOT NULL, page bigint NOT NULL, token bigint NOT NULL, owner text NOT NULL, at timestamptz NOT NULL DEFAULT now())`

func main() {
	s := service.New("leaderservice")
	s.Require("DATABASE_URL")
	name := s.Env("JOB", "invoicing")
	every := s.Duration("JOB_INTERVAL", time.Second)
	pool := pgservice.Pool(s)
	client, err := lease.New(pool, lease.WithLease(s.Duration("LEASE", 15*time.Second)), lease.WithObserver(s.Observer()), lease.WithLogger(s.Log))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(client.Close)
	fenced, err := conditional.NewFenced("job_cursor", "job", "fence", conditional.WithObserver(s.Observer()))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(fenced.Close)
	if err := client.CreateSchema(s.Context()); err != nil {
		s.Fatal(err)
	}
	if _, err := pool.Exec(s.Context(), schema); err != nil {
		s.Fatal(err)
	}
	if _, err := pool.Exec(s.Context(), `INSERT INTO job_cursor VALUES ($1, 0, NULL) ON CONFLICT DO NOTHING`, name); err != nil {
		s.Fatal(err)
	}
	j := job{name: name, pool: pool, owner: client.Owner(), fenced: fenced}
	leader := &service.Leader{
		Acquire: func(ctx context.Context) (service.Lock, error) { return client.Acquire(ctx, name) },
		Step:    j.page,
		Fenced:  func(err error) bool { return errors.Is(err, conditional.ErrFenced) },
		Every:   every,
	}
	s.Lead(leader)
	s.HandleFunc("GET /leader", func(w http.ResponseWriter, _ *http.Request) { service.JSON(w, http.StatusOK, leader.Status()) })
	s.Run()
}

type job struct {
	name, owner string
	pool        *pgxpool.Pool
	fenced      *conditional.Fenced
}

// page sends the next page: it locks the cursor, records the page, and
// advances the cursor only if no newer token has written it.
func (j job) page(ctx context.Context, token int64) error {
	return pgx.BeginFunc(ctx, j.pool, func(tx pgx.Tx) error {
		var next int64
		if err := tx.QueryRow(ctx, `SELECT next_page FROM job_cursor WHERE job = $1 FOR UPDATE`, j.name).Scan(&next); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO job_pages (job, page, token, owner) VALUES ($1, $2, $3, $4)`, j.name, next, token, j.owner); err != nil {
			return err
		}
		return j.fenced.Update(ctx, tx, j.name, token, map[string]any{"next_page": next + 1})
	})
}
