package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// produceTo writes one message per id to the given partition of topic,
// in order; the producer retries like a real one (kafka-go's default of
// 10 attempts).
func produceTo(t testing.TB, brokers []string, topic string, partition int, ids ...string) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: len(ids),
		BatchTimeout: 5 * time.Millisecond, MaxAttempts: 10, Transport: tr,
		Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return partition })}
	defer w.Close()
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = kafka.Message{Value: []byte("v-" + id), Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// While Run retries a failing message of partition 0 (its handler is
// held inside its second attempt), partition 1's messages, produced only
// then, are all applied; the poison is still unparked at that point. Once
// released, the poison is parked after its attempts and partition 0's
// later messages follow. Every effect exactly once.
func TestRunNoHeadOfLineStall(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parkedN, parkHook := parkCounter()
	in := newInbox(t, pool, inbox.WithAttempts(3), parkHook, inbox.WithMaxBatch(5), inbox.WithBatchWait(10*time.Millisecond))
	brokers, topic := testenv.Topic(t, 2)
	r := groupReader(brokers, topic, testenv.Name("g"))
	defer r.Close()

	retrying, release := make(chan struct{}), make(chan struct{})
	var poisonCalls atomic.Int64
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) != "v-poison" {
			return record(ctx, tx, m)
		}
		if poisonCalls.Add(1) >= 2 {
			once.Do(func() { close(retrying) })
			<-release
		}
		return errors.New("downstream keeps failing")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- in.Run(ctx, r, h)
	}()
	produceTo(t, brokers, topic, 0, "poison")
	select {
	case <-retrying:
	case err := <-done:
		t.Fatalf("Run returned %v before retrying the poison", err)
	}
	p1 := names("b", 30)
	produceTo(t, brokers, topic, 1, p1...)
	produceTo(t, brokers, topic, 0, names("a", 10)...) // behind the poison
	testenv.Until(t, "partition 1's 30 messages applied", func() (bool, error) {
		return count(t, pool, `SELECT count(*) FROM effects WHERE id LIKE 'b%'`) == len(p1), nil
	})
	if n := parkedN.Load(); n != 0 || count(t, pool, `SELECT count(*) FROM effects WHERE id LIKE 'a%'`) != 0 {
		t.Fatalf("%d parked, or partition 0 got past the poison, while its retry was held", n)
	}
	close(release)
	testenv.Until(t, "the poison parked and partition 0's 10 later messages applied", func() (bool, error) {
		return parkedN.Load() == 1 && count(t, pool, `SELECT count(*) FROM effects WHERE id LIKE 'a%'`) == 10, nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := effects(t, pool)
	if len(got) != 40 {
		t.Fatalf("%d distinct effects, want 40", len(got))
	}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("effect %s applied %d times", id, n)
		}
	}
	if n := poisonCalls.Load(); n != 3 {
		t.Fatalf("poison tried %d times, want 3 (the attempts)", n)
	}
}

// faultyReader is a group Reader whose FetchMessage fails with the errors
// in faults, one per call, between the real fetches.
type faultyReader struct {
	*kafka.Reader
	mu     sync.Mutex
	faults []error
	served atomic.Int64 // faults returned
}

func (f *faultyReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	f.mu.Lock()
	if len(f.faults) > 0 {
		err := f.faults[0]
		f.faults = f.faults[1:]
		f.mu.Unlock()
		f.served.Add(1)
		return kafka.Message{}, err
	}
	f.mu.Unlock()
	return f.Reader.FetchMessage(ctx)
}

// Retriable Kafka errors from the reader (a rebalance in progress, a
// coordinator moving or loading, a leader moving, a request timing out, a
// lost broker connection) are ridden out with backoff: Run keeps going
// and applies every message once. A permanent one ends Run with it.
func TestRunRidesOutRetriableKafkaErrors(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool)
	brokers, topic := testenv.Topic(t, 1)
	ids := names("m", 20)
	produceTo(t, brokers, topic, 0, ids...)
	retriable := []error{
		kafka.RebalanceInProgress,
		fmt.Errorf("join group: %w", kafka.NotCoordinatorForGroup),
		kafka.GroupLoadInProgress,
		kafka.NotLeaderForPartition,
		kafka.RequestTimedOut,
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")},
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
	}
	r := &faultyReader{Reader: groupReader(brokers, topic, testenv.Name("g")), faults: retriable}
	defer r.Close()
	runUntil(t, in, r, record, func() bool { return count(t, pool, `SELECT count(*) FROM effects`) == len(ids) })
	if n := r.served.Load(); n != int64(len(retriable)) {
		t.Fatalf("%d faults served, want %d", n, len(retriable))
	}
	for id, n := range effects(t, pool) {
		if n != 1 {
			t.Fatalf("effect %s applied %d times", id, n)
		}
	}

	for _, perm := range []error{kafka.TopicAuthorizationFailed, kafka.GroupAuthorizationFailed, io.EOF} {
		r := &faultyReader{Reader: groupReader(brokers, topic, testenv.Name("g")), faults: []error{kafka.RebalanceInProgress, perm}}
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
		err := in.Run(ctx, r, record)
		expired := ctx.Err() != nil
		cancel()
		r.Close()
		if !errors.Is(err, perm) || expired {
			t.Errorf("Run with %v after a rebalance: %v; want it to return the permanent error", perm, err)
		}
	}
}
