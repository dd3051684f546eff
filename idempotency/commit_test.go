package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// The caller's deadline never cancels a commit in flight: no CancelRequest
// cuts it short (a cancelled wait for a synchronous standby would leave it
// visible on the primary but not replicated). The caller stops waiting and
// gets ErrAmbiguousCommit; the commit goes on to its end, and the Store's
// Close waits for it; a retry with the same key replays it.
func TestCallerDeadlineNeverCancelsTheCommit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		how  string // Exec's plan
		pay  func(ctx context.Context, b *bed) (idempotency.Result, error)
	}{
		{"do", "claim", func(ctx context.Context, b *bed) (idempotency.Result, error) { return b.payOnce(ctx, "pay-1", 500) }},
		{"exec-claim", "claim", func(ctx context.Context, b *bed) (idempotency.Result, error) { return b.execPay(ctx, "pay-1", 500) }},
		{"exec-readfirst", "readfirst", func(ctx context.Context, b *bed) (idempotency.Result, error) { return b.execPay(ctx, "pay-1", 500) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBed(t)
			b.store.PinPlan(tc.how)
			slowCommit(t, b)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := tc.pay(ctx, b)
				done <- err
			}()
			counter := func(seq string) func() (int64, error) {
				return func() (int64, error) {
					var n int64
					err := b.pool.QueryRow(context.Background(), `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+seq).Scan(&n)
					return n, err
				}
			}
			reached, cancelled := counter("commit_reached"), counter("commit_cancelled")
			testenv.Until(t, "the commit runs the deferred trigger", func() (bool, error) {
				n, err := reached()
				return n > 0, err
			})
			cancel()
			if err := <-done; !errors.Is(err, idempotency.ErrAmbiguousCommit) {
				t.Fatalf("caller's ctx ended during the commit: %v; want ErrAmbiguousCommit", err)
			}
			// The Store owns the commit its caller left: Close waits for it.
			closed := make(chan struct{})
			go func() {
				if err := b.store.Close(); err != nil {
					t.Error(err)
				}
				close(closed)
			}()
			if _, err := reached(); err != nil { // a round trip: time for a Close that did not wait to return
				t.Fatal(err)
			}
			select {
			case <-closed:
				t.Fatal("Close returned while the commit was held in its trigger")
			default:
			}
			mustExec(t, b.pool, `UPDATE fault SET armed = false`)
			<-closed
			if c, err := cancelled(); err != nil || c > 0 {
				t.Fatalf("the commit was cancelled on the server (%v) after its caller left", err)
			}
			if got := b.balance("alice"); got != initial-500 {
				t.Fatalf("alice %d after the abandoned commit; want %d: it commits on its own terms", got, initial-500)
			}
			res, err := tc.pay(context.Background(), b)
			if err != nil || !res.Replayed {
				t.Fatalf("retry: %+v, %v; want a replay", res, err)
			}
			if got := b.balance("alice"); got != initial-500 {
				t.Fatalf("alice %d; want one debit", got)
			}
		})
	}
}

// slowCommit holds every commit that debited a wallet in a deferred
// trigger until the test sets fault.armed to false. Sequences, which no
// rollback undoes, count the commits that reached the trigger and those
// cancelled there.
func slowCommit(t *testing.T, b *bed) {
	t.Helper()
	mustExec(t, b.pool, `CREATE TABLE fault (armed boolean NOT NULL)`)
	mustExec(t, b.pool, `INSERT INTO fault VALUES (true)`)
	mustExec(t, b.pool, `CREATE SEQUENCE commit_reached`)
	mustExec(t, b.pool, `CREATE SEQUENCE commit_cancelled`)
	mustExec(t, b.pool, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('commit_reached');
  WHILE (SELECT armed FROM fault) LOOP PERFORM pg_sleep(0.01); END LOOP;
  RETURN NULL;
EXCEPTION WHEN query_canceled THEN
  PERFORM nextval('commit_cancelled');
  RAISE;
END $$`)
	mustExec(t, b.pool, `CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON wallets
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
}
