package growth_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/internal/timepart"
)

// partitioned applies the time-partitioned layout of tables idem and ib
// (as `nolock schema -partitioned` prints it) and the day partitions from
// yesterday to tomorrow, then the packages' own CreateSchema, which must
// leave the layout as it is.
func partitioned(t *testing.T, pool *pgxpool.Pool, idem, ib string) (*idempotency.Store, *inbox.Inbox) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, timepart.DDL(idem, ib)); err != nil {
		t.Fatalf("apply the partitioned layout: %v", err)
	}
	for _, table := range []string{idem, ib} {
		var made int
		if err := pool.QueryRow(ctx, `SELECT `+timepart.Function+`($1, current_date - 1, 3)`, table).Scan(&made); err != nil || made != 3 {
			t.Fatalf("create %s's partitions: %d made (%v), want 3", table, made, err)
		}
	}
	store, err := idempotency.New(pool, idempotency.WithTable(idem))
	if err != nil {
		t.Fatal(err)
	}
	in := openInbox(t, pool, ib)
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatalf("CreateSchema on the partitioned layout: %v", err)
	}
	for _, table := range []string{idem, ib} {
		var kind string
		if err := pool.QueryRow(ctx, `SELECT relkind FROM pg_class WHERE oid = $1::regclass`, table).Scan(&kind); err != nil || kind != "p" {
			t.Fatalf("%s after CreateSchema: relkind %q (%v), want p (partitioned)", table, kind, err)
		}
	}
	return store, in
}

// partitionOf names the partition that holds the row of table where
// column = value.
func partitionOf(t *testing.T, pool *pgxpool.Pool, table, column, value string) string {
	t.Helper()
	var part string
	err := pool.QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM `+pgx.Identifier{table}.Sanitize()+` WHERE `+pgx.Identifier{column}.Sanitize()+` = $1`, value).Scan(&part)
	if err != nil {
		t.Fatalf("row %s = %q of %s: %v", column, value, table, err)
	}
	return part
}

// The partitioned layout has the plain layout's columns, types, defaults
// and indexed columns: the library's statements see one table either way.
func TestPartitionedLayoutMatchesPlain(t *testing.T) {
	pool := testenv.Postgres(t)
	partitioned(t, pool, "pidem", "pinbox")
	ctx := context.Background()
	plain, err := idempotency.New(pool, idempotency.WithTable("idem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	openInbox(t, pool, "inbox")
	describe := func(table string) (string, error) {
		var d string
		err := pool.QueryRow(ctx, `SELECT string_agg(column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, ''), ', ' ORDER BY ordinal_position)
  || ' | ' || (SELECT string_agg(regexp_replace(pg_get_indexdef(indexrelid), '^.* USING ', ''), ', ' ORDER BY 1) FROM pg_index WHERE indrelid = $1::text::regclass)
FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1::text`, table).Scan(&d)
		return d, err
	}
	for _, pair := range [][2]string{{"pidem", "idem"}, {"pinbox", "inbox"}} {
		p, err1 := describe(pair[0])
		q, err2 := describe(pair[1])
		if err := errors.Join(err1, err2); err != nil || p != q {
			t.Errorf("%s and %s differ (%v):\n%s\n%s", pair[0], pair[1], err, p, q)
		}
	}
}

// Every idempotency call works on the partitioned layout: a UUIDv7 key
// lands in its day's partition, another key in the default one; a key is
// claimed once by concurrent calls; replays, a mismatch and Exec behave
// as on the plain layout; Reap deletes expired records in any partition;
// and dropping a day's partition makes its keys unused, as expiry does.
func TestPartitionedIdempotency(t *testing.T) {
	pool := testenv.Postgres(t)
	store, _ := partitioned(t, pool, "idem", "inbox")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer cancel()
	now := time.Now()
	v7 := v7At(now)
	var ran atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := store.Do(ctx, "pay", v7, []byte("f"), func(context.Context, pgx.Tx) ([]byte, error) {
					ran.Add(1)
					return []byte("paid"), nil
				})
				if !errors.Is(err, idempotency.ErrInProgress) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if ran.Load() != 1 {
		t.Fatalf("fn ran %d times for one key from 8 calls, want 1", ran.Load())
	}
	today := "idem_" + now.UTC().Format("20060102")
	if p := partitionOf(t, pool, "idem", "key", v7); p != today {
		t.Errorf("UUIDv7 key %s is in %s, want %s", v7, p, today)
	}
	res, err := store.Do(ctx, "pay", v7, []byte("f"), paid)
	if err != nil || !res.Replayed || string(res.Body) != "paid" {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if _, err := store.Do(ctx, "pay", v7, []byte("other"), paid); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("other fingerprint: %v, want ErrMismatch", err)
	}
	for _, key := range []string{"order-1", uuid.Must(uuid.NewV7()).String()} {
		if res, err := store.Exec(ctx, "pay", key, nil, execSQL, 7); err != nil || res.Replayed {
			t.Fatalf("Exec %s: %+v, %v", key, res, err)
		}
		if res, err := store.Exec(ctx, "pay", key, nil, execSQL, 7); err != nil || !res.Replayed {
			t.Fatalf("Exec %s again: %+v, %v, want a replay", key, res, err)
		}
	}
	if p := partitionOf(t, pool, "idem", "key", "order-1"); p != "idem_default" {
		t.Errorf("key order-1 is in %s, want idem_default", p)
	}
	// Yesterday's keys: one expired, in yesterday's partition; one in the
	// default partition, expired too.
	yesterday := v7At(now.Add(-24 * time.Hour))
	for _, key := range []string{yesterday, "order-2"} {
		if _, err := store.Do(ctx, "pay", key, nil, paid); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE idem SET expires_at = now() - interval '1 s' WHERE key = ANY($1)`, []string{yesterday, "order-2"}); err != nil {
		t.Fatal(err)
	}
	if n, err := store.Reap(ctx, 1); err != nil || n != 2 {
		t.Fatalf("Reap: %d, %v; want the 2 expired records", n, err)
	}
	// Dropping today's partition: its keys are unused again.
	if _, err := pool.Exec(ctx, `SET LOCAL lock_timeout = '10s'; DROP TABLE `+today); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT `+timepart.Function+`('idem', $1::date, 1)`, now.UTC().Format("2006-01-02")).Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	res, err = store.Do(ctx, "pay", v7, []byte("f"), paid)
	if err != nil || res.Replayed {
		t.Fatalf("after its partition was dropped, key %s: %+v, %v; want a first run", v7, res, err)
	}
}

// v7At returns a UUIDv7 of time at.
func v7At(at time.Time) string {
	u := uuid.Must(uuid.NewV7())
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

// The inbox works on the partitioned layout: a message is processed once,
// its id in its day's partition, and Reap deletes old ids there.
func TestPartitionedInbox(t *testing.T) {
	pool := testenv.Postgres(t)
	_, in := partitioned(t, pool, "idem", "inbox")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer cancel()
	var applied atomic.Int32
	h := func(context.Context, pgx.Tx, kafka.Message) error { applied.Add(1); return nil }
	ids := []string{uuid.Must(uuid.NewV7()).String(), "legacy-7"}
	for round := range 2 {
		for i, id := range ids {
			m := kafka.Message{Topic: "orders", Offset: int64(round*10 + i), Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}}
			if _, err := in.Process(ctx, []kafka.Message{m}, h); err != nil {
				t.Fatal(err)
			}
		}
	}
	if applied.Load() != 2 {
		t.Fatalf("applied %d, want 2: each id once", applied.Load())
	}
	if p := partitionOf(t, pool, "inbox", "id", "legacy-7"); p != "inbox_default" {
		t.Errorf("id legacy-7 is in %s, want inbox_default", p)
	}
	// Each id is the only row of its partition and has been updated once,
	// so both have one ctid: the reap of the old one must not take the
	// other.
	if _, err := pool.Exec(ctx, `UPDATE inbox SET processed_at = CASE WHEN id = 'legacy-7' THEN now() - interval '2 days' ELSE processed_at END`); err != nil {
		t.Fatal(err)
	}
	if n, err := in.Reap(ctx, 24*time.Hour, 1); err != nil || n != 1 {
		t.Fatalf("Reap: %d, %v; want 1, legacy-7", n, err)
	}
	var left []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(id) FROM inbox`).Scan(&left); err != nil || len(left) != 1 || left[0] != ids[0] {
		t.Fatalf("ids left after Reap: %v (%v), want %s", left, err, ids[0])
	}
}

// Why the layout partitions by key: a primary key must include the
// partition key, so partitioned by a time column the records' key is
// unique per partition only, and the takeover of an expired record, whose
// ON CONFLICT (scope, key) then has no index to arbitrate, is refused by
// PostgreSQL (42P10).
func TestPartitionedByTimeRefused(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE bytime (scope text NOT NULL, key text NOT NULL, fingerprint bytea NOT NULL,
  terminal boolean NOT NULL DEFAULT false, result bytea, created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL, PRIMARY KEY (scope, key, created_at)) PARTITION BY RANGE (created_at);
CREATE TABLE bytime_default PARTITION OF bytime DEFAULT`); err != nil {
		t.Fatal(err)
	}
	store, err := idempotency.New(pool, idempotency.WithTable("bytime"), idempotency.WithRetention(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Do(ctx, "pay", "k", nil, paid); err != nil {
		t.Fatal(err) // a first run inserts, without ON CONFLICT
	}
	testenv.Until(t, "the record expires", func() (bool, error) {
		_, err := store.Get(ctx, "pay", "k")
		return errors.Is(err, idempotency.ErrNotFound), nil
	})
	_, err = store.Do(ctx, "pay", "k", nil, paid) // the takeover
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P10" {
		t.Fatalf("Do taking over an expired key on a table partitioned by time: %v, want 42P10", err)
	}
}
