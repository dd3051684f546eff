package dynamoconditional

import (
	"context"
	"fmt"
	"math"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/observe"
)

// Accounts keeps balances (credits, quota, money in minor units) in a
// DynamoDB table and debits them never below zero, without a lock: each
// change is one conditional UpdateItem, "SET balance = balance - :a IF
// balance >= :a", and the item decides.
//
// Item layout: one item per account, whose partition key
// (WithKeyAttributes, default "pk", a string) is the account's name and whose BalanceAttr
// ("balance", a number) is its balance. Open creates it; nothing here
// deletes it.
//
// Guarantee: a balance never goes below zero nor above MaxInt64, across
// any number of processes, and every change that returned nil applied
// exactly once. Each account is one item, so it takes about 1,000 writes
// per second (DynamoDB's per-partition limit); there is no coalescing or
// splitting of hot accounts. Debit and Credit are not idempotent: on
// ErrAmbiguousCommit the change may have applied, so read the Balance, or
// put DebitItem into a transaction with your own idempotency record.
//
// An Accounts holds no state of its own: it is safe for concurrent
// use, and any number may share a table.
type Accounts struct {
	client DynamoDBAPI
	table  string
	keys   keyAttrs
	obs    observe.Observer
}

// NewAccounts returns an Accounts on table, whose partition key is a
// string attribute named "pk" unless WithKeyAttributes says otherwise.
// client is usually a *dynamodb.Client. It takes WithObserver and
// WithKeyAttributes (see Option).
func NewAccounts(client DynamoDBAPI, table string, opts ...Option) (*Accounts, error) {
	cfg := config{keys: defaultKeys}
	if err := apply(&cfg, opts, "NewAccounts", accountsSetters); err != nil {
		return nil, err
	}
	if ddbarg.NilClient(client) {
		return nil, condcore.Invalid("client is nil")
	}
	if err := validTable("table", table); err != nil {
		return nil, err
	}
	if err := cfg.keys.valid(BalanceAttr); err != nil {
		return nil, err
	}
	return &Accounts{client: client, table: table, keys: cfg.keys, obs: cfg.obs}, nil
}

func (a *Accounts) key(account string) map[string]types.AttributeValue {
	return a.keys.item(account)
}

// Open creates account with balance if it does not exist. An account that
// exists is left as it is, its balance unchanged, and Open returns nil: so
// Open is idempotent, and safe to retry after ErrAmbiguousCommit.
func (a *Accounts) Open(ctx context.Context, account string, balance int64) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := condcore.ValidArg("account", account); err != nil {
		return err
	}
	if balance < 0 {
		return condcore.Invalid("balance must not be negative, got %d", balance)
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("open %q", account)); err != nil {
		return err
	}
	_, err := a.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(a.table),
		Key:                       a.key(account),
		UpdateExpression:          aws.String("SET #b = :b"),
		ConditionExpression:       aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames:  map[string]string{"#k": a.keys.pk, "#b": BalanceAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":b": numAttr(balance)},
	}, ddberr.NoBlindRetries)
	if _, exists := ddberr.ConditionFailed(err); err == nil || exists {
		return nil
	}
	return errfmt.Errorf("conditional: open %q: %w", account, writeErr(err))
}

// Debit takes amount from account's balance if the balance covers it:
// nil means it was taken; ErrInsufficient means the balance is smaller and
// nothing was taken; ErrNotFound means there is no such account.
// ErrAmbiguousCommit means the write was sent and its answer lost: it may
// have applied.
func (a *Accounts) Debit(ctx context.Context, account string, amount int64) error {
	return condcore.ObservedErr(ctx, a.obs, condcore.Debit, false, observe.Event{Key: account, N: amount}, func(ctx context.Context) error {
		if err := condcore.CheckCtx(ctx); err != nil {
			return err
		}
		u, err := a.debit(account, amount)
		if err != nil {
			return err
		}
		return a.apply(ctx, "debit", account, u, ErrInsufficient)
	})
}

// Credit adds amount to account's balance: nil means it was added;
// ErrNotFound means there is no such account (Credit does not create
// one: use Open). A credit that would take the balance past MaxInt64 is
// refused. ErrAmbiguousCommit means the write was sent and its answer
// lost: it may have applied.
func (a *Accounts) Credit(ctx context.Context, account string, amount int64) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	u, err := a.credit(account, amount)
	if err != nil {
		return err
	}
	return a.apply(ctx, "credit", account, u, errfmt.Errorf("conditional: credit %q: the balance would exceed %d", account, int64(math.MaxInt64)))
}

