package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// One Client holding many locks keeps them all through a pause of the
// DynamoDB server (SIGSTOP, a server of the test's own) shorter than the
// lease minus a heartbeat, and loses them all, as expiries, in one longer
// than the lease (testenv.StallTrial). Heartbeat 2 s, 4 s under -race
// (lease 16 s): the locks must also outlast the stalls of the test's own
// dynalite (tables on disk) on a loaded machine before any pause (a lock
// that expires before it, its renewal unanswered, makes the trial
// inconclusive: another runs on fresh locks). The short pause leaves the
// resumed server two heartbeats to answer the 100 locks' renewals: on a
// loaded machine it may answer fewer than 25 a second, and a lock whose
// renewal it has not answered by then expires. A probe item written right
// after the resume, on a connection of its own, says whether it did: if
// it waited longer than those two heartbeats, locks expired in the pause
// make the trial inconclusive too.
func TestManyLocksServerPaused(t *testing.T) {
	t.Parallel() // on a server of its own
	hb := max(testenv.Scale(time.Second), 2*time.Second)
	stallTrial(t, 100, hb, 2*hb)
}

// BenchmarkManyLocksServerPaused is the same with 1,000 locks, once per
// run whatever b.N (about 75 s: heartbeat 5 s, so 200 heartbeats a
// second, which the test's own dynalite, about 400 writes a second when
// idle, confirms beside the suite's load). The Figures line is the
// result.
func BenchmarkManyLocksServerPaused(b *testing.B) {
	stallTrial(b, 1000, 5*time.Second, 0)
}

// stallTrial runs testenv.StallTrial on n locks of one Client with
// heartbeat hb and a lease of four heartbeats, leaving the store backlog
// (0: a heartbeat) to catch up after the short pause.
func stallTrial(t testing.TB, n int, hb, backlog time.Duration) {
	srv := testenv.DynamoDBServer(t)
	api := srv.Client()
	table := testenv.Table(t, api, false)
	lease := 4 * hb
	var ev testenv.Events
	c := newClient(t, api, table, dynamolock.WithLease(lease), dynamolock.WithHeartbeat(hb), dynamolock.WithObserver(observe.Func(ev.Observe)))
	prober := srv.Client() // an HTTP client of its own
	testenv.StallTrial(t, testenv.Stall{
		Name: fmt.Sprintf("dynamolock DynamoDB server (%d locks)", n),
		Hold: func(trial int) []testenv.HeldLock {
			locks, _ := holdAll(t, c, lease, fmt.Sprintf("stall%d", trial), n)
			return testenv.Held(locks)
		},
		Lease: lease, Heartbeat: hb, Backlog: backlog,
		Pause: srv.Pause, Resume: srv.Resume,
		Probe: func(ctx context.Context) error {
			_, err := prober.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
				Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "probe"}}})
			return err
		},
		Calls:   dynamolock.MaxHeartbeats,
		Valid:   func(l testenv.HeldLock) time.Time { return l.(*dynamolock.Lock).ValidUntil() },
		Renewed: func(key string) int { return len(ev.Of(key, dynamolock.EventRenewed)) },
		Stored: func(l testenv.HeldLock) error {
			item := readItem(t, api, table, l.Key())
			if tok := attrN(item, dynamolock.TokenAttr); tok != fmt.Sprint(l.Token()) || item[dynamolock.ReleasedAttr] != nil || attrS(item, dynamolock.OwnerAttr) != c.Owner() {
				return fmt.Errorf("the item carries token %s, owner %q, released %v", tok, attrS(item, dynamolock.OwnerAttr), item[dynamolock.ReleasedAttr])
			}
			return nil
		},
		Expired: func(err error) bool {
			var lost *dynamolock.LostError
			return errors.As(err, &lost) && lost.Cause == dynamolock.Expired
		},
	})
}
