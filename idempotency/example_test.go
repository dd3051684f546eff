package idempotency_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). Under go test, TestMain points DATABASE_URL at a
// fresh schema on the test services (see testenv.ExampleMain), so the
// examples run and their Output is checked.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
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
	key := uuid.NewString() // the client's Idempotency-Key, sent again with its retry
	fp := idempotency.Fingerprint([]byte("alice"), []byte("1500"))
	for range 2 { // the second call is the client's retry
		res, err := store.Do(ctx, "payments", key, fp, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s, replayed: %v\n", res.Body, res.Replayed)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// charge 1, replayed: false
	// charge 1, replayed: true
	// charges: 1
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
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallets (id text PRIMARY KEY, balance bigint);
		INSERT INTO wallets VALUES ('w1', 5000)`); err != nil {
		log.Fatal(err)
	}
	const debit = `UPDATE wallets SET balance = balance - $1 WHERE id = $2 AND balance >= $1 RETURNING balance`
	key := uuid.NewString()
	fp := idempotency.Fingerprint([]byte("w1"), []byte("2000"))
	for range 2 { // the request, then its retry
		res, err := store.Exec(ctx, "debits", key, fp, debit, 2000, "w1")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s, replayed: %v\n", res.Body, res.Replayed)
	}
	// Output:
	// [{"balance":3000}], replayed: false
	// [{"balance":3000}], replayed: true
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
	key := uuid.NewString()
	for range 2 { // the request, then its retry
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set(idempotency.HeaderKey, key)
		rec := httptest.NewRecorder()
		orders.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body.String(), "replayed:", rec.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 order 1 replayed: false
	// 201 order 1 replayed: true
}

// The README's quickstart: a payment debits once, however often it is
// retried, and a debit the balance cannot cover is declined: the wallet
// keeps its balance and the key stores "declined", never "paid".
func ExampleStore_Do_quickstart() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	setup, _ := idempotency.New(pool)
	if err := setup.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallets (id text PRIMARY KEY, balance bigint);
		INSERT INTO wallets VALUES ('w7', 10)`); err != nil {
		log.Fatal(err)
	}
	errDeclined := errors.New("declined: insufficient funds")
	pay := func(ctx context.Context, key, wallet string, amount int64, request []byte) ([]byte, error) {
		keys, err := idempotency.New(pool) // once: keys.CreateSchema(ctx)
		if err != nil {
			return nil, err
		}
		defer keys.Close()
		res, err := keys.Do(ctx, "payments", key, idempotency.Fingerprint(request),
			func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				tag, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance - $1
					WHERE id = $2 AND balance >= $1`, amount, wallet)
				if err != nil {
					return nil, err // rolled back, nothing stored: a retry runs this again
				}
				if tag.RowsAffected() == 0 { // the balance does not cover it: nothing debited
					return []byte("declined"), idempotency.Terminal(errDeclined) // stored: a retry gets "declined"
				}
				return []byte("paid"), nil // stored with the key, in this transaction
			})
		if err != nil {
			return nil, err
		}
		return res.Body, nil // a retry with the same key gets the same body (res.Replayed)
	}
	for _, p := range []struct {
		key    string
		amount int64
	}{{"pay-1", 100}, {"pay-1", 100}, {"pay-2", 4}, {"pay-2", 4}} { // each sent, then retried
		body, err := pay(ctx, p.key, "w7", p.amount, fmt.Appendf(nil, "w7 %d", p.amount))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s %d: %s\n", p.key, p.amount, body)
	}
	var balance int64
	_ = pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE id = 'w7'`).Scan(&balance)
	fmt.Println("balance:", balance)
	// Output:
	// pay-1 100: declined
	// pay-1 100: declined
	// pay-2 4: paid
	// pay-2 4: paid
	// balance: 6
}

// A payment with its ledger row, keyed by the payment's idempotency key:
// the debit, the ledger row and the stored answer commit together; a
// debit the balance cannot cover is a terminal outcome, stored and
// replayed like a success.
func ExampleTerminal() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallets (id text PRIMARY KEY, balance bigint);
		INSERT INTO wallets VALUES ('alice', 1000);
		CREATE TABLE ledger (payment text PRIMARY KEY, payer text, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	errInsufficient := errors.New("insufficient funds")
	pay := func(ctx context.Context, paymentKey, payer, payee string, amount int64) error {
		store, err := idempotency.New(pool) // *pgxpool.Pool; table nolock_idempotency
		if err != nil {
			return err
		}
		defer store.Close()
		if err := store.CreateSchema(ctx); err != nil { // or put store.Schema() in your migrations
			return err
		}

		fp := idempotency.Fingerprint([]byte(payer), []byte(payee), []byte(strconv.FormatInt(amount, 10)))
		res, err := store.Do(ctx, payer, paymentKey, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			tag, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance - $2 WHERE id = $1 AND balance >= $2`, payer, amount)
			if err != nil {
				return nil, err // rolls back; nothing stored; safe to retry
			}
			if tag.RowsAffected() == 0 {
				return []byte("declined"), idempotency.Terminal(errInsufficient) // stored and replayed
			}
			if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2, $3)`, paymentKey, payer, amount); err != nil {
				return nil, err
			}
			return []byte("paid"), nil
		})
		if err != nil {
			return err
		}
		// res.Body: "paid" or "declined"; res.Replayed: true when fn did not run in this call
		fmt.Printf("%s: %s, replayed: %v\n", paymentKey, res.Body, res.Replayed)
		return nil
	}
	for _, key := range []string{"pay-1", "pay-1"} { // a payment and its retry
		if err := pay(ctx, key, "alice", "shop", 600); err != nil {
			log.Fatal(err)
		}
	}
	for _, key := range []string{"pay-2", "pay-2"} {
		if err := pay(ctx, key, "alice", "shop", 600); err != nil {
			log.Fatal(err)
		}
	}
	var balance, rows int64
	_ = pool.QueryRow(ctx, `SELECT (SELECT balance FROM wallets WHERE id = 'alice'), (SELECT count(*) FROM ledger)`).Scan(&balance, &rows)
	fmt.Println("balance:", balance, "ledger rows:", rows)
	// Output:
	// pay-1: paid, replayed: false
	// pay-1: paid, replayed: true
	// pay-2: declined, replayed: false
	// pay-2: declined, replayed: true
	// balance: 400 ledger rows: 1
}

