package dynamoconditional

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/observe"
)

// Fenced writes items of your own DynamoDB table only for a holder
// whose fencing token is at least the one the item carries, and stores the
// token with the write, in one conditional UpdateItem:
//
//	SET <set attributes>, <fence> = :token
//	IF attribute_exists(<key>) AND (attribute_not_exists(<fence>) OR <fence> <= :token)
//
// A holder that paused past the end of its lease and wakes up to write
// after a newer holder has written is refused with ErrFenced; the item
// decides, not the holder's belief. Tokens come from any source that only
// grows per resource (a dynamolock.Lock's Token, a partition epoch); each
// holder needs its own, since equal tokens pass (one holder writes many
// times). An item without the fence attribute has never been fenced and
// accepts any token; one whose fence is not a number refuses every token.
//
// Fenced is the one fence for DynamoDB items in this library: Update
// writes values, UpdateItem and CheckItem go into your own
// TransactWriteItems, and ApplyUpdate and ApplyPut add the fence to an
// UpdateItem or PutItem request you build (ADD, REMOVE, list_append, or
// creating the item). Every write path to the item must be fenced: one
// unguarded path reopens the window.
//
// Guarantee: on one item, the writes that apply carry non-decreasing
// tokens, in the order DynamoDB applied them. Fenced does not issue
// or check tokens, does not fence effects outside the item (put CheckItem
// into your TransactWriteItems for that), and creates items only through
// ApplyUpdate and ApplyPut.
//
// A Fenced holds only names and its observer: it is safe for concurrent
// use, and one value serves any client.
type Fenced struct {
	table, keyAttr, fenceAttr string
	obs                       observe.Observer
}

// NewFenced returns a Fenced for table, whose items have the
// partition key attribute keyAttr and carry their token in the number
// attribute fenceAttr. Names go as expression attribute names, never into
// the expressions themselves. Its one option is WithObserver (see
// Option).
func NewFenced(table, keyAttr, fenceAttr string, opts ...Option) (*Fenced, error) {
	var cfg config
	if err := apply(&cfg, opts, "NewFenced", fencedSetters); err != nil {
		return nil, err
	}
	if err := validTable("table", table); err != nil {
		return nil, err
	}
	if err := validAttr("key attribute", keyAttr, ddbarg.MaxKeyAttrLen); err != nil {
		return nil, err
	}
	if err := validAttr("fence attribute", fenceAttr, ddbarg.MaxAttrLen); err != nil {
		return nil, err
	}
	if keyAttr == fenceAttr {
		return nil, condcore.Invalid("key attribute and fence attribute are both %q", keyAttr)
	}
	return &Fenced{table: table, keyAttr: keyAttr, fenceAttr: fenceAttr, obs: cfg.obs}, nil
}

// Update writes set (attribute name → value) to the item at key, and token
// to its fence attribute, if the item exists and its fence is at most
// token. It returns ErrFenced when the item carries a higher token, and
// ErrNotFound when there is no item; then nothing was written. With an
// empty set it only advances the fence, which fences out older holders
// before the new one's first write.
//
// key is the item's full primary key and must hold the key attribute. On a
// refusal, the item the server returned with the failed condition tells
// the two apart; a server that returns none (dynalite) costs one strongly
// consistent read. ErrAmbiguousCommit means the write was sent and its
// answer lost: retrying with the same token and values is safe (the write
// is idempotent), unless a newer holder wrote meanwhile (then ErrFenced).
//
// Bad input (nil client, token < 0, a key without the key attribute, a set
// naming a key or the fence attribute, a nil value) is ErrInvalid, before
// any I/O.
func (f *Fenced) Update(ctx context.Context, client DynamoDBAPI, key map[string]types.AttributeValue, token int64, set map[string]types.AttributeValue) error {
	var e observe.Event
	if f.obs != nil {
		e = observe.Event{Key: eventKey(key, f.keyAttr), Token: token}
	}
	return condcore.ObservedErr(ctx, f.obs, condcore.Fence, true, e, func(ctx context.Context) error { return f.write(ctx, client, key, token, set) })
}

