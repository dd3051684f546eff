// Package walletdebit is the seed article's UPI-style wallet debit with
// idempotency.Store, the story `nolock demo` tells (-run wallet;
// examples/walletservice is the service to copy): in one transaction,
// "UPDATE wallets SET balance = balance - $a WHERE account = $1 AND
// balance >= $a" and the payment's ledger row,
// keyed by the payment's idempotency key (Store.Do). With Via "exec" the
// debit is one statement through Store.Exec, and the key's record,
// written by the same statement, is the payment's ledger row. Payments
// arrive concurrently, each delivered several times at once (duplicate
// deliveries), and every delivery retries through timeouts and lost
// replies (client retries). Some wallets run dry, so some payments are
// declined; a declined payment stays declined on retry. A key reused for
// another payment is refused.
//
// At the end Run checks, and returns an error unless: every wallet's
// balance is its opening balance minus the sum of its distinct successful
// payments, each successful payment has exactly one ledger row (a declined
// one none), every delivery of a payment got the same answer, and no
// balance ever went below zero.
package walletdebit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/observe"
)

const (
	schema = `CREATE TABLE IF NOT EXISTS walletdebit_wallets (
    account text PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS walletdebit_ledger (
    payment text PRIMARY KEY,
    account text NOT NULL,
    amount bigint NOT NULL)`
)

var errInsufficient = errors.New("insufficient balance")

// debit is the whole payment: the conditional debit and the ledger row. It
// returns the answer to store for the payment's key.
func debit(ctx context.Context, tx pgx.Tx, account, payment string, amount int64) ([]byte, error) {
	tag, err := tx.Exec(ctx, `UPDATE walletdebit_wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2`, account, amount)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 0 {
		return []byte("declined"), idempotency.Terminal(errInsufficient) // decided: stored, replayed
	}
	if _, err := tx.Exec(ctx, `INSERT INTO walletdebit_ledger VALUES ($1, $2, $3)`, payment, account, amount); err != nil {
		return nil, err
	}
	return []byte("paid"), nil
}

// debitSQL is the debit as one statement, for Store.Exec: its RETURNING
// row is the stored answer, and no row (insufficient balance) is stored
// as a terminal outcome.
const debitSQL = `UPDATE walletdebit_wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2 RETURNING balance`

// pay runs one attempt of payment p through the Store, via Do or Exec,
// and returns its answer: "paid" or "declined".
func pay(ctx context.Context, store *idempotency.Store, via string, p payment, fp []byte) (idempotency.Result, string, error) {
	if via == "exec" {
		res, err := store.Exec(ctx, "", p.id, fp, debitSQL, p.account, p.amount)
		if res.Terminal {
			return res, "declined", err
		}
		return res, "paid", err
	}
	res, err := store.Do(ctx, "", p.id, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return debit(ctx, tx, p.account, p.id, p.amount)
	})
	return res, string(res.Body), err
}

// ledgerSQL counts the ledger rows of the payments matching a LIKE
// pattern: with Exec, the key records of paid payments are the ledger.
var ledgerSQL = map[string]string{
	"do":   `SELECT count(*) FROM walletdebit_ledger WHERE payment LIKE $1`,
	"exec": `SELECT count(*) FROM nolock_idempotency WHERE key LIKE $1 AND NOT terminal`,
}

type payment struct {
	id, account string
	amount      int64
}

