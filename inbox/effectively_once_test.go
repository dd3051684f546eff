package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// TestChildConsumer is a consumer process for TestEffectivelyOnceWithKills:
// it runs the inbox on the group until it is killed.
func TestChildConsumer(t *testing.T) {
	testenv.ChildOnly(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("INBOX_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	group := os.Getenv("INBOX_GROUP")
	in, err := inbox.New(pool, group)
	if err != nil {
		t.Fatal(err)
	}
	r := groupReader(strings.Split(os.Getenv(testenv.EnvKafka), ","), os.Getenv("INBOX_TOPIC"), group)
	fmt.Println("consuming")
	err = in.Run(ctx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		time.Sleep(5 * time.Millisecond) // work long enough for kills to land mid-batch
		return record(ctx, tx, m)
	}, inbox.WithBatch(10, 20*time.Millisecond))
	t.Fatalf("Run returned: %v", err)
}

// The effectively-once proof on the real broker: M messages (plus
// deliberate producer duplicates) consumed by a group whose member
// processes are SIGKILLed at random points and replaced, rebalancing each
// time. At the end every message's effect is applied exactly once and none
// is lost.
func TestEffectivelyOnceWithKills(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t, 4)
	newInbox(t, pool)
	brokers, topic := testenv.Topic(t, 4)
	const m, dups = 400, 40
	ids := make([]string, 0, m+dups)
	for i := 0; i < m; i++ {
		ids = append(ids, fmt.Sprint("pay-", i))
	}
	for i := 0; i < dups; i++ { // a producer that retried: same id, new offset
		ids = append(ids, ids[rand.IntN(m)])
	}
	tr := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, Transport: tr}
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = kafka.Message{Key: []byte(id), Value: []byte("v-" + id), Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()
	tr.CloseIdleConnections()

	env := []string{"INBOX_DSN=" + testenv.PostgresDSNFor(t, schema), "INBOX_GROUP=" + testenv.Name("g"), "INBOX_TOPIC=" + topic}
	start := func() *testenv.Child {
		c := testenv.StartChild(t, "TestChildConsumer", env...)
		c.WaitFor("consuming", time.Minute)
		return c
	}
	members := []*testenv.Child{start(), start()}
	kills := 0
	deadline := time.Now().Add(2 * time.Minute)
	for distinct := 0; distinct < m; distinct = count(t, pool, `SELECT count(DISTINCT id) FROM effects`) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d messages applied after 2 minutes and %d kills", distinct, m, kills)
		}
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		if kills < 4 {
			i := rand.IntN(len(members))
			members[i].Kill()
			kills++
			members[i] = start() // a replacement joins: another rebalance
		}
	}
	total := count(t, pool, `SELECT count(*) FROM effects`)
	t.Logf("%d messages (+%d producer duplicates) applied once each across %d kills", m, dups, kills)
	if total != m || kills < 3 {
		t.Fatalf("%d effects for %d distinct messages after %d kills: some applied twice", total, m, kills)
	}
}
