package dynamoconditional

// Fencing your own requests: the fence of Fenced added to an UpdateItem
// or PutItem you build, for writes Update's SET of values cannot express.

import (
	"maps"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/condcore"
)

// Placeholders the fence adds to a caller's expressions.
const (
	fenceName  = "#nolockFence"
	fenceValue = ":nolockToken"
)

// requestCondition admits a token at least the item's, or an item without
// a fence (or no item: a request may create it).
const requestCondition = "(attribute_not_exists(" + fenceName + ") OR " + fenceName + " <= " + fenceValue + ")"

// ApplyUpdate adds the fence to your own UpdateItem request on the Fenced's
// table, in place, for writes Update cannot express (ADD, REMOVE,
// list_append, a condition of your own): your condition is ANDed with
// "(attribute_not_exists(fence) OR fence <= :token)", "fence = :token" is
// assigned in your SET clause (one is added if there is none), and the
// placeholders #nolockFence and :nolockToken are merged into copies of
// your maps. Send the request yourself: a refusal is a
// ConditionalCheckFailedException (your condition's or the fence's), and
// nothing was written. Unlike Update, the request may create a missing
// item, fenced from its first write.
//
// Bad input (token < 0, a nil request, another table, a key without the
// key attribute or naming the fence, placeholders already used) is
// ErrInvalid, and in is left as it was.
func (f *Fenced) ApplyUpdate(in *dynamodb.UpdateItemInput, token int64) error {
	if in == nil {
		return condcore.Invalid("update request is nil")
	}
	names, values, err := f.request(in.TableName, in.Key, token, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return err
	}
	in.TableName, in.ExpressionAttributeNames, in.ExpressionAttributeValues = aws.String(f.table), names, values
	in.ConditionExpression = aws.String(and(aws.ToString(in.ConditionExpression), requestCondition))
	in.UpdateExpression = aws.String(addSet(aws.ToString(in.UpdateExpression), fenceName+" = "+fenceValue))
	return nil
}

// ApplyPut adds the fence to your own PutItem request on the Fenced's
// table, in place: the token goes into a copy of the item's fence
// attribute, and your condition is ANDed with the fence's, as ApplyUpdate
// does. A put replaces the whole item, so it is the fenced way to create
// one. Its bad input is ApplyUpdate's, the item standing for the key.
func (f *Fenced) ApplyPut(in *dynamodb.PutItemInput, token int64) error {
	if in == nil {
		return condcore.Invalid("put request is nil")
	}
	key := maps.Clone(in.Item)
	delete(key, f.fenceAttr) // the fence is the token's to set
	names, values, err := f.request(in.TableName, key, token, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return err
	}
	key[f.fenceAttr] = numAttr(token)
	in.TableName, in.Item, in.ExpressionAttributeNames, in.ExpressionAttributeValues = aws.String(f.table), key, names, values
	in.ConditionExpression = aws.String(and(aws.ToString(in.ConditionExpression), requestCondition))
	return nil
}

// request checks a request's table, key and token, and returns copies of
// its expression maps with the fence's placeholders added.
func (f *Fenced) request(table *string, key map[string]types.AttributeValue, token int64,
	names map[string]string, values map[string]types.AttributeValue) (map[string]string, map[string]types.AttributeValue, error) {
	if table != nil && *table != f.table {
		return nil, nil, condcore.Invalid("request's table %q is not the Fenced's %q", *table, f.table)
	}
	if err := f.validKey(key, token); err != nil {
		return nil, nil, err
	}
	if _, ok := names[fenceName]; ok {
		return nil, nil, condcore.Invalid("expression attribute name %s is already used", fenceName)
	}
	if _, ok := values[fenceValue]; ok {
		return nil, nil, condcore.Invalid("expression attribute value %s is already used", fenceValue)
	}
	n := maps.Clone(names)
	if n == nil {
		n = map[string]string{}
	}
	v := maps.Clone(values)
	if v == nil {
		v = map[string]types.AttributeValue{}
	}
	n[fenceName], v[fenceValue] = f.fenceAttr, numAttr(token)
	return n, v, nil
}

// and ANDs two conditions; a blank first one is none.
func and(a, b string) string {
	if strings.TrimSpace(a) == "" {
		return b
	}
	return "(" + a + ") AND " + b
}

// addSet adds assignment to the SET clause of an update expression, or adds
// a SET clause. SET is a reserved word, so outside placeholders it can only
// be the clause keyword.
func addSet(expr, assignment string) string {
	depth := 0
	for i := 0; i < len(expr); {
		ch := expr[i]
		switch {
		case ch == '(':
			depth++
			i++
		case ch == ')':
			depth--
			i++
		case isWord(ch):
			j := i
			for j < len(expr) && isWord(expr[j]) {
				j++
			}
			placeholder := i > 0 && (expr[i-1] == '#' || expr[i-1] == ':' || expr[i-1] == '.')
			if depth == 0 && !placeholder && strings.EqualFold(expr[i:j], "SET") {
				return expr[:j] + " " + assignment + "," + expr[j:]
			}
			i = j
		default:
			i++
		}
	}
	if strings.TrimSpace(expr) == "" {
		return "SET " + assignment
	}
	return expr + " SET " + assignment
}

func isWord(ch byte) bool {
	return ch == '_' || ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z'
}