// Config is where and how the story runs.
type Config struct {
	DSN        string           // PostgreSQL; the story's tables are made in its search_path
	Wallets    int              // wallets
	Opening    int64            // each wallet's opening balance, in paise
	Payments   int              // payments of 100 to 299 paise, each from a random wallet: some are declined if they ask more than the wallets hold
	Deliveries int              // concurrent deliveries of each payment
	Clients    int              // payments in flight at once
	Via        string           // "do": Store.Do with a ledger row; "exec": Store.Exec, one statement
	Cut        time.Duration    // shortest attempt timeout (a first attempt times out after Cut to Cut+100ms, each retry after twice as long)
	Out        io.Writer        // the transcript
	Observer   observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured.
type Report struct {
	Attempts   int64 // attempts of all deliveries
	CutShort   int64 // attempts that timed out or failed: nothing stored, retried
	Lost       int64 // answers lost on the way back, retried
	WaitedOut  int64 // attempts that found the payment in progress, retried
	Replayed   int64 // answers replayed from a payment's stored record
	Paid       int   // payments paid, each answered "paid" to every delivery
	Declined   int   // payments declined, each answered "declined" to every delivery
	LedgerRows int   // ledger rows of the run: one per paid payment
	Balanced   int   // wallets whose balance is the opening less their distinct paid payments
	KeyReuse   error // the answer to a key reused for another payment: a *idempotency.MismatchError
}

// Run tells the story and returns its report, or an error if a payment
// was applied twice, answered two ways, or a balance does not add up.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Via != "do" && cfg.Via != "exec" {
		return Report{}, fmt.Errorf("walletdebit: via %q: want do or exec", cfg.Via)
	}
	if cfg.Wallets < 1 || cfg.Opening < 0 || cfg.Payments < 1 || cfg.Deliveries < 1 || cfg.Clients < 1 || cfg.Cut <= 0 || cfg.Out == nil {
		return Report{}, errors.New("walletdebit: need 1 or more wallets, payments, deliveries and clients, an opening balance, a cut and an Out")
	}
	nWallets, nPayments, nDeliveries, via, out := cfg.Wallets, cfg.Payments, cfg.Deliveries, cfg.Via, cfg.Out
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return Report{}, err
	}
	pcfg.MaxConns = int32(cfg.Clients * nDeliveries)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	store, err := idempotency.New(pool, idempotency.WithWait(10*time.Second), idempotency.WithObserver(cfg.Observer))
	if err != nil {
		return Report{}, err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return Report{}, err
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return Report{}, err
	}
	opening := cfg.Opening
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	wallets := make([]string, nWallets)
	for i := range wallets {
		wallets[i] = fmt.Sprintf("%s/wallet-%d", runID, i)
		if _, err := pool.Exec(ctx, `INSERT INTO walletdebit_wallets VALUES ($1, $2)`, wallets[i], opening); err != nil {
			return Report{}, err
		}
	}
	pays := make([]payment, nPayments)
	for i := range pays {
		pays[i] = payment{runID + "/" + uuid.NewString(), wallets[rand.IntN(nWallets)], 100 + rand.Int64N(200)} // the client's key for the payment
	}

	// Every payment is delivered nDeliveries times at once; each delivery
	// retries, after a short pause, until it gets an answer: a short timeout
	// may cut an attempt anywhere before its commit, and a third of the
	// replies are "lost" (the client does not see them and retries anyway).
	var attempts, replays, timeouts, lost, inProgress atomic.Int64
	answers := make([][]string, nPayments)
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, cfg.Clients)
	for i, p := range pays {
		fp := idempotency.Fingerprint([]byte(p.account), []byte(strconv.FormatInt(p.amount, 10)))
		slots <- struct{}{}
		var deliveries sync.WaitGroup
		for d := 0; d < nDeliveries; d++ {
			wg.Add(1)
			deliveries.Add(1)
			go func() {
				defer wg.Done()
				defer deliveries.Done()
				for a := 0; ; a++ {
					if a > 0 {
						time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
					}
					attempts.Add(1)
					// Each retry gets twice the room of the last, so a
					// delivery ends even where every attempt of Cut's
					// length would be cut (a busy machine, a pooler's
					// slow logins), while early attempts are still cut
					// anywhere before their commit.
					actx, cancel := context.WithTimeout(ctx, cfg.Cut<<min(a, 12)+time.Duration(rand.IntN(100))*time.Millisecond)
					res, answer, err := pay(actx, store, via, p, fp)
					cancel()
					switch {
					case ctx.Err() != nil:
						return // the story is cancelled
					case errors.Is(err, idempotency.ErrInProgress):
						inProgress.Add(1)
						continue
					case err != nil:
						timeouts.Add(1) // timed out, or failed: nothing stored, retry
						continue
					case rand.IntN(3) == 0:
						lost.Add(1) // the reply is lost on the way back
						continue
					}
					if res.Replayed {
						replays.Add(1)
					}
					mu.Lock()
					answers[i] = append(answers[i], answer)
					mu.Unlock()
					return
				}
			}()
		}
		wg.Add(1)
		go func() { defer wg.Done(); deliveries.Wait(); <-slots }()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	rep := Report{Attempts: attempts.Load(), CutShort: timeouts.Load(), Lost: lost.Load(), WaitedOut: inProgress.Load(), Replayed: replays.Load()}

	// A client that reuses a key for another payment is refused, with the
	// stored record to show what the key was used for.
	_, _, rep.KeyReuse = pay(ctx, store, via, payment{pays[0].id, wallets[0], 1}, idempotency.Fingerprint([]byte("someone-else"), []byte("1")))
	var mm *idempotency.MismatchError
	if !errors.As(rep.KeyReuse, &mm) {
		return rep, fmt.Errorf("walletdebit: key reused for another payment: %v, want a *MismatchError", rep.KeyReuse)
	}
	fmt.Fprintf(out, "   a key reused for another payment: refused (%s), stored answer %q\n", "ErrMismatch", mm.Stored.Body)

	// Check.
	paid := map[string]int64{} // wallet → sum of distinct successful payments
	for i, p := range pays {
		for _, a := range answers[i] {
			if a != answers[i][0] {
				return rep, fmt.Errorf("walletdebit: payment %s got different answers: %v", p.id, answers[i])
			}
		}
		if len(answers[i]) != nDeliveries {
			return rep, fmt.Errorf("walletdebit: payment %s: %d answers for %d deliveries", p.id, len(answers[i]), nDeliveries)
		}
		var rows int
		if err := pool.QueryRow(ctx, ledgerSQL[via], p.id).Scan(&rows); err != nil {
			return rep, err
		}
		switch answers[i][0] {
		case "paid":
			rep.Paid++
			paid[p.account] += p.amount
			if rows != 1 {
				return rep, fmt.Errorf("walletdebit: paid payment %s has %d ledger rows, want 1", p.id, rows)
			}
		case "declined":
			rep.Declined++
			if rows != 0 {
				return rep, fmt.Errorf("walletdebit: declined payment %s has %d ledger rows, want 0", p.id, rows)
			}
		default:
			return rep, fmt.Errorf("walletdebit: payment %s: answer %q", p.id, answers[i][0])
		}
	}
	for _, w := range wallets {
		var balance int64
		if err := pool.QueryRow(ctx, `SELECT balance FROM walletdebit_wallets WHERE account = $1`, w).Scan(&balance); err != nil {
			return rep, err
		}
		if balance != opening-paid[w] || balance < 0 {
			return rep, fmt.Errorf("walletdebit: %s: balance %d, want %d − %d = %d", w, balance, opening, paid[w], opening-paid[w])
		}
		rep.Balanced++
	}
	if err := pool.QueryRow(ctx, ledgerSQL[via], runID+"/%").Scan(&rep.LedgerRows); err != nil {
		return rep, err
	}
	fmt.Fprintf(out, "   %d payments × %d deliveries: %d attempts (%d cut short, %d replies lost, %d waited out), %d answers replayed\n",
		nPayments, nDeliveries, rep.Attempts, rep.CutShort, rep.Lost, rep.WaitedOut, rep.Replayed)
	fmt.Fprintf(out, "   %d paid, %d declined; %d ledger rows, one per paid payment\n", rep.Paid, rep.Declined, rep.LedgerRows)
	fmt.Fprintf(out, "   every balance = %d − its distinct paid payments, none below zero: %s\n", opening, strings.Repeat("ok ", len(wallets)))
	return rep, nil
}
