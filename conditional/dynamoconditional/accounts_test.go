package dynamoconditional_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

func newDynamoAccounts(t *testing.T, client dynamoconditional.DynamoDBAPI, table string) *dynamoconditional.Accounts {
	t.Helper()
	a, err := dynamoconditional.NewAccounts(client, table)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func dynamoBalance(t *testing.T, a *dynamoconditional.Accounts, account string) int64 {
	t.Helper()
	n, err := a.Balance(context.Background(), account)
	if err != nil {
		t.Fatalf("Balance(%q): %v", account, err)
	}
	return n
}

func TestDynamoAccounts(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			a := newDynamoAccounts(t, client, table)
			if err := a.Open(ctx, "alice", 100); err != nil {
				t.Fatal(err)
			}
			if err := a.Open(ctx, "alice", 5); err != nil {
				t.Fatalf("Open of an existing account: %v, want nil", err)
			}
			if got := dynamoBalance(t, a, "alice"); got != 100 {
				t.Fatalf("balance %d after opening twice, want 100: an existing account is left as it is", got)
			}
			if err := a.Debit(ctx, "alice", 30); err != nil {
				t.Fatalf("debit 30 of 100: %v", err)
			}
			if err := a.Debit(ctx, "alice", 71); !errors.Is(err, dynamoconditional.ErrInsufficient) {
				t.Fatalf("debit 71 of 70: %v, want ErrInsufficient", err)
			}
			if got := dynamoBalance(t, a, "alice"); got != 70 {
				t.Fatalf("balance %d after a refused debit, want 70", got)
			}
			if err := a.Credit(ctx, "alice", 5); err != nil {
				t.Fatal(err)
			}
			if err := a.Debit(ctx, "alice", 75); err != nil {
				t.Fatalf("debit all 75: %v", err)
			}
			if err := a.Debit(ctx, "alice", 1); !errors.Is(err, dynamoconditional.ErrInsufficient) {
				t.Fatalf("debit of an empty account: %v, want ErrInsufficient", err)
			}
			if got := dynamoBalance(t, a, "alice"); got != 0 {
				t.Fatalf("balance %d, want 0", got)
			}
			if err := a.Credit(ctx, "bob", 1); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("credit of a missing account: %v, want ErrNotFound", err)
			}
			if err := a.Debit(ctx, "bob", 1); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("debit of a missing account: %v, want ErrNotFound", err)
			}
			if _, err := a.Balance(ctx, "bob"); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("balance of a missing account: %v, want ErrNotFound", err)
			}
			if dynamoItem(t, client, table, "bob") != nil {
				t.Fatal("a credit or debit of a missing account created it")
			}
			if err := a.Open(ctx, "zero", 0); err != nil {
				t.Fatal(err)
			}
			if got := dynamoBalance(t, a, "zero"); got != 0 {
				t.Fatalf("balance %d, want 0", got)
			}
			if err := a.Open(ctx, "max", math.MaxInt64); err != nil {
				t.Fatal(err)
			}
			err := a.Credit(ctx, "max", 1)
			if err == nil || errors.Is(err, dynamoconditional.ErrNotFound) || !strings.Contains(err.Error(), "would exceed") {
				t.Fatalf("credit past MaxInt64: %v, want a refusal naming the limit", err)
			}
			if got := dynamoBalance(t, a, "max"); got != math.MaxInt64 {
				t.Fatalf("balance %d, want MaxInt64", got)
			}
		})
	}
}

func TestDynamoAccountsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	faults := &dynamoFaults{DynamoDBAPI: client}
	a := newDynamoAccounts(t, faults, table)
	if err := a.Open(ctx, "alice", 50); err != nil {
		t.Fatal(err)
	}
	calls := faults.calls.Load()
	item := func(f func(string, int64) (types.TransactWriteItem, error)) func(context.Context, string, int64) error {
		return func(_ context.Context, account string, n int64) error { _, err := f(account, n); return err }
	}
	for _, tc := range []struct {
		name, account, want string
		n                   int64
		op                  func(context.Context, string, int64) error
	}{
		{"open empty account", "", "account is empty", 1, a.Open},
		{"open negative balance", "carol", "balance must not be negative", -1, a.Open},
		{"open long account", strings.Repeat("a", dynamoconditional.MaxKeyLen+1), "account is 513 bytes", 1, a.Open},
		{"debit zero", "alice", "amount must be positive", 0, a.Debit},
		{"debit negative", "alice", "amount must be positive", -5, a.Debit},
		{"debit empty account", "", "account is empty", 1, a.Debit},
		{"credit zero", "alice", "amount must be positive", 0, a.Credit},
		{"credit negative", "alice", "amount must be positive", -5, a.Credit},
		{"credit NUL account", "a\x00", "NUL", 1, a.Credit},
		{"debit item zero", "alice", "amount must be positive", 0, item(a.DebitItem)},
		{"debit item empty account", "", "account is empty", 1, item(a.DebitItem)},
		{"credit item negative", "alice", "amount must be positive", -1, item(a.CreditItem)},
		{"balance empty account", "", "account is empty", 0, func(ctx context.Context, account string, _ int64) error {
			_, err := a.Balance(ctx, account)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op(ctx, tc.account, tc.n)
			if !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if n := faults.calls.Load() - calls; n != 0 {
		t.Fatalf("bad input made %d calls to DynamoDB, want none", n)
	}
	if got := dynamoBalance(t, a, "alice"); got != 50 {
		t.Fatalf("bad input changed the balance: %d, want 50", got)
	}
	if n := dynamoCount(t, client, table); n != 1 {
		t.Fatalf("%d items, want only alice", n)
	}
	if _, err := dynamoconditional.NewAccounts(nil, table); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), "client is nil") {
		t.Errorf("NewAccounts(nil): %v, want ErrInvalid naming the client", err)
	}
	if _, err := dynamoconditional.NewAccounts(client, ""); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), "table is empty") {
		t.Errorf("NewAccounts without a table: %v, want ErrInvalid naming the table", err)
	}
}