// Balance returns account's balance, read with a strongly consistent
// read; ErrNotFound means there is no such account. It is a snapshot:
// concurrent changes may change it at once.
func (a *Accounts) Balance(ctx context.Context, account string) (int64, error) {
	if err := condcore.CheckCtx(ctx); err != nil {
		return 0, err
	}
	if err := condcore.ValidArg("account", account); err != nil {
		return 0, err
	}
	item, err := getItem(ctx, a.client, a.table, a.key(account))
	if err != nil {
		return 0, errfmt.Errorf("conditional: balance %q: %w", account, err)
	}
	if item == nil {
		return 0, ErrNotFound
	}
	b, err := intAttr(item, BalanceAttr)
	if err != nil {
		return 0, errfmt.Errorf("conditional: balance %q: %w", account, err)
	}
	return b, nil
}

// DebitItem returns Debit's write as an action for your own
// TransactWriteItems (an idempotency record, a ledger entry), so the debit
// applies with your other writes or not at all. An insufficient balance or
// a missing account shows as a TransactionCanceledException in which
// ConditionFailedAt reports this action. Bad input is ErrInvalid.
func (a *Accounts) DebitItem(account string, amount int64) (types.TransactWriteItem, error) {
	u, err := a.debit(account, amount)
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: u}, nil
}

// CreditItem returns Credit's write as an action for your own
// TransactWriteItems, for example the other half of a transfer. A missing
// account shows as a TransactionCanceledException in which
// ConditionFailedAt reports this action. Bad input is ErrInvalid.
func (a *Accounts) CreditItem(account string, amount int64) (types.TransactWriteItem, error) {
	u, err := a.credit(account, amount)
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: u}, nil
}

// debit is the conditional decrement: the balance, which must exist, is
// at least amount.
func (a *Accounts) debit(account string, amount int64) (*types.Update, error) {
	if err := condcore.ValidArg("account", account); err != nil {
		return nil, err
	}
	if amount <= 0 {
		return nil, condcore.Invalid("amount must be positive, got %d", amount)
	}
	return &types.Update{
		TableName:                           aws.String(a.table),
		Key:                                 a.key(account),
		UpdateExpression:                    aws.String("SET #b = #b - :a"),
		ConditionExpression:                 aws.String("#b >= :a"),
		ExpressionAttributeNames:            map[string]string{"#b": BalanceAttr},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":a": numAttr(amount)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, nil
}

// credit is the conditional increment: the account exists and its balance
// stays within an int64.
func (a *Accounts) credit(account string, amount int64) (*types.Update, error) {
	if err := condcore.ValidArg("account", account); err != nil {
		return nil, err
	}
	if amount <= 0 {
		return nil, condcore.Invalid("amount must be positive, got %d", amount)
	}
	return &types.Update{
		TableName:                           aws.String(a.table),
		Key:                                 a.key(account),
		UpdateExpression:                    aws.String("SET #b = #b + :a"),
		ConditionExpression:                 aws.String("attribute_exists(#k) AND #b <= :limit"),
		ExpressionAttributeNames:            map[string]string{"#k": a.keys.pk, "#b": BalanceAttr},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":a": numAttr(amount), ":limit": numAttr(math.MaxInt64 - amount)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, nil
}

// apply sends u as an UpdateItem. A refusal is ErrNotFound when there is
// no item (told by the item the server returned, or a consistent read),
// else refusal.
func (a *Accounts) apply(ctx context.Context, op, account string, u *types.Update, refusal error) error {
	if err := condcore.Unsent(ctx, fmt.Sprintf("%s %q", op, account)); err != nil {
		return err
	}
	err := updateItem(ctx, a.client, u)
	if err == nil {
		return nil
	}
	item, ok := ddberr.ConditionFailed(err)
	if !ok {
		return errfmt.Errorf("conditional: %s %q: %w", op, account, writeErr(err))
	}
	if item == nil {
		if item, err = getItem(ctx, a.client, a.table, a.key(account), a.keys.pk); err != nil {
			return errfmt.Errorf("conditional: %s %q refused; reading the account: %w", op, account, err)
		}
	}
	if item == nil {
		return ErrNotFound
	}
	return refusal
}
