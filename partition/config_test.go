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
	ok := minimalConfig()
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

// The kafka-go settings are refused as given when they cannot work,
// naming the field, and kept when they can.
func TestConfigValidateKafkaSettings(t *testing.T) {
	t.Parallel()
	ok := minimalConfig()
	for _, tc := range []struct {
		field string
		edit  func(*partition.Config)
	}{
		{"MinBytes", func(c *partition.Config) { c.MinBytes = -1 }},
		{"MinBytes", func(c *partition.Config) { c.MinBytes, c.MaxBytes = 10, 5 }},
		{"MinBytes", func(c *partition.Config) { c.MinBytes = partition.DefaultMaxBytes + 1 }}, // above the default MaxBytes
		{"MaxBytes", func(c *partition.Config) { c.MaxBytes = -1 }},
		{"MaxBytes", func(c *partition.Config) { c.MaxBytes = 1<<30 + 1 }},
		{"MaxWait", func(c *partition.Config) { c.MaxWait = -time.Second }},
		{"MaxWait", func(c *partition.Config) { c.MaxWait = 30 * time.Second }}, // = default RebalanceTimeout
		{"MaxWait", func(c *partition.Config) {
			c.RebalanceTimeout, c.BatchTimeout, c.MaxWait = 3*time.Second, time.Second, 4*time.Second
		}},
		{"GroupBalancers", func(c *partition.Config) { c.GroupBalancers = []kafka.GroupBalancer{} }},
		{"GroupBalancers", func(c *partition.Config) { c.GroupBalancers = []kafka.GroupBalancer{kafka.RangeGroupBalancer{}, nil} }},
		{"GroupBalancers", func(c *partition.Config) {
			c.GroupBalancers = []kafka.GroupBalancer{kafka.RangeGroupBalancer{}, kafka.RoundRobinGroupBalancer{}, kafka.RangeGroupBalancer{}}
		}},
		{"GroupBalancers", func(c *partition.Config) { c.GroupBalancers = []kafka.GroupBalancer{namelessBalancer{}} }},
		{"RackID", func(c *partition.Config) {
			c.RackID, c.GroupBalancers = "a", []kafka.GroupBalancer{kafka.RangeGroupBalancer{}}
		}},
		{"RackID", func(c *partition.Config) {
			c.RackID, c.GroupBalancers = "a", []kafka.GroupBalancer{kafka.RackAffinityGroupBalancer{Rack: "b"}}
		}},
	} {
		cfg := ok
		tc.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, partition.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Validate returned %v; want ErrInvalid naming %s", tc.field, err, tc.field)
		}
	}
	// Explicit kafka-go settings that work are kept as given.
	for name, edit := range map[string]func(*partition.Config){
		"rack, default balancers": func(c *partition.Config) { c.RackID = "a" },
		"rack in a balancer": func(c *partition.Config) {
			c.RackID, c.GroupBalancers = "a", []kafka.GroupBalancer{&kafka.RackAffinityGroupBalancer{Rack: "a"}}
		},
		"round robin only":         func(c *partition.Config) { c.GroupBalancers = []kafka.GroupBalancer{kafka.RoundRobinGroupBalancer{}} },
		"MinBytes = MaxBytes":      func(c *partition.Config) { c.MinBytes, c.MaxBytes = 4096, 4096 },
		"MaxWait below rebalance":  func(c *partition.Config) { c.MaxWait = 29 * time.Second },
		"a Dialer with a clientID": func(c *partition.Config) { c.Dialer = &kafka.Dialer{ClientID: "x"} },
	} {
		cfg := ok
		edit(&cfg)
		if _, err := partition.New(&noDB{}, cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	d := partition.DefaultConfig()
	if d.MinBytes != partition.DefaultMinBytes || d.MaxBytes != partition.DefaultMaxBytes || d.MaxWait != partition.DefaultMaxWait ||
		len(d.GroupBalancers) != 2 || d.GroupBalancers[0].ProtocolName() != "range" || d.GroupBalancers[1].ProtocolName() != "roundrobin" {
		t.Errorf("DefaultConfig's kafka-go settings: %+v", d)
	}
}

// minimalConfig is a Config with only the required fields, for brokers
// that do not exist.
func minimalConfig() partition.Config {
	return partition.Config{Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"},
		Handler: func(context.Context, pgx.Tx, []kafka.Message) error { return nil }}
}

// namelessBalancer is a GroupBalancer without a protocol name.
type namelessBalancer struct{ kafka.RangeGroupBalancer }

func (namelessBalancer) ProtocolName() string { return "" }

// noDB fails the test if New did any I/O.
type noDB struct{}

func (*noDB) Begin(context.Context) (pgx.Tx, error) { panic("New must not touch the database") }