// 16 goroutines debit random amounts from one account while an observer
// reads its balance: the balance is never negative and never rises, and
// the successful debits add up to exactly what left the account.
func TestDynamoAccountsConcurrentDebits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	a := newDynamoAccounts(t, client, testenv.Table(t, client, false))
	const opening, workers, debits = 20000, 16, 40
	if err := a.Open(ctx, "hot", opening); err != nil {
		t.Fatal(err)
	}
	var debited, ok, refused atomic.Int64
	done := make(chan struct{})
	var observer sync.WaitGroup
	observed := make(chan error, 1)
	observer.Add(1)
	go func() {
		defer observer.Done()
		last := int64(opening)
		for reads := 0; ; reads++ {
			select {
			case <-done:
				if reads == 0 {
					observed <- errors.New("the observer never read")
				}
				return
			default:
			}
			b, err := a.Balance(ctx, "hot")
			if err == nil && (b < 0 || b > last) {
				err = errors.New("balance went negative or rose")
			}
			if err != nil {
				observed <- err
				return
			}
			last = b
		}
	}()
	dynamoRun(t, workers, func(int) error {
		for i := 0; i < debits; i++ {
			amount := 1 + rand.Int64N(100)
			switch err := a.Debit(ctx, "hot", amount); {
			case err == nil:
				debited.Add(amount)
				ok.Add(1)
			case errors.Is(err, dynamoconditional.ErrInsufficient):
				refused.Add(1)
			default:
				return err
			}
		}
		return nil
	})
	close(done)
	observer.Wait()
	close(observed)
	if err := <-observed; err != nil {
		t.Fatal(err)
	}
	final := dynamoBalance(t, a, "hot")
	t.Logf("%d debits applied (%d units), %d refused, balance %d", ok.Load(), debited.Load(), refused.Load(), final)
	if final < 0 || debited.Load() != opening-final {
		t.Fatalf("debited %d, balance %d of %d: want debited == opening - balance >= 0", debited.Load(), final, opening)
	}
	if refused.Load() == 0 {
		t.Fatal("no debit was refused: the test did not drain the account")
	}
}

// DebitItem in the caller's TransactWriteItems with a ledger entry: both
// apply, or, when the balance is short, neither.
func TestDynamoAccountsDebitItemInTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	a := newDynamoAccounts(t, client, table)
	for account, balance := range map[string]int64{"alice": 50, "shop": 0} {
		if err := a.Open(ctx, account, balance); err != nil {
			t.Fatal(err)
		}
	}
	ledger := func(pk string) types.TransactWriteItem {
		return types.TransactWriteItem{Put: &types.Put{
			TableName: aws.String(table), Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		}}
	}
	transfer := func(entry, to string, amount int64) error {
		debit, err := a.DebitItem("alice", amount)
		if err != nil {
			t.Fatal(err)
		}
		credit, err := a.CreditItem(to, amount)
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{debit, credit, ledger(entry)}})
		return err
	}
	if err := transfer("ledger#1", "shop", 30); err != nil {
		t.Fatalf("transfer 30 of 50: %v", err)
	}
	if dynamoItem(t, client, table, "ledger#1") == nil || dynamoBalance(t, a, "alice") != 20 || dynamoBalance(t, a, "shop") != 30 {
		t.Fatal("the transfer of 30 did not apply whole")
	}
	// The debit fails: nothing applies, the ledger entry included.
	err := transfer("ledger#2", "shop", 30)
	if !dynamoconditional.ConditionFailedAt(err, 0) || dynamoconditional.ConditionFailedAt(err, 1) {
		t.Fatalf("transfer 30 of 20: %v, want a cancellation by the debit (action 0) only", err)
	}
	if dynamoItem(t, client, table, "ledger#2") != nil {
		t.Fatal("the ledger entry of a cancelled transfer exists")
	}
	if a, s := dynamoBalance(t, a, "alice"), dynamoBalance(t, a, "shop"); a != 20 || s != 30 {
		t.Fatalf("balances %d, %d after a cancelled transfer, want 20, 30", a, s)
	}
	// The credit's account is missing: nothing applies either.
	err = transfer("ledger#3", "nobody", 5)
	if !dynamoconditional.ConditionFailedAt(err, 1) || dynamoconditional.ConditionFailedAt(err, 0) {
		t.Fatalf("transfer to a missing account: %v, want a cancellation by the credit (action 1) only", err)
	}
	if dynamoItem(t, client, table, "ledger#3") != nil || dynamoItem(t, client, table, "nobody") != nil || dynamoBalance(t, a, "alice") != 20 {
		t.Fatal("a transfer to a missing account applied in part")
	}
	// A replayed ledger entry (the caller's idempotency record) cancels
	// the debit with it.
	err = transfer("ledger#1", "shop", 5)
	if !dynamoconditional.ConditionFailedAt(err, 2) {
		t.Fatalf("replayed transfer: %v, want a cancellation by the ledger entry (action 2)", err)
	}
	if a, s := dynamoBalance(t, a, "alice"), dynamoBalance(t, a, "shop"); a != 20 || s != 30 {
		t.Fatalf("balances %d, %d after a replayed transfer, want 20, 30", a, s)
	}
}
