package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
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

// newDynamoDocs puts the item "doc" (body "v0", no fence yet) into table
// and returns a Fenced for it: key attribute pk, fence attribute
// fence.
func newDynamoDocs(t *testing.T, client *dynamodb.Client, table string) *dynamoconditional.Fenced {
	t.Helper()
	f, err := dynamoconditional.NewFenced(table, "pk", "fence")
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "doc"}, "body": &types.AttributeValueMemberS{Value: "v0"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func dynamoDocKey(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}}
}

func dynamoBody(body string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"body": &types.AttributeValueMemberS{Value: body}}
}

// dynamoDoc is a document item as read back; fence is -1 when unset.
type dynamoDoc struct {
	body, note string
	fence      int64
	attrs      int
}

func readDynamoDoc(t *testing.T, client *dynamodb.Client, table, pk string) dynamoDoc {
	t.Helper()
	item := dynamoItem(t, client, table, pk)
	if item == nil {
		t.Fatalf("no item %q", pk)
	}
	d := dynamoDoc{fence: -1, attrs: len(item)}
	if v, ok := item["body"].(*types.AttributeValueMemberS); ok {
		d.body = v.Value
	}
	if v, ok := item["note"].(*types.AttributeValueMemberS); ok {
		d.note = v.Value
	}
	if v, ok := item["fence"].(*types.AttributeValueMemberN); ok {
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		d.fence = n
	}
	return d
}

func TestDynamoFencedUpdate(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			f := newDynamoDocs(t, client, table)
			faults := &dynamoFaults{DynamoDBAPI: client}
			doc := dynamoDocKey("doc")
			want := func(body string, fence int64) {
				t.Helper()
				if d := readDynamoDoc(t, client, table, "doc"); d.body != body || d.fence != fence {
					t.Fatalf("doc %q at fence %d, want %q at %d", d.body, d.fence, body, fence)
				}
			}
			for _, step := range []struct {
				token int64
				body  string
			}{{5, "a"}, {5, "b"}, {7, "c"}} { // unfenced, equal twice, higher
				if err := f.Update(ctx, faults, doc, step.token, dynamoBody(step.body)); err != nil {
					t.Fatalf("Update with token %d: %v", step.token, err)
				}
				want(step.body, step.token)
			}
			reads := faults.reads.Load()
			if err := f.Update(ctx, faults, doc, 6, dynamoBody("d")); !errors.Is(err, dynamoconditional.ErrFenced) {
				t.Fatalf("Update with a lower token: %v, want ErrFenced", err)
			}
			want("c", 7)
			// moto returns the item with the failed condition; dynalite
			// does not, so telling fenced from unknown costs a read there.
			if got, want := faults.reads.Load()-reads, map[bool]int64{true: 0, false: 1}[server.tx]; got != want {
				t.Errorf("a fenced update read %d times, want %d", got, want)
			}
			if err := f.Update(ctx, faults, dynamoDocKey("nope"), 9, dynamoBody("x")); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Update of a missing item: %v, want ErrNotFound", err)
			}
			if dynamoItem(t, client, table, "nope") != nil {
				t.Fatal("an update of a missing item created it")
			}
			// An empty set only advances the fence.
			if err := f.Update(ctx, faults, doc, 9, nil); err != nil {
				t.Fatal(err)
			}
			want("c", 9)
			if err := f.Update(ctx, faults, doc, 8, dynamoBody("e")); !errors.Is(err, dynamoconditional.ErrFenced) {
				t.Fatalf("Update below the advanced fence: %v, want ErrFenced", err)
			}
			want("c", 9)
			// Several attributes at once, names that are reserved words.
			set := map[string]types.AttributeValue{"body": &types.AttributeValueMemberS{Value: "f"},
				"note": &types.AttributeValueMemberS{Value: "n"}, "size": &types.AttributeValueMemberN{Value: "3"}}
			if err := f.Update(ctx, faults, doc, 10, set); err != nil {
				t.Fatal(err)
			}
			if d := readDynamoDoc(t, client, table, "doc"); d.body != "f" || d.note != "n" || d.fence != 10 || d.attrs != 5 {
				t.Fatalf("doc %+v, want body f, note n, size, fence 10", d)
			}
		})
	}
}

func TestDynamoFencedBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	f := newDynamoDocs(t, client, table)
	faults := &dynamoFaults{DynamoDBAPI: client}
	doc := dynamoDocKey("doc")
	str := func(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
	for _, tc := range []struct {
		name   string
		client dynamoconditional.DynamoDBAPI
		key    map[string]types.AttributeValue
		token  int64
		set    map[string]types.AttributeValue
		want   string
	}{
		{"nil client", nil, doc, 1, dynamoBody("x"), "client is nil"},
		{"negative token", faults, doc, -1, dynamoBody("x"), "token -1 is negative"},
		{"no key attribute", faults, map[string]types.AttributeValue{"id": str("doc")}, 1, dynamoBody("x"), `no key attribute "pk"`},
		{"nil key", faults, nil, 1, dynamoBody("x"), `no key attribute "pk"`},
		{"nil key value", faults, map[string]types.AttributeValue{"pk": str("doc"), "sk": nil}, 1, dynamoBody("x"), `key attribute "sk" is nil`},
		{"key names the fence", faults, map[string]types.AttributeValue{"pk": str("doc"), "fence": str("1")}, 1, dynamoBody("x"), `key names the fence attribute "fence"`},
		{"set names the fence", faults, doc, 1, map[string]types.AttributeValue{"fence": str("9")}, `set names the fence attribute "fence"`},
		{"set names the key", faults, doc, 1, map[string]types.AttributeValue{"pk": str("other")}, `set names the key attribute "pk"`},
		{"set nil value", faults, doc, 1, map[string]types.AttributeValue{"body": nil}, `set value of "body" is nil`},
		{"set empty name", faults, doc, 1, map[string]types.AttributeValue{"": str("x")}, "set names an empty attribute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := f.Update(ctx, tc.client, tc.key, tc.token, tc.set); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Update: %v, want ErrInvalid naming %q", err, tc.want)
			}
			if tc.client == nil {
				return
			}
			if _, err := f.UpdateItem(tc.key, tc.token, tc.set); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("UpdateItem: %v, want ErrInvalid naming %q", err, tc.want)
			}
			if strings.HasPrefix(tc.name, "set") {
				return
			}
			if _, err := f.CheckItem(tc.key, tc.token); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CheckItem: %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if n := faults.calls.Load(); n != 0 {
		t.Fatalf("bad input made %d calls to DynamoDB, want none", n)
	}
	if d := readDynamoDoc(t, client, table, "doc"); d.body != "v0" || d.fence != -1 || d.attrs != 2 {
		t.Fatalf("bad input changed the item: %+v", d)
	}
	for _, tc := range []struct{ table, key, fence, want string }{
		{"", "pk", "fence", "table is empty"},
		{table, "", "fence", "key attribute is empty"},
		{table, "pk", "", "fence attribute is empty"},
		{table, "pk", "pk", `key attribute and fence attribute are both "pk"`},
	} {
		if _, err := dynamoconditional.NewFenced(tc.table, tc.key, tc.fence); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewFenced(%q, %q, %q): %v, want ErrInvalid naming %q", tc.table, tc.key, tc.fence, err, tc.want)
		}
	}
}

// 16 writers with distinct tokens race on one item, round after round:
// every write either applies or is fenced, the highest token always
// applies, and the item ends with its token and its value.
func TestDynamoFencedConcurrentTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	f := newDynamoDocs(t, client, table)
	doc := dynamoDocKey("doc")
	const rounds, writers = 8, 16
	var applied, fenced int64
	for round := 0; round < rounds; round++ {
		base := int64(round * 1000)
		tokens := rand.Perm(writers)
		var ok, refused atomic.Int64
		dynamoRun(t, writers, func(w int) error {
			token := base + int64(tokens[w]) + 1
			err := f.Update(ctx, client, doc, token, dynamoBody(fmt.Sprintf("w%d", token)))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, dynamoconditional.ErrFenced):
				refused.Add(1)
			default:
				return err
			}
			return nil
		})
		if ok.Load()+refused.Load() != writers || ok.Load() == 0 {
			t.Fatalf("round %d: %d applied, %d fenced; want %d in all", round, ok.Load(), refused.Load(), writers)
		}
		top := base + writers
		if d := readDynamoDoc(t, client, table, "doc"); d.fence != top || d.body != fmt.Sprintf("w%d", top) {
			t.Fatalf("round %d: item %q at fence %d, want w%d at %d", round, d.body, d.fence, top, top)
		}
		applied += ok.Load()
		fenced += refused.Load()
	}
	t.Logf("%d applied, %d fenced", applied, fenced)
}

