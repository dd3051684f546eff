package dynamolock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// The DynamoDB server is killed and restarted under load: on every key a
// lock is held and heartbeating, and other clients wait for it. Outages
// alternate: long ones (a lease and a half: every lock held at the kill
// runs out) and short ones (half a lease: holders may keep their locks,
// while waiters have seen their versions unchanged for longer than that).
// Throughout, no two holders hold a key at once by their own clocks and
// tokens never go backwards (the ledger), and the fenced item of each key
// lists the tokens of its accepted writes in order, across restarts.
// Callers get truthful outcomes: a holder whose lease ran out during an
// outage learns it through Lost, with Cause Expired and the DynamoDB
// error that kept its heartbeats out; a Release that says the lock was
// held until then is true; and after every restart each key is live
// again: its holder's heartbeats land, or a waiter acquires it (after a
// long outage, always a waiter).
func TestServerRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.DynamoDBServer(t)
	api := srv.Client()
	table := testenv.Table(t, api, false)
	keys, perKey := testenv.Trials(6, 8), 3
	load := &restartLoad{ledger: newLedger(), holding: map[string][]*dynamolock.Lock{}, waiting: map[string]int{},
		since: map[string]int{}, outcomes: map[string]int{}}
	ctx, stop := context.WithCancel(context.Background())
	for k := 0; k < keys; k++ { // before any participant runs: they share the map under load.mu
		load.since["k"+strconv.Itoa(k)] = 0
	}
	var wg sync.WaitGroup
	for k := 0; k < keys; k++ {
		for p := 0; p < perKey; p++ {
			c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/8))
			wg.Add(1)
			go func() {
				defer wg.Done()
				load.participate(ctx, t, c, api, table, "k"+strconv.Itoa(k))
			}()
		}
	}
	t.Cleanup(func() { stop(); wg.Wait() }) // before the clients close

	cycles := testenv.Trials(1, 10)
	atKill := map[string]int{} // what became of the locks held at a kill
	for cycle := 0; cycle < cycles; cycle++ {
		for _, outage := range []time.Duration{testLease + testLease/2, testLease / 2} {
			testenv.Until(t, "every key held, heartbeating, and waited for", load.busy)
			held := load.held()
			srv.KillFor(outage)
			load.restarted()
			long := outage > testLease
			testenv.Until(t, "every key live again after the restart", func() (bool, error) { return load.progressed(long) })
			for _, l := range held {
				var lost *dynamolock.LostError
				switch err := l.Err(); {
				case !long && (err == nil || errors.Is(err, dynamolock.ErrReleased)):
					atKill["short outage: kept"]++
				case !long:
					atKill["short outage: lost"]++
				case errors.Is(err, dynamolock.ErrReleased):
					atKill["long outage: released during it"]++
				case errors.As(err, &lost) && lost.Cause == dynamolock.Expired && lost.Last != nil:
					atKill["long outage: expired, with the DynamoDB error"]++
				default:
					t.Errorf("lock %s (token %d) held through an outage of %v: %v; want Expired with the DynamoDB error",
						l.Key(), l.Token(), outage, err)
				}
			}
		}
	}
	stop()
	wg.Wait()

	acquisitions, broken := load.ledger.counts()
	for _, b := range broken {
		t.Error(b)
	}
	disordered := 0
	for k := 0; k < keys; k++ {
		out, err := api.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table),
			Key: docKey("doc/k" + strconv.Itoa(k)), ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		toks := fencedTokens(out.Item)
		if !slices.IsSorted(toks) {
			disordered++
			t.Errorf("k%d: fenced writes accepted in token order %v", k, toks)
		}
	}
	load.mu.Lock()
	defer load.mu.Unlock()
	testenv.Figures(t, "dynamolock DynamoDB restart", "%d restarts, %d acquisitions, %d overlaps, token regressions or untrue releases, %d keys with fenced writes out of token order, %d holders lapsed in long outages and learned it (Expired, with the DynamoDB error)",
		2*cycles, acquisitions, len(broken), disordered, atKill["long outage: expired, with the DynamoDB error"])
	t.Logf("locks held at the kills: %v; participants: %v", atKill, load.outcomes)
}

// restartLoad is what TestServerRestart's participants share.
type restartLoad struct {
	ledger *ledger

	mu        sync.Mutex
	holding   map[string][]*dynamolock.Lock // per key, locks between acquisition and Release
	waiting   map[string]int                // per key, participants in Acquire
	since     map[string]int                // per key, acquisitions since the last restart
	restartAt time.Time
	outcomes  map[string]int // what fenced writes, holds and releases ended with
}

