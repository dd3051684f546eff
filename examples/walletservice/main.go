// Command walletservice is an HTTP wallet whose debits take effect once per
// Idempotency-Key: idempotency.Middleware runs the debit handler inside
// Store.Do's transaction, so the key, the debit, the ledger row and the
// stored response commit together. A client that lost the reply sends the
// same request with the same key and gets the first answer again
// (Idempotent-Replayed: true); the same key with another body is refused
// (422); a debit past the balance is declined (402), once, and replayed
// as declined.
//
// Environment:
//
//	DATABASE_URL   PostgreSQL (required); the tables are created at start
//	ADDR           listen address (default :8080)
//	REAP_INTERVAL  how often expired idempotency records are reaped (default 1m)
//
// Try it:
//
//	DATABASE_URL=postgres://postgres@localhost:5432/postgres go run ./examples/walletservice
//	curl -X PUT localhost:8080/wallets/w1 -d '{"balance": 10000}'
//	curl -X POST localhost:8080/wallets/w1/debits -H 'Idempotency-Key: pay-1' -d '{"amount": 250}'
//	curl -X POST localhost:8080/wallets/w1/debits -H 'Idempotency-Key: pay-1' -d '{"amount": 250}'  # replayed
//	curl localhost:8080/wallets/w1
//	curl localhost:8080/healthz; curl localhost:8080/metrics
//
// The key's scope is the wallet (WithScope): a real service would scope it
// by the authenticated customer instead.
package main

import (
	"context"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/examples/internal/pgservice"
	"github.com/nolock/nolock/examples/internal/service"
	"github.com/nolock/nolock/idempotency"
)

const schema = `
CREATE TABLE IF NOT EXISTS wallets (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS wallet_ledger (wallet text NOT NULL, idempotency_key text NOT NULL, amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())`

func main() {
	s := service.New("walletservice")
	s.Require("DATABASE_URL")
	pool := pgservice.Pool(s)
	store, err := idempotency.New(pool, idempotency.WithObserver(s.Observer()))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(store.Close)
	if err := store.CreateSchema(s.Context()); err != nil {
		s.Fatal(err)
	}
	if _, err := pool.Exec(s.Context(), schema); err != nil {
		s.Fatal(err)
	}
	s.Reap("idempotency", func(ctx context.Context) (int64, error) { return store.Reap(ctx, 1000) })

	once, err := idempotency.Middleware(store, idempotency.WithScope(func(r *http.Request, _ []byte) string {
		return "wallet:" + r.PathValue("id")
	}))
	if err != nil {
		s.Fatal(err)
	}
	w := wallets{pool}
	s.HandleFunc("PUT /wallets/{id}", w.open)
	s.HandleFunc("GET /wallets/{id}", w.get)
	s.Handle("POST /wallets/{id}/debits", once(http.HandlerFunc(w.debit)))
	s.Run()
}

type wallets struct{ pool *pgxpool.Pool }

type wallet struct {
	ID      string `json:"id"`
	Balance int64  `json:"balance"`
}

// open creates the wallet with its opening balance, or answers 200 with
// the balance of the wallet that exists.
func (ws wallets) open(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Balance int64 `json:"balance"`
	}
	if !service.ReadJSON(w, r, &req) {
		return
	}
	if req.Balance < 0 {
		service.Error(w, http.StatusBadRequest, "balance must not be negative")
		return
	}
	tag, err := ws.pool.Exec(r.Context(), `INSERT INTO wallets VALUES ($1, $2) ON CONFLICT DO NOTHING`, r.PathValue("id"), req.Balance)
	if err != nil {
		service.Error(w, http.StatusInternalServerError, err.Error())
		return
	}
	status := http.StatusCreated
	if tag.RowsAffected() == 0 {
		status = http.StatusOK
	}
	ws.answer(w, r, status)
}

func (ws wallets) get(w http.ResponseWriter, r *http.Request) { ws.answer(w, r, http.StatusOK) }

// answer writes the wallet's balance with status, or 404.
func (ws wallets) answer(w http.ResponseWriter, r *http.Request, status int) {
	wl := wallet{ID: r.PathValue("id")}
	err := ws.pool.QueryRow(r.Context(), `SELECT balance FROM wallets WHERE id = $1`, wl.ID).Scan(&wl.Balance)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		service.Error(w, http.StatusNotFound, "no such wallet")
	case err != nil:
		service.Error(w, http.StatusInternalServerError, err.Error())
	default:
		service.JSON(w, status, wl)
	}
}

// debit runs inside the middleware's transaction: the balance check and
// the debit are one conditional UPDATE, and the ledger row commits with
// it and with the idempotency key's stored response.
func (ws wallets) debit(w http.ResponseWriter, r *http.Request) {
	tx, _ := idempotency.TxFromContext(r.Context())
	var req struct {
		Amount int64 `json:"amount"`
	}
	if !service.ReadJSON(w, r, &req) {
		return
	}
	if req.Amount <= 0 {
		service.Error(w, http.StatusBadRequest, "amount must be positive")
		return
	}
	id := r.PathValue("id")
	wl := wallet{ID: id}
	err := tx.QueryRow(r.Context(), `UPDATE wallets SET balance = balance - $2 WHERE id = $1 AND balance >= $2 RETURNING balance`, id, req.Amount).Scan(&wl.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		var exists bool
		if err := tx.QueryRow(r.Context(), `SELECT EXISTS (SELECT FROM wallets WHERE id = $1)`, id).Scan(&exists); err != nil {
			service.Error(w, http.StatusInternalServerError, err.Error())
		} else if !exists {
			service.Error(w, http.StatusNotFound, "no such wallet")
		} else {
			service.Error(w, http.StatusPaymentRequired, "insufficient funds") // a 4xx is stored: replays decline too
		}
		return
	}
	if err != nil {
		service.Error(w, http.StatusInternalServerError, err.Error()) // a 5xx rolls back and is not stored
		return
	}
	if _, err := tx.Exec(r.Context(), `INSERT INTO wallet_ledger (wallet, idempotency_key, amount) VALUES ($1, $2, $3)`,
		id, r.Header.Get(idempotency.HeaderKey), req.Amount); err != nil {
		service.Error(w, http.StatusInternalServerError, err.Error())
		return
	}
	service.JSON(w, http.StatusCreated, wl)
}
