package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// serveParked mounts h as docs/operating.md shows and returns its URL for
// -service; with a password, the handler answers only requests that carry
// it as basic authentication, as examples/workerservice does.
func serveParked(t *testing.T, h http.Handler, password string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/admin/parked/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, got, _ := r.BasicAuth(); got != password {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	if password == "" {
		return srv.URL + "/admin/parked/"
	}
	return strings.Replace(srv.URL, "http://", "http://admin:"+password+"@", 1) + "/admin/parked/"
}

// produce writes one message with an id header to each of n partitions
// of topic.
func produce(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	tr := &kafka.Transport{} // its own metadata: the shared one may not know the new topic yet
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0] - '0') })}
	defer w.Close()
	var msgs []kafka.Message
	for p := range n {
		msgs = append(msgs, kafka.Message{Key: []byte{byte('0' + p)}, Value: []byte("1"), Headers: []kafka.Header{{Key: "id", Value: []byte{'m', byte('0' + p)}}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// runInbox runs an inbox of its own on r until the test ends, and returns
// it and a stop that ends Run and waits for it.
func runInbox(t *testing.T, pool *pgxpool.Pool, r inbox.Reader) (*inbox.Inbox, func()) {
	t.Helper()
	in, err := inbox.New(pool, testenv.Name("c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx, r, func(context.Context, pgx.Tx, kafka.Message) error { return nil }) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
			in.Close()
		}
	}
	t.Cleanup(stop)
	return in, stop
}

// groupReader is a Reader of topic in a group of its own, from the first
// offset, with isolation.
func groupReader(t *testing.T, brokers []string, topic string, isolation kafka.IsolationLevel) *kafka.Reader {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: testenv.Name("g"), StartOffset: kafka.FirstOffset,
		IsolationLevel: isolation, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { r.Close() })
	return r
}

// runPartition runs a partition consumer of topic until the test ends and
// returns it.
func runPartition(t *testing.T, pool *pgxpool.Pool, brokers []string, topic string) *partition.Consumer {
	t.Helper()
	c, err := partition.New(pool, brokers, testenv.Name("g"), []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, func(context.Context, pgx.Tx, []kafka.Message) error { return nil }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		c.Close()
	})
	return c
}

// The doctor asks each service how its consumer reads Kafka: an inbox on
// a read-committed Reader passes, one on kafka-go's default (read
// uncommitted) warns with the fix, one on a Reader without Config warns
// that its level is unknown, a partition consumer passes; an inbox whose
// Run returned warns that it is not running; a service that does not
// answer fails, and the exit status is 1. A password in a URL is not
// printed. A handler without the consumer call warns: upgrade.
func TestDoctorConsumers(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 8)
	brokers, topic := testenv.Topic(t, 2)
	produce(t, brokers, topic, 2)

	committed, stopCommitted := runInbox(t, pool, groupReader(t, brokers, topic, kafka.ReadCommitted))
	uncommitted, _ := runInbox(t, pool, groupReader(t, brokers, topic, kafka.ReadUncommitted))
	opaque, _ := runInbox(t, pool, &queueReader{})
	pc := runPartition(t, pool, brokers, topic)
	testenv.Until(t, "both inboxes applied both messages, the consumer owns both partitions", func() (bool, error) {
		return committed.Stats().Processed == 2 && uncommitted.Stats().Processed == 2 && len(pc.Stats()) == 2, nil
	})
	urls := map[string]string{
		"committed":   serveParked(t, inbox.ParkedHandler(committed, nil), "s3cret"),
		"uncommitted": serveParked(t, inbox.ParkedHandler(uncommitted, nil), ""),
		"opaque":      serveParked(t, inbox.ParkedHandler(opaque, nil), ""),
		"partition":   serveParked(t, partition.ParkedHandler(pc, nil), ""),
		"wrong":       serveParked(t, http.NotFoundHandler(), ""),
	}
	// A handler from before the consumer call takes it for a list.
	urls["old"] = serveParked(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"messages": []}`))
	}), "")
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	urls["gone"] = gone.URL + "/admin/parked/"
	dsn := testenv.PostgresDSN(t)

	code, fs := doctorFindings(t, "-postgres", dsn, "-service", urls["committed"]+","+urls["uncommitted"], "-service", urls["opaque"],
		"-service", urls["partition"])
	if code != 0 || len(find(fs, "consumer", "")) != 4 {
		t.Fatalf("exit %d, want 0 and 4 consumer findings: %+v", code, fs)
	}
	for _, f := range fs {
		if strings.Contains(f.Detail, "s3cret") {
			t.Errorf("the password is printed: %+v", f)
		}
	}
	// consumer returns the finding of the service named, checking that its
	// detail contains text.
	consumer := func(fs []finding, name, status, text string) finding {
		t.Helper()
		u, _ := url.Parse(urls[name])
		f := want(t, fs, "consumer", "service "+u.Redacted()+":", status)
		if !strings.Contains(f.Detail, text) {
			t.Errorf("%s: %q does not say %q", name, f.Detail, text)
		}
		return f
	}
	consumer(fs, "committed", pass, "inbox \"")
	consumer(fs, "committed", pass, "on "+topic+" reads read_committed, running, 2 partition(s)")
	f := consumer(fs, "uncommitted", warn, "reads read_uncommitted, running, 2 partition(s)")
	if !strings.Contains(f.Fix, "IsolationLevel: kafka.ReadCommitted") || !strings.Contains(f.Fix, "waits for open transactions") {
		t.Errorf("read uncommitted: the fix does not say what to set and why: %+v", f)
	}
	f = consumer(fs, "opaque", warn, "reads unknown, running")
	if !strings.Contains(f.Fix, "*kafka.Reader") {
		t.Errorf("unknown: the fix does not name the Reader: %+v", f)
	}
	consumer(fs, "partition", pass, "partition \"")
	consumer(fs, "partition", pass, "on "+topic+" reads read_committed, running, 2 partition(s)")

	stopCommitted()
	code, fs = doctorFindings(t, "-postgres", dsn, "-service", urls["committed"], "-service", urls["gone"], "-service", urls["wrong"],
		"-service", urls["old"])
	if code != 1 {
		t.Errorf("exit %d with an unreachable service, want 1: %+v", code, fs)
	}
	f = consumer(fs, "committed", warn, "reads read_committed, not running")
	if !strings.Contains(f.Fix, "start Run") {
		t.Errorf("not running: the fix does not say so: %+v", f)
	}
	if f = consumer(fs, "old", warn, "isolation level unknown"); !strings.Contains(f.Fix, "upgrade nolock") {
		t.Errorf("a handler without the consumer call: %+v", f)
	}
	for _, name := range []string{"gone", "wrong"} {
		f = consumer(fs, name, fail, "")
		if !strings.Contains(f.Fix, "check -service") {
			t.Errorf("unreachable: no fix: %+v", f)
		}
	}

	code, stdout, stderr := runArgs(t, "doctor", "-postgres", dsn, "-service", "ftp://x/")
	if code != 2 || !strings.Contains(stderr, "not an http:// or https:// URL") {
		t.Errorf("-service ftp://x/: exit %d, stderr %q; want 2, the complaint (stdout %q)", code, stderr, stdout)
	}
}

// On the three-broker cluster (topics replicated three times), the
// consumers' findings are the same: a read-committed inbox and a
// partition consumer pass, a read-uncommitted inbox warns.
func TestDoctorConsumersCluster(t *testing.T) {
	k := testenv.Kafka3(t)
	topic := k.CreateTopic(2)
	brokers := k.Brokers()
	pool, _ := testenv.PostgresSchema(t, 8)
	produce(t, brokers, topic, 2)
	committed, _ := runInbox(t, pool, groupReader(t, brokers, topic, kafka.ReadCommitted))
	uncommitted, _ := runInbox(t, pool, groupReader(t, brokers, topic, kafka.ReadUncommitted))
	pc := runPartition(t, pool, brokers, topic)
	testenv.Until(t, "both inboxes applied both messages, the consumer owns both partitions", func() (bool, error) {
		return committed.Stats().Processed == 2 && uncommitted.Stats().Processed == 2 && len(pc.Stats()) == 2, nil
	})
	services := []string{
		serveParked(t, inbox.ParkedHandler(committed, nil), ""),
		serveParked(t, inbox.ParkedHandler(uncommitted, nil), ""),
		serveParked(t, partition.ParkedHandler(pc, nil), ""),
	}
	code, fs := doctorFindings(t, "-postgres", testenv.PostgresDSN(t), "-kafka", strings.Join(brokers, ","), "-topic", topic,
		"-service", services[0], "-service", services[1], "-service", services[2])
	if code != 0 {
		t.Fatalf("exit %d, want 0: %+v", code, fs)
	}
	want(t, fs, "kafka", "replication 3, min.insync.replicas 2", pass)
	for i, c := range []struct{ text, status string }{
		{`inbox "`, pass},
		{`inbox "`, warn}, // read_uncommitted
		{`partition "`, pass},
	} {
		if f := want(t, fs, "consumer", "service "+services[i]+":", c.status); !strings.Contains(f.Detail, c.text) {
			t.Errorf("service %d: %q, want it to name the %s", i, f.Detail, c.text)
		}
	}
}