// participate takes the lock key again and again until ctx ends: it
// appends its token to the key's fenced item, holds the lock for a random
// time up to three leases (so holds span the outages) or until it is lost,
// and releases it.
func (r *restartLoad) participate(ctx context.Context, t *testing.T, c *dynamolock.Client, api *dynamodb.Client, table, key string) {
	count := func(what string) {
		r.mu.Lock()
		r.outcomes[what]++
		r.mu.Unlock()
	}
	for ctx.Err() == nil {
		r.mu.Lock()
		r.waiting[key]++
		r.mu.Unlock()
		floor := r.ledger.floor(key)
		l, err := c.Acquire(ctx, key)
		r.mu.Lock()
		r.waiting[key]--
		r.mu.Unlock()
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("acquire %s: %v", key, err)
			}
			return
		}
		r.ledger.acquired(key, l, floor)
		r.mu.Lock()
		r.holding[key] = append(r.holding[key], l)
		r.since[key]++
		r.mu.Unlock()

		err = fencedAppend(ctx, api, table, "doc/"+key, l)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			count("fenced write accepted")
		case errors.As(err, &ccf):
			count("fenced write refused")
		default:
			count("fenced write failed")
		}
		hold := time.NewTimer(rand.N(3 * testLease))
		select {
		case <-l.Lost():
			var lost *dynamolock.LostError
			if errors.As(l.Err(), &lost) {
				count("lost during the hold: " + lost.Cause.String())
			}
		case <-hold.C:
		case <-ctx.Done():
		}
		hold.Stop()

		r.mu.Lock()
		r.holding[key] = slices.DeleteFunc(r.holding[key], func(h *dynamolock.Lock) bool { return h == l })
		r.mu.Unlock()
		called := time.Now()
		err = l.Close()
		r.ledger.released(key, l, called, err)
		var lost *dynamolock.LostError
		switch {
		case err == nil:
			count("released")
		case errors.As(err, &lost):
			count("release: lost before: " + lost.Cause.String())
		default:
			count("release not written")
		}
	}
}

// busy reports whether every key is held by a lock that has confirmed a
// heartbeat, and waited for.
func (r *restartLoad) busy() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key := range r.since {
		beating := false
		for _, l := range r.holding[key] {
			beating = beating || l.ValidUntil().Sub(r.ledger.acquiredAt(l)) > testLease
		}
		if !beating || r.waiting[key] == 0 {
			return false, nil
		}
	}
	return true, nil
}

// held returns the locks held now.
func (r *restartLoad) held() []*dynamolock.Lock {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*dynamolock.Lock
	for _, ls := range r.holding {
		out = append(out, ls...)
	}
	return out
}

// restarted notes that the server has just restarted.
func (r *restartLoad) restarted() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restartAt = time.Now()
	for key := range r.since {
		r.since[key] = 0
	}
}

// progressed reports whether every key is live again since the restart:
// acquired since, or (unless acquired is set) held by a lock that has
// confirmed a write sent since (its validity reaches a lease past the
// restart).
func (r *restartLoad) progressed(acquired bool) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, n := range r.since {
		live := n > 0
		for _, l := range r.holding[key] {
			live = live || !acquired && l.ValidUntil().Sub(r.restartAt) >= testLease
		}
		if !live {
			return false, nil
		}
	}
	return true, nil
}

// fencedAppend appends l's token to the list "tokens" of the item doc, a
// write guarded by l's fence: it applies only if no higher token has
// written the item.
func fencedAppend(ctx context.Context, api dynamolock.DynamoDBAPI, table, doc string, l *dynamolock.Lock) error {
	f, err := dynamoconditional.NewFenced(table, "pk", "fence")
	if err != nil {
		return err
	}
	tok := &types.AttributeValueMemberN{Value: strconv.FormatInt(l.Token(), 10)}
	in := &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: docKey(doc),
		UpdateExpression:         aws.String("SET #toks = list_append(if_not_exists(#toks, :none), :tok)"),
		ExpressionAttributeNames: map[string]string{"#toks": "tokens"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":none": &types.AttributeValueMemberL{},
			":tok": &types.AttributeValueMemberL{Value: []types.AttributeValue{tok}}},
	}
	if err := f.ApplyUpdate(in, l.Token()); err != nil {
		return err
	}
	_, err = api.UpdateItem(ctx, in)
	return err
}

// fencedTokens returns the tokens fencedAppend wrote to item, in order.
func fencedTokens(item map[string]types.AttributeValue) []int64 {
	l, _ := item["tokens"].(*types.AttributeValueMemberL)
	if l == nil {
		return nil
	}
	var out []int64
	for _, v := range l.Value {
		if n, ok := v.(*types.AttributeValueMemberN); ok {
			i, _ := strconv.ParseInt(n.Value, 10, 64)
			out = append(out, i)
		}
	}
	return out
}
