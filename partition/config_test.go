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

// Every setting that cannot work is refused by New, naming the field,
// before any I/O (the brokers here do not exist).
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := partition.Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"},
		Handler: func(context.Context, pgx.Tx, []kafka.Message) error { return nil }}
	if err := ok.Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	if d := partition.DefaultConfig(); d.BatchTimeout != partition.DefaultRebalanceTimeout/2 || d.MaxBatch != partition.DefaultMaxBatch ||
		d.StartOffset != kafka.FirstOffset || d.Table != partition.DefaultTable {
		t.Fatalf("DefaultConfig: %+v", d)
	}
	for _, tc := range []struct {
		field string
		edit  func(*partition.Config)
	}{
		{"Brokers", func(c *partition.Config) { c.Brokers = nil }},
		{"Brokers", func(c *partition.Config) { c.Brokers = []string{" "} }},
		{"GroupID", func(c *partition.Config) { c.GroupID = "" }},
		{"Topics", func(c *partition.Config) { c.Topics = nil }},
		{"Topics", func(c *partition.Config) { c.Topics = []string{""} }},
		{"Topics", func(c *partition.Config) { c.Topics = []string{"t", "t"} }},
		{"Handler", func(c *partition.Config) { c.Handler = nil }},
		{"Table", func(c *partition.Config) { c.Table = strings.Repeat("x", 64) }},
		{"Table", func(c *partition.Config) { c.Table = strings.Repeat("x", 57) }}, // the parked table's name would be 64
		{"Table", func(c *partition.Config) { c.Table = "a\x00b" }},
		{"MaxBatch", func(c *partition.Config) { c.MaxBatch = -1 }},
		{"MaxAttempts", func(c *partition.Config) { c.MaxAttempts = -1 }},
		{"StartOffset", func(c *partition.Config) { c.StartOffset = 42 }},
		{"BatchWait", func(c *partition.Config) { c.BatchWait = -time.Second }},
		{"KafkaCommitInterval", func(c *partition.Config) { c.KafkaCommitInterval = -time.Second }},
		{"PartitionWatchInterval", func(c *partition.Config) { c.PartitionWatchInterval = -time.Second }},
		{"HeartbeatInterval", func(c *partition.Config) { c.HeartbeatInterval = 10 * time.Second; c.SessionTimeout = 10 * time.Second }},
		{"BatchTimeout", func(c *partition.Config) { c.BatchTimeout = 30 * time.Second }}, // = default RebalanceTimeout
		{"BatchTimeout", func(c *partition.Config) { c.RebalanceTimeout = 5 * time.Second; c.BatchTimeout = 6 * time.Second }},
		{"BatchTimeout", func(c *partition.Config) { c.BatchTimeout = time.Microsecond }},
	} {
		cfg := ok
		tc.edit(&cfg)
		_, err := partition.New(&noDB{}, cfg)
		if !errors.Is(err, partition.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: New returned %v; want ErrInvalid naming %s", tc.field, err, tc.field)
		}
	}
	if _, err := partition.New(nil, ok); !errors.Is(err, partition.ErrInvalid) {
		t.Errorf("New(nil db): %v", err)
	}
	// A BatchTimeout below a short RebalanceTimeout is fine.
	short := ok
	short.RebalanceTimeout, short.BatchTimeout = 3*time.Second, 2*time.Second
	if _, err := partition.New(&noDB{}, short); err != nil {
		t.Errorf("short timeouts: %v", err)
	}
}

// noDB fails the test if New did any I/O.
type noDB struct{}

func (*noDB) Begin(context.Context) (pgx.Tx, error) { panic("New must not touch the database") }
