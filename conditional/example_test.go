package conditional_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). Under go test, TestMain points DATABASE_URL at a
// fresh schema on the test services (see testenv.ExampleMain), so the
// examples run and their Output is checked.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
)

// Eight buyers race for five units: exactly five are sold, never more.
func ExampleStock_Take() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	stock, _ := conditional.NewStock(pool)
	defer stock.Close()
	if err := stock.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if err := stock.Put(ctx, "sku-42", 5); err != nil {
		log.Fatal(err)
	}
	var sold, soldOut atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch err := stock.Take(ctx, "sku-42", 1); {
			case err == nil:
				sold.Add(1)
			case errors.Is(err, conditional.ErrSoldOut):
				soldOut.Add(1)
			default:
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("sold:", sold.Load(), "sold out:", soldOut.Load())
	// Output:
	// sold: 5 sold out: 3
}

// A debit the balance cannot cover is refused and changes nothing.
func ExampleAccounts_Debit() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	accounts, _ := conditional.NewAccounts(pool)
	defer accounts.Close()
	if err := accounts.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if err := accounts.Open(ctx, "wallet-7", 100_00); err != nil { // cents
		log.Fatal(err)
	}
	fmt.Println("first:", accounts.Debit(ctx, "wallet-7", 70_00))
	err = accounts.Debit(ctx, "wallet-7", 70_00)
	fmt.Println("second refused:", errors.Is(err, conditional.ErrInsufficient))
	balance, _ := accounts.Balance(ctx, "wallet-7")
	fmt.Println("balance:", balance)
	// Output:
	// first: <nil>
	// second refused: true
	// balance: 3000
}

// A seat held by one buyer cannot be held by another until the hold
// expires or is released; the holder confirms it.
func ExampleHolds_Hold() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	seats, _ := conditional.NewHolds(pool)
	if err := seats.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if err := seats.Add(ctx, "show-9/12A"); err != nil {
		log.Fatal(err)
	}
	_, err = seats.Hold(ctx, "show-9/12A", "alice", 10*time.Minute)
	fmt.Println("alice holds:", err == nil)
	_, err = seats.Hold(ctx, "show-9/12A", "bob", 10*time.Minute)
	fmt.Println("bob refused:", errors.Is(err, conditional.ErrHeld))
	fmt.Println("alice confirms:", seats.Confirm(ctx, "show-9/12A", "alice"))
	// Output:
	// alice holds: true
	// bob refused: true
	// alice confirms: <nil>
}

// A hold that expired cannot be confirmed, even if no one took the seat:
// the database's clock decides, not the holder's belief.
func ExampleHolds_Confirm() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	seats, _ := conditional.NewHolds(pool)
	if err := seats.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	_ = seats.Add(ctx, "show-9/12B")
	if _, err := seats.Hold(ctx, "show-9/12B", "carol", 10*time.Millisecond); err != nil {
		log.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // carol is slow to pay
	err = seats.Confirm(ctx, "show-9/12B", "carol")
	fmt.Println("expired hold refused:", errors.Is(err, conditional.ErrNotHolder))
	// Output:
	// expired hold refused: true
}