// Holder A (token 33) reads, then pauses; B (token 34), the newer holder,
// writes; A wakes and writes: refused, and the item shows B's write.
func TestDynamoFencedPausedHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	f := newDynamoDocs(t, client, table)
	doc := dynamoDocKey("doc")
	if err := f.Update(ctx, client, doc, 32, dynamoBody("by 32")); err != nil {
		t.Fatal(err)
	}

	paused, read := make(chan struct{}), make(chan struct{})
	wake := sync.OnceFunc(func() { close(paused) })
	defer wake()
	resultA := make(chan error, 1)
	go func() {
		defer close(read)
		out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: doc, ConsistentRead: aws.Bool(true)})
		if err != nil {
			resultA <- err
			return
		}
		if fence, _ := out.Item["fence"].(*types.AttributeValueMemberN); fence == nil || fence.Value != "32" {
			resultA <- fmt.Errorf("A read fence %v before pausing, want 32", out.Item["fence"])
			return
		}
		read <- struct{}{}
		<-paused // a GC pause, a stopped VM: A's lease ends meanwhile
		resultA <- f.Update(ctx, client, doc, 33, map[string]types.AttributeValue{
			"body": &types.AttributeValueMemberS{Value: "by A"}, "note": &types.AttributeValueMemberS{Value: "A woke up"}})
	}()

	if _, ok := <-read; !ok {
		t.Fatal(<-resultA)
	}
	if err := f.Update(ctx, client, doc, 34, dynamoBody("by B")); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	wake()
	if err := <-resultA; !errors.Is(err, dynamoconditional.ErrFenced) {
		t.Fatalf("A's write after waking: %v, want ErrFenced", err)
	}
	if d := readDynamoDoc(t, client, table, "doc"); d.body != "by B" || d.fence != 34 || d.note != "" {
		t.Fatalf("item %+v, want B's write at fence 34", d)
	}
}

// In the caller's TransactWriteItems, CheckItem lets writes to other items
// commit only while the token is current, and UpdateItem commits the fenced
// write with them; a stale token cancels everything.
func TestDynamoFencedInTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	f := newDynamoDocs(t, client, table)
	doc := dynamoDocKey("doc")
	if err := f.Update(ctx, client, doc, 7, dynamoBody("by 7")); err != nil {
		t.Fatal(err)
	}
	put := func(pk string) types.TransactWriteItem {
		return types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table), Item: dynamoDocKey(pk)}}
	}
	check := func(token int64) types.TransactWriteItem {
		it, err := f.CheckItem(doc, token)
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	update := func(token int64, body string) types.TransactWriteItem {
		it, err := f.UpdateItem(doc, token, dynamoBody(body))
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	for _, tc := range []struct {
		name     string
		items    []types.TransactWriteItem
		out      string
		ok       bool
		body     string
		fenceNow int64
	}{
		{"check, current token", []types.TransactWriteItem{check(7), put("out-1")}, "out-1", true, "by 7", 7},
		{"check, stale token", []types.TransactWriteItem{check(6), put("out-2")}, "out-2", false, "by 7", 7},
		{"update, newer token", []types.TransactWriteItem{update(8, "by 8"), put("out-3")}, "out-3", true, "by 8", 8},
		{"update, stale token", []types.TransactWriteItem{update(7, "by 7 again"), put("out-4")}, "out-4", false, "by 8", 8},
	} {
		_, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: tc.items})
		if tc.ok && err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !tc.ok && !dynamoconditional.ConditionFailedAt(err, 0) {
			t.Fatalf("%s: %v, want a cancellation by the fence (action 0)", tc.name, err)
		}
		if got := dynamoItem(t, client, table, tc.out) != nil; got != tc.ok {
			t.Fatalf("%s: item %s exists = %v, want %v", tc.name, tc.out, got, tc.ok)
		}
		if d := readDynamoDoc(t, client, table, "doc"); d.body != tc.body || d.fence != tc.fenceNow {
			t.Fatalf("%s: doc %q at %d, want %q at %d", tc.name, d.body, d.fence, tc.body, tc.fenceNow)
		}
	}
	// A check on a missing item cancels too.
	missing, err := f.CheckItem(dynamoDocKey("nope"), 100)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{put("out-5"), missing}})
	if !dynamoconditional.ConditionFailedAt(err, 1) || dynamoconditional.ConditionFailedAt(err, 0) {
		t.Fatalf("check of a missing item: %v, want a cancellation by action 1 only", err)
	}
}