func (f *Fenced) write(ctx context.Context, client DynamoDBAPI, key map[string]types.AttributeValue, token int64, set map[string]types.AttributeValue) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if ddbarg.NilClient(client) {
		return condcore.Invalid("client is nil")
	}
	u, err := f.update(key, token, set)
	if err != nil {
		return err
	}
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	if err := condcore.Unsent(ctx, "fenced update"); err != nil {
		return err
	}
	err = updateItem(ctx, client, u)
	if err == nil {
		return nil
	}
	item, ok := ddberr.ConditionFailed(err)
	if !ok {
		return errfmt.Errorf("conditional: fenced update: %w", writeErr(err))
	}
	if item == nil {
		if item, err = getItem(ctx, client, f.table, key, f.keyAttr); err != nil {
			return errfmt.Errorf("conditional: fenced update refused; reading the item: %w", err)
		}
	}
	if item == nil {
		return errfmt.Errorf("conditional: fenced update: %w", ErrNotFound)
	}
	return errfmt.Errorf("conditional: fenced update with token %d: %w", token, ErrFenced)
}

// UpdateItem returns Update's write as an action for your own
// TransactWriteItems, so the fenced write commits with your other writes
// or not at all. A refused fence shows as a TransactionCanceledException
// in which ConditionFailedAt reports this action (with the item, where the
// server returns it). DynamoDB refuses a transaction with two actions on
// one item: to fence writes to other items, use CheckItem.
func (f *Fenced) UpdateItem(key map[string]types.AttributeValue, token int64, set map[string]types.AttributeValue) (types.TransactWriteItem, error) {
	u, err := f.update(key, token, set)
	if err != nil {
		return types.TransactWriteItem{}, err
	}
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	return types.TransactWriteItem{Update: u}, nil
}

// CheckItem returns a ConditionCheck for your own TransactWriteItems that
// holds when the item at key exists and its fence is at most token, so
// writes to other items commit only while the token is current. It writes
// nothing: the item's fence does not advance (use Update for that). A
// failed check cancels the whole transaction; ConditionFailedAt reports
// this action.
func (f *Fenced) CheckItem(key map[string]types.AttributeValue, token int64) (types.TransactWriteItem, error) {
	if err := f.validKey(key, token); err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName:                           aws.String(f.table),
		Key:                                 key,
		ConditionExpression:                 aws.String(fencedCondition),
		ExpressionAttributeNames:            map[string]string{"#k": f.keyAttr, "#f": f.fenceAttr},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":t": numAttr(token)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}, nil
}

// fencedCondition admits a token at least the item's; names #k (the key
// attribute) and #f (the fence), value :t (the token).
const fencedCondition = "attribute_exists(#k) AND (attribute_not_exists(#f) OR #f <= :t)"

// validKey checks a key and a token.
func (f *Fenced) validKey(key map[string]types.AttributeValue, token int64) error {
	switch {
	case token < 0:
		return condcore.Invalid("token %d is negative", token)
	case key[f.keyAttr] == nil:
		return condcore.Invalid("key has no key attribute %q", f.keyAttr)
	case key[f.fenceAttr] != nil:
		return condcore.Invalid("key names the fence attribute %q", f.fenceAttr)
	}
	for _, name := range slices.Sorted(maps.Keys(key)) {
		switch v := key[name].(type) {
		case nil:
			return condcore.Invalid("key attribute %q is nil", name)
		case *types.AttributeValueMemberS:
			// The SDK would send each invalid byte as U+FFFD: another item.
			if !utf8.ValidString(v.Value) {
				return condcore.Invalid("key attribute %q is not valid UTF-8", name)
			}
		}
	}
	return nil
}

// update builds the fenced Update: the set attributes in sorted order, so
// the same attributes always give the same expression.
func (f *Fenced) update(key map[string]types.AttributeValue, token int64, set map[string]types.AttributeValue) (*types.Update, error) {
	if err := f.validKey(key, token); err != nil {
		return nil, err
	}
	names := map[string]string{"#k": f.keyAttr, "#f": f.fenceAttr}
	values := map[string]types.AttributeValue{":t": numAttr(token)}
	var expr strings.Builder
	expr.WriteString("SET #f = :t")
	for i, name := range slices.Sorted(maps.Keys(set)) {
		switch {
		case name == "":
			return nil, condcore.Invalid("set names an empty attribute")
		case name == f.fenceAttr:
			return nil, condcore.Invalid("set names the fence attribute %q; the token is written there", name)
		case key[name] != nil:
			return nil, condcore.Invalid("set names the key attribute %q", name)
		case set[name] == nil:
			return nil, condcore.Invalid("set value of %q is nil", name)
		}
		n, v := "#s"+strconv.Itoa(i), ":s"+strconv.Itoa(i)
		names[n], values[v] = name, set[name]
		expr.WriteString(", " + n + " = " + v)
	}
	return &types.Update{
		TableName:                 aws.String(f.table),
		Key:                       key,
		UpdateExpression:          aws.String(expr.String()),
		ConditionExpression:       aws.String(fencedCondition),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	}, nil
}
