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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
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
	pool := s.Postgres()
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
	j := &job{s: s, name: name, every: every, pool: pool, client: client, fenced: fenced}
	s.Go("leader", j.run)
	s.HandleFunc("GET /leader", func(w http.ResponseWriter, _ *http.Request) {
		service.JSON(w, http.StatusOK, map[string]any{"owner": client.Owner(), "leader": j.token.Load() > 0, "token": j.token.Load(), "pages": j.pages.Load()})
	})
	s.Run()
}

type job struct {
	s      *service.Service
	name   string
	every  time.Duration
	pool   *pgxpool.Pool
	client *lease.Client
	fenced *conditional.Fenced
	token  atomic.Int64 // the lease's token while this replica leads, else 0
	pages  atomic.Int64 // pages this replica sent
}

// run waits for the lease, leads while it holds it, and waits again,
// until ctx ends.
func (j *job) run(ctx context.Context) error {
	for {
		lock, err := j.client.Acquire(ctx, j.name)
		if ctx.Err() != nil {
			if lock != nil {
				j.release(ctx, lock)
			}
			return nil
		}
		if err != nil {
			j.s.Log.Warn("acquire", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		j.lead(ctx, lock)
	}
}

// lead sends a page every interval until ctx ends or the lease is lost,
// then releases the lease.
func (j *job) lead(ctx context.Context, lock *lease.Lock) {
	j.token.Store(lock.Token())
	j.s.Log.Info("leading", "job", j.name, "token", lock.Token())
	defer j.release(ctx, lock)
	t := time.NewTicker(j.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lock.Lost():
			j.s.Log.Warn("lease lost", "err", lock.Err())
			return
		case <-t.C:
		}
		// The page runs under the lock's context: a stop does not cut it
		// short, a loss of the lease does (and the fence refuses it anyway).
		pctx, cancel := context.WithTimeout(lock.Context(), 10*time.Second)
		err := j.page(pctx, lock.Token())
		cancel()
		switch {
		case errors.Is(err, conditional.ErrFenced):
			j.s.Log.Warn("fenced: a newer leader has written", "token", lock.Token())
			return
		case err != nil:
			j.s.Log.Warn("page", "err", err)
		default:
			j.pages.Add(1)
		}
	}
}

// page sends the next page: it locks the cursor, records the page, and
// advances the cursor only if no newer token has written it.
func (j *job) page(ctx context.Context, token int64) error {
	return pgx.BeginFunc(ctx, j.pool, func(tx pgx.Tx) error {
		var next int64
		if err := tx.QueryRow(ctx, `SELECT next_page FROM job_cursor WHERE job = $1 FOR UPDATE`, j.name).Scan(&next); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO job_pages (job, page, token, owner) VALUES ($1, $2, $3, $4)`, j.name, next, token, j.client.Owner()); err != nil {
			return err
		}
		return j.fenced.Update(ctx, tx, j.name, token, map[string]any{"next_page": next + 1})
	})
}

func (j *job) release(ctx context.Context, lock *lease.Lock) {
	j.token.Store(0)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := lock.Release(rctx); err != nil {
		j.s.Log.Warn("release", "err", err)
		return
	}
	j.s.Log.Info("released", "job", j.name, "token", lock.Token())
}