// Exec: a one-statement effect whose RETURNING rows are the stored
// answer; no row returned is a terminal outcome, replayed as such.
func ExampleStore_Exec_declined() {
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
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallets (id text PRIMARY KEY, balance bigint);
		INSERT INTO wallets VALUES ('bob', 10000)`); err != nil {
		log.Fatal(err)
	}
	debit := func(ctx context.Context, paymentKey, payer string, amount int64) error {
		fp := idempotency.Fingerprint([]byte(payer), []byte(strconv.FormatInt(amount, 10)))
		res, err := store.Exec(ctx, payer, paymentKey, fp,
			`UPDATE wallets SET balance = balance - $2 WHERE id = $1 AND balance >= $2 RETURNING balance`,
			payer, amount)
		if err != nil {
			return err
		}
		// first call:  res.Body = [{"balance":9500}]
		// a retry:     the same body, res.Replayed = true; the UPDATE does not run
		// no funds:    res.Terminal = true, res.Body = [] (no row returned), replayed as such
		fmt.Printf("%s replayed: %v, terminal: %v\n", res.Body, res.Replayed, res.Terminal)
		return nil
	}
	for _, p := range []struct {
		key    string
		amount int64
	}{{"pay-1", 500}, {"pay-1", 500}, {"pay-2", 20000}, {"pay-2", 20000}} {
		if err := debit(ctx, p.key, "bob", p.amount); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// [{"balance":9500}] replayed: false, terminal: false
	// [{"balance":9500}] replayed: true, terminal: false
	// [] replayed: false, terminal: true
	// [] replayed: true, terminal: true
}

// The middleware scoped by the caller's account, on your own mux: the
// handler makes its effect through the key's transaction.
func ExampleWithScope() {
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
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, account text)`); err != nil {
		log.Fatal(err)
	}
	accountOf := func(r *http.Request, _ []byte) string { return r.Header.Get("Account") } // after authentication
	mux := http.NewServeMux()
	serve := func() error {
		mw, err := idempotency.Middleware(store, idempotency.WithScope(accountOf),
			idempotency.WithFingerprint(idempotency.JSONFingerprint)) // reordered JSON keys: the same request
		if err != nil {
			return err
		}
		mux.Handle("/payments", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, _ := idempotency.TxFromContext(r.Context()) // make the effect through tx
			var id int64
			if err := tx.QueryRow(r.Context(), `INSERT INTO payments (account) VALUES ($1) RETURNING id`, accountOf(r, nil)).Scan(&id); err != nil {
				http.Error(w, "payment failed", http.StatusInternalServerError) // rolled back, not stored
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "payment %d", id)
		})))
		return nil
	}
	if err := serve(); err != nil {
		log.Fatal(err)
	}
	for _, account := range []string{"alice", "alice", "bob"} { // alice retries; bob sends the same key
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"cents":500}`))
		req.Header.Set(idempotency.HeaderKey, "key-1")
		req.Header.Set("Account", account)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		fmt.Println(account, rec.Code, rec.Body.String(), "replayed:", rec.Header().Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// alice 201 payment 1 replayed: false
	// alice 201 payment 1 replayed: true
	// bob 201 payment 2 replayed: false
}