// A leader paused past its lease wakes up with an old token: its write is
// refused because a newer leader wrote the row.
func ExampleFenced_Update() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE manifest (dataset text PRIMARY KEY, files text, fence bigint);
		INSERT INTO manifest VALUES ('events', 'seg-0001', NULL)`); err != nil {
		log.Fatal(err)
	}
	manifest, _ := conditional.NewFenced("manifest", "dataset", "fence")
	fmt.Println("new leader (token 8):", manifest.Update(ctx, pool, "events", 8, map[string]any{"files": "seg-0102"}))
	err = manifest.Update(ctx, pool, "events", 7, map[string]any{"files": "seg-0101"})
	fmt.Println("old leader (token 7) fenced:", errors.Is(err, conditional.ErrFenced))
	var files string
	_ = pool.QueryRow(ctx, `SELECT files FROM manifest WHERE dataset = 'events'`).Scan(&files)
	fmt.Println("files:", files)
	// Output:
	// new leader (token 8): <nil>
	// old leader (token 7) fenced: true
	// files: seg-0102
}

// The README's quickstart: one unit of stock taken, never below zero, with
// no lock; the second take finds none left.
func ExampleStock_Take_quickstart() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	setup, _ := conditional.NewStock(pool)
	if err := setup.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if err := setup.Put(ctx, "sku-42", 1); err != nil {
		log.Fatal(err)
	}
	setup.Close()
	errSoldOut := errors.New("sold out")
	take := func(ctx context.Context) error {
		stock, err := conditional.NewStock(pool) // pool: your *pgxpool.Pool
		if err != nil {
			return err
		}
		defer stock.Close()
		// Once: stock.CreateSchema(ctx) (or `nolock schema`), stock.Put(ctx, "sku-42", 300).
		err = stock.Take(ctx, "sku-42", 1) // UPDATE … SET qty = qty - 1 WHERE … AND qty >= 1
		if errors.Is(err, conditional.ErrSoldOut) {
			return errSoldOut // nothing was taken
		}
		return err // nil: the unit is yours
	}
	fmt.Println("first:", take(ctx))
	fmt.Println("second:", take(ctx))
	// Output:
	// first: <nil>
	// second: sold out
}

// A Stock's life: the schema, a restock, a take, what is left.
func ExampleNewStock() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	sell := func(ctx context.Context) error {
		stock, err := conditional.NewStock(pool) // *pgxpool.Pool
		if err != nil {
			return err
		}
		defer stock.Close()
		if err := stock.CreateSchema(ctx); err != nil { // or put stock.Schema() in your migrations
			return err
		}
		if err := stock.Put(ctx, "sku-9", 500); err != nil { // restock / return, creates the key
			return err
		}
		if err := stock.Take(ctx, "sku-9", 2); err != nil { // nil: both units are yours
			return err
		}
		n, err := stock.Available(ctx, "sku-9")
		fmt.Println("available:", n)
		return err
	}
	if err := sell(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: available: 498
}

// A replica of eight selling one hot SKU from a row of its own.
func ExampleWithHome() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	setup, _ := conditional.NewStock(pool)
	if err := setup.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	setup.Close()
	replica := 3
	sell := func(ctx context.Context) error {
		stock, err := conditional.NewStock(pool,
			conditional.WithBuckets(8),                // as many buckets as replicas (every Stock on the table: the same)
			conditional.WithHome(replica%8),           // this replica's row: its StatefulSet ordinal, say
			conditional.WithEndgame(1000),             // the last 1,000 units: gathered into bucket 0
			conditional.WithSoldOutCache(time.Second), // optional: answer the end of the sale without a query
		)
		if err != nil {
			return err
		}
		defer stock.Close()
		if err := stock.Put(ctx, "sku-43", 200_000); err != nil { // spread evenly: 25,000 per bucket
			return err
		}
		if err := stock.Take(ctx, "sku-43", 1); err != nil {
			return err
		}
		n, err := stock.Available(ctx, "sku-43")
		fmt.Println("available:", n)
		return err
	}
	if err := sell(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: available: 199999
}

// Seats held by one passenger, confirmed or released by that passenger
// only.
func ExampleNewHolds() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	book := func(ctx context.Context) error {
		holds, err := conditional.NewHolds(pool)
		if err != nil {
			return err
		}
		defer holds.Close()
		if err := holds.CreateSchema(ctx); err != nil {
			return err
		}
		if err := holds.Add(ctx, "train-12/seat-4A", "train-12/seat-4B"); err != nil {
			return err
		}
		// Hold returns when the hold ends; ErrHeld: someone else has it.
		if _, err := holds.Hold(ctx, "train-12/seat-4A", "alice", 10*time.Minute); err != nil {
			return err
		}
		_, err = holds.HoldAll(ctx, []string{"train-12/seat-4A", "train-12/seat-4B"}, "bob", 10*time.Minute)
		fmt.Println("bob refused:", errors.Is(err, conditional.ErrHeld)) // all or nothing: 4B stays free
		if _, err := holds.HoldAll(ctx, []string{"train-12/seat-4A", "train-12/seat-4B"}, "alice", 10*time.Minute); err != nil {
			return err
		}
		if err := holds.Confirm(ctx, "train-12/seat-4A", "alice"); err != nil { // ErrNotHolder once expired
			return err
		}
		return holds.Release(ctx, "train-12/seat-4B", "alice")
	}
	fmt.Println(book(ctx))
	// Output:
	// bob refused: true
	// <nil>
}

// Passengers who want any seat of a row: HoldAny picks one at random
// among the free ones and holds it, Get says who holds a seat and until
// when, Free which seats are free now.
func ExampleHolds_HoldAny() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pick := func(ctx context.Context) error {
		holds, err := conditional.NewHolds(pool)
		if err != nil {
			return err
		}
		defer holds.Close()
		if err := holds.CreateSchema(ctx); err != nil {
			return err
		}
		row := []string{"train-7/seat-1A", "train-7/seat-1B", "train-7/seat-1C"}
		if err := holds.Add(ctx, row...); err != nil {
			return err
		}
		// The seat it held; a *HoldError wrapping ErrHeld when none is free.
		seat, _, err := holds.HoldAny(ctx, row, "alice", 10*time.Minute)
		if err != nil {
			return err
		}
		st, err := holds.Get(ctx, seat) // Holder "" when free; Until on the database's clock
		if err != nil {
			return err
		}
		fmt.Println("alice holds her seat:", st.Holder == "alice", "confirmed:", st.Confirmed)
		free, err := holds.Free(ctx, row) // a snapshot: free now, maybe not a moment later
		if err != nil {
			return err
		}
		fmt.Println("free seats:", len(free))
		return holds.Confirm(ctx, seat, "alice")
	}
	fmt.Println(pick(ctx))
	// Output:
	// alice holds her seat: true confirmed: false
	// free seats: 2
	// <nil>
}

// Balances debited only when they cover the amount, and a debit that
// commits with the caller's own row.
func ExampleNewAccounts() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (payment text PRIMARY KEY, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	paymentKey := "pay-81"
	pay := func(ctx context.Context) error {
		accounts, err := conditional.NewAccounts(pool) // table nolock_accounts (key, bucket, balance)
		if err != nil {
			return err
		}
		defer accounts.Close()
		if err := accounts.CreateSchema(ctx); err != nil {
			return err
		}
		if err := accounts.Open(ctx, "alice", 100_000); err != nil { // minor units; creates if absent, else leaves it (retry-safe)
			return err
		}
		if err := accounts.Open(ctx, "merchant-7", 0); err != nil {
			return err
		}
		if err := accounts.Debit(ctx, "alice", 500); err != nil { // ErrInsufficient: nothing taken
			return err
		}
		if err := accounts.Credit(ctx, "merchant-7", 500); err != nil { // ErrNotFound for an account never opened
			return err
		}
		// A payment: the debit and its ledger row in ONE transaction.
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2) ON CONFLICT DO NOTHING`, paymentKey, 500)
			if err != nil || tag.RowsAffected() == 0 {
				return err // a retry of a payment already made
			}
			return accounts.DebitIn(ctx, tx, "alice", 500)
		})
	}
	if err := pay(ctx); err != nil {
		log.Fatal(err)
	}
	accounts, _ := conditional.NewAccounts(pool)
	defer accounts.Close()
	alice, _ := accounts.Balance(ctx, "alice")
	merchant, _ := accounts.Balance(ctx, "merchant-7")
	fmt.Println("alice:", alice, "merchant-7:", merchant)
	// Output: alice: 99000 merchant-7: 500
}

// Writes to your own table fenced by a token: a lower token than the one
// that last wrote is refused and changes nothing.
func ExampleNewFenced() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE documents (id text PRIMARY KEY, body text, fence bigint);
		INSERT INTO documents VALUES ('doc-1', '', NULL)`); err != nil {
		log.Fatal(err)
	}
	write := func(ctx context.Context, docID string, token int64, body string) error {
		f, err := conditional.NewFenced("documents", "id", "fence")
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Update(ctx, pool, docID, token, map[string]any{"body": body}) // ErrFenced: a newer holder wrote
	}
	fmt.Println("token 5:", write(ctx, "doc-1", 5, "v2"))
	err = write(ctx, "doc-1", 4, "v1") // an earlier holder, paused until now
	fmt.Println("token 4 fenced:", errors.Is(err, conditional.ErrFenced))
	// Output:
	// token 5: <nil>
	// token 4 fenced: true
}
