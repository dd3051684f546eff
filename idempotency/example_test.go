package idempotency_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). They have no Output comment, so go test only
// compiles them; TestExamples runs each one against the test services and
// checks what it prints.

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// A client retries a payment with the same key: the charge runs once and
// the retry replays its stored result.
func ExampleStore_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, _ := idempotency.New(pool)
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (id bigserial PRIMARY KEY, cents int)`); err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO charges (cents) VALUES (1500) RETURNING id`).Scan(&id)
		return fmt.Appendf(nil, "charge %d", id), err
	}
	fp := idempotency.Fingerprint([]byte("alice"), []byte("1500"))
	for range 2 { // the second call is the client's retry
		res, err := store.Do(ctx, "payments", "key-7f3a", fp, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s, replayed: %v\n", res.Body, res.Replayed)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
}

// One statement and its idempotency record in one implicit transaction:
// a retried debit replays the first answer instead of debiting again.
func ExampleStore_Exec() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, _ := idempotency.New(pool)
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE wallets (id text PRIMARY KEY, cents int);
		INSERT INTO wallets VALUES ('w1', 5000)`); err != nil {
		log.Fatal(err)
	}
	const debit = `UPDATE wallets SET cents = cents - $1 WHERE id = $2 AND cents >= $1 RETURNING cents`
	fp := idempotency.Fingerprint([]byte("w1"), []byte("2000"))
	for range 2 {
		res, err := store.Exec(ctx, "debits", "key-91c2", fp, debit, 2000, "w1")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s, replayed: %v\n", res.Body, res.Replayed)
	}
}

// HTTP POSTs with an Idempotency-Key header: the handler runs inside the
// key's transaction, and a retried request gets the stored response.
func ExampleMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, _ := idempotency.New(pool)
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, item text)`); err != nil {
		log.Fatal(err)
	}
	mw, err := idempotency.Middleware(store)
	if err != nil {
		log.Fatal(err)
	}
	orders := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ('book') RETURNING id`).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", id)
	}))
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set(idempotency.HeaderKey, "key-c0ffee")
		rec := httptest.NewRecorder()
		orders.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body.String(), "replayed:", rec.Header().Get("Idempotent-Replayed") == "true")
	}
}

// TestExamples runs each Example against the test services, in a fresh
// schema (DATABASE_URL).
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name string
		run  func()
		want string
	}{
		{"Store_Do", ExampleStore_Do, "charge 1, replayed: false\ncharge 1, replayed: true\ncharges: 1\n"},
		{"Store_Exec", ExampleStore_Exec, "[{\"cents\":3000}], replayed: false\n[{\"cents\":3000}], replayed: true\n"},
		{"Middleware", ExampleMiddleware, "201 order 1 replayed: false\n201 order 1 replayed: true\n"},
	} {
		t.Run(ex.name, func(t *testing.T) {
			t.Setenv("DATABASE_URL", testenv.PostgresFreshDSN(t))
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}
