package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/examples/internal/servicetest"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The service as a process, on PostgreSQL directly and behind PgBouncer:
// 40 payments, 10 of them sent twice, are applied once each; a poison
// message is parked and listed at /admin/parked/ (with the token only),
// which describes the consumer as read committed and running;
// both reapers run; /metrics counts the inbox's events; a batch in flight
// when SIGTERM comes commits, then the service exits 0.
func TestWorkerService(t *testing.T) {
	bin := servicetest.Build(t)
	servicetest.MissingEnv(t, bin, "DATABASE_URL", "KAFKA_BROKERS", "KAFKA_TOPIC")
	for _, d := range servicetest.Deployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema (and topic)
			testWorker(t, bin, d)
		})
	}
}

func testWorker(t *testing.T, bin string, d servicetest.Deployment) {
	pool, schema := testenv.PostgresSchema(t, 2)
	brokers, topic := testenv.Topic(t, 1) // one partition: the last message applied means every earlier one was handled
	p := servicetest.Start(t, bin, "DATABASE_URL="+d.DSN(t, schema), "KAFKA_BROKERS="+strings.Join(brokers, ","),
		"KAFKA_TOPIC="+topic, "KAFKA_GROUP="+testenv.Name("g"), "REAP_INTERVAL=50ms", "ADMIN_TOKEN=secret")
	p.WaitFor("reaper=inbox", time.Minute)
	p.WaitFor("reaper=parked", time.Minute)

	const payments = 40
	var msgs []kafka.Message
	for i := range payments {
		m := payment(fmt.Sprintf("acct-%d", i%4), fmt.Sprintf("pay-%d", i), "10")
		msgs = append(msgs, m)
		if i%4 == 0 {
			msgs = append(msgs, m) // a producer's resend
		}
	}
	msgs = append(msgs, payment("acct-0", "poison", "ten"), payment("acct-last", "pay-last", "1"))
	produce(t, brokers, topic, msgs...)
	ctx := context.Background()
	ledger := func() (rows, amount int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM ledger`).Scan(&rows, &amount); err != nil {
			t.Fatal(err)
		}
		return rows, amount
	}
	testenv.Until(t, "the last payment applied", func() (bool, error) {
		status, _, _ := p.Do(http.MethodGet, "/accounts/acct-last", "")
		return status == http.StatusOK, nil
	})
	if rows, amount := ledger(); rows != payments+1 || amount != payments*10+1 {
		t.Fatalf("ledger: %d rows, %d in all; want %d rows, %d: each payment once", rows, amount, payments+1, payments*10+1)
	}
	if status, body, _ := p.Do(http.MethodGet, "/accounts/acct-1", ""); body != `{"account":"acct-1","balance":100}`+"\n" {
		t.Fatalf("acct-1: %d %s", status, body)
	}
	if status, _, _ := p.Do(http.MethodGet, "/admin/parked/", ""); status != http.StatusUnauthorized {
		t.Fatalf("/admin/parked/ without the token: %d, want 401", status)
	}
	for _, auth := range []string{"Bearer secret", "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:secret"))} {
		if status, body, _ := p.Do(http.MethodGet, "/admin/parked/", "", "Authorization: "+auth); status != http.StatusOK || !strings.Contains(body, `"message_id":"poison"`) {
			t.Fatalf("/admin/parked/ with %s: %d %s; want the poison message", auth, status, body)
		}
	}
	// nolock doctor -service asks the same handler how the consumer reads.
	if status, body, _ := p.Do(http.MethodGet, "/admin/parked/consumer", "", "Authorization: Bearer secret"); status != http.StatusOK ||
		!strings.Contains(body, `"isolation_level":"read_committed","running":true,"partitions":1`) {
		t.Fatalf("/admin/parked/consumer: %d %s; want read_committed, running on 1 partition", status, body)
	}
	p.WaitMetrics(`nolock_outcomes_total{nolock_event="inbox.committed"}`, `nolock_outcomes_total{nolock_event="inbox.duplicate"}`,
		`nolock_outcomes_total{error_type="*strconv.NumError",nolock_event="inbox.parked"} 1`)

	// A batch in flight at SIGTERM: its balance update waits for the row
	// locked here; released after the service stopped accepting, it
	// commits before the exit.
	p.StopWhileLocked(pool, `SELECT FROM balances WHERE account = 'acct-last' FOR UPDATE`, func() {
		produce(t, brokers, topic, payment("acct-last", "pay-inflight", "5"))
	})
	if rows, amount := ledger(); rows != payments+2 || amount != payments*10+6 {
		t.Fatalf("ledger after SIGTERM: %d rows, %d in all; want %d, %d: the batch in flight committed", rows, amount, payments+2, payments*10+6)
	}
}

func payment(account, id, amount string) kafka.Message {
	return kafka.Message{Key: []byte(account), Value: []byte(amount), Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}}
}

func produce(t *testing.T, brokers []string, topic string, msgs ...kafka.Message) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: tr}
	defer w.Close()
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}
