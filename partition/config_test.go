package partition_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/partition"
)

// Every argument and option that cannot work is refused by New, naming
// it, before any I/O (the brokers here do not exist); an explicit value is
// judged as given, never read as the default.
func TestNewRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	brokers, topics := []string{"127.0.0.1:1"}, []string{"t"}
	if _, err := partition.New(&noDB{}, brokers, "g", topics); err != nil {
		t.Fatalf("no options: %v", err)
	}
	if _, err := partition.New(nil, brokers, "g", topics); !errors.Is(err, partition.ErrInvalid) {
		t.Errorf("New(nil db): %v", err)
	}
	for _, tc := range []struct {
		name    string
		brokers []string
		group   string
		topics  []string
		opts    []partition.Option
	}{
		{"brokers", nil, "g", topics, nil},
		{"brokers", []string{" "}, "g", topics, nil},
		{"group", brokers, "", topics, nil},
		{"group", brokers, "a\x00b", topics, nil},
		{"topics", brokers, "g", nil, nil},
		{"topics", brokers, "g", []string{""}, nil},
		{"topics", brokers, "g", []string{"t", "t"}, nil},
		{"option 0 is nil", brokers, "g", topics, []partition.Option{nil}},
		{"WithTable", brokers, "g", topics, []partition.Option{partition.WithTable(strings.Repeat("x", 64))}},
		{"WithTable", brokers, "g", topics, []partition.Option{partition.WithTable(strings.Repeat("x", 57))}}, // the parked table's name would be 64
		{"WithTable", brokers, "g", topics, []partition.Option{partition.WithTable("a\x00b")}},
		{"WithTable", brokers, "g", topics, []partition.Option{partition.WithTable("")}},
		{"WithMaxBatch", brokers, "g", topics, []partition.Option{partition.WithMaxBatch(0)}},
		{"WithAttempts", brokers, "g", topics, []partition.Option{partition.WithAttempts(0)}},
		{"WithStartOffset", brokers, "g", topics, []partition.Option{partition.WithStartOffset(42)}},
		{"WithBatchWait", brokers, "g", topics, []partition.Option{partition.WithBatchWait(-time.Second)}},
		{"WithKafkaCommitInterval", brokers, "g", topics, []partition.Option{partition.WithKafkaCommitInterval(-time.Second)}},
		{"WithPartitionWatchInterval", brokers, "g", topics, []partition.Option{partition.WithPartitionWatchInterval(0)}},
		{"WithHeartbeatInterval", brokers, "g", topics, []partition.Option{partition.WithHeartbeatInterval(0)}},
		{"WithHeartbeatInterval", brokers, "g", topics, []partition.Option{partition.WithHeartbeatInterval(10 * time.Second), partition.WithSessionTimeout(10 * time.Second)}},
		{"WithSessionTimeout", brokers, "g", topics, []partition.Option{partition.WithSessionTimeout(0)}},
		{"WithRebalanceTimeout", brokers, "g", topics, []partition.Option{partition.WithRebalanceTimeout(-time.Second)}},
		{"WithJoinGroupBackoff", brokers, "g", topics, []partition.Option{partition.WithJoinGroupBackoff(0)}},
		{"WithBatchTimeout", brokers, "g", topics, []partition.Option{partition.WithBatchTimeout(30 * time.Second)}}, // = default rebalance timeout
		{"WithBatchTimeout", brokers, "g", topics, []partition.Option{partition.WithRebalanceTimeout(5 * time.Second), partition.WithBatchTimeout(6 * time.Second)}},
		{"WithBatchTimeout", brokers, "g", topics, []partition.Option{partition.WithBatchTimeout(time.Microsecond)}},
		{"WithBatchTimeout", brokers, "g", topics, []partition.Option{partition.WithBatchTimeout(0)}},
		{"WithMinBytes", brokers, "g", topics, []partition.Option{partition.WithMinBytes(0)}},
		{"WithMinBytes", brokers, "g", topics, []partition.Option{partition.WithMinBytes(10), partition.WithMaxBytes(5)}},
		{"WithMinBytes", brokers, "g", topics, []partition.Option{partition.WithMinBytes(partition.DefaultMaxBytes + 1)}},
		{"WithMaxBytes", brokers, "g", topics, []partition.Option{partition.WithMaxBytes(1<<30 + 1)}},
		{"WithMaxWait", brokers, "g", topics, []partition.Option{partition.WithMaxWait(0)}},
		{"WithMaxWait", brokers, "g", topics, []partition.Option{partition.WithMaxWait(30 * time.Second)}}, // = default rebalance timeout
		{"WithMaxWait", brokers, "g", topics, []partition.Option{partition.WithRebalanceTimeout(3 * time.Second), partition.WithBatchTimeout(time.Second), partition.WithMaxWait(4 * time.Second)}},
		{"WithGroupBalancers", brokers, "g", topics, []partition.Option{partition.WithGroupBalancers()}},
		{"WithGroupBalancers", brokers, "g", topics, []partition.Option{partition.WithGroupBalancers(kafka.RangeGroupBalancer{}, nil)}},
		{"WithGroupBalancers", brokers, "g", topics, []partition.Option{partition.WithGroupBalancers(kafka.RangeGroupBalancer{}, kafka.RoundRobinGroupBalancer{}, kafka.RangeGroupBalancer{})}},
		{"WithGroupBalancers", brokers, "g", topics, []partition.Option{partition.WithGroupBalancers(namelessBalancer{})}},
		{"WithRackID", brokers, "g", topics, []partition.Option{partition.WithRackID("")}},
		{"WithRackID", brokers, "g", topics, []partition.Option{partition.WithRackID("a"), partition.WithGroupBalancers(kafka.RangeGroupBalancer{})}},
		{"WithRackID", brokers, "g", topics, []partition.Option{partition.WithRackID("a"), partition.WithGroupBalancers(kafka.RackAffinityGroupBalancer{Rack: "b"})}},
		{"WithDialer", brokers, "g", topics, []partition.Option{partition.WithDialer(nil)}},
	} {
		_, err := partition.New(&noDB{}, tc.brokers, tc.group, tc.topics, tc.opts...)
		if !errors.Is(err, partition.ErrInvalid) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s: New returned %v; want ErrInvalid naming %s", tc.name, err, tc.name)
		}
	}
	// Settings that work are kept as given.
	for name, opts := range map[string][]partition.Option{
		"short timeouts":          {partition.WithRebalanceTimeout(3 * time.Second), partition.WithBatchTimeout(2 * time.Second)},
		"short rebalance only":    {partition.WithRebalanceTimeout(3 * time.Second)}, // the batch timeout's default follows it
		"rack, default balancers": {partition.WithRackID("a")},
		"rack in a balancer": {
			partition.WithRackID("a"), partition.WithGroupBalancers(&kafka.RackAffinityGroupBalancer{Rack: "a"}),
		},
		"round robin only":          {partition.WithGroupBalancers(kafka.RoundRobinGroupBalancer{})},
		"min bytes = max bytes":     {partition.WithMinBytes(4096), partition.WithMaxBytes(4096)},
		"max wait below rebalance":  {partition.WithMaxWait(29 * time.Second)},
		"a Dialer with a client ID": {partition.WithDialer(&kafka.Dialer{ClientID: "x"})},
		"no commit to Kafka":        {partition.WithKafkaCommitInterval(0)},
		"no batch wait":             {partition.WithBatchWait(0)},
		"a nil logger and hooks":    {partition.WithLogger(nil), partition.WithOnClaim(nil), partition.WithObserver(nil)},
	} {
		if _, err := partition.New(&noDB{}, brokers, "g", topics, opts...); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Schema needs no Consumer and gives what a Consumer's Schema gives.
func TestSchema(t *testing.T) {
	t.Parallel()
	c, err := partition.New(&noDB{}, []string{"127.0.0.1:1"}, "g", []string{"t"}, partition.WithTable("parts"))
	if err != nil {
		t.Fatal(err)
	}
	ddl, err := partition.Schema("parts")
	if err != nil || ddl != c.Schema() || !strings.Contains(ddl, `"parts_parked"`) {
		t.Errorf("Schema(parts) = %q, %v; want the Consumer's %q", ddl, err, c.Schema())
	}
	if _, err := partition.Schema(strings.Repeat("x", 57)); !errors.Is(err, partition.ErrInvalid) {
		t.Errorf("Schema(57 bytes): %v", err)
	}
}

// namelessBalancer is a GroupBalancer without a protocol name.
type namelessBalancer struct{ kafka.RangeGroupBalancer }

func (namelessBalancer) ProtocolName() string { return "" }

// noDB fails the test if New did any I/O.
type noDB struct{}

func (*noDB) Begin(context.Context) (pgx.Tx, error) { panic("New must not touch the database") }
