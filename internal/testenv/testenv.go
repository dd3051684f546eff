// Package testenv connects tests to the real services that scripts/services
// starts (PostgreSQL, PgBouncer, Apache Kafka, DynamoDB-compatible servers,
// Redis, etcd) and gives each test its own schema, topic or table, removed
// when the test ends. It also builds the deployments and faults tests need:
// a private PostgreSQL to crash, a primary with a synchronous standby to
// fail over (PostgresPair), a private PgBouncer, child processes to pause
// or kill, proxies that delay or cut connections, and the three-broker
// Kafka cluster (Kafka3, on request).
//
// A missing service fails the test when CI or NOLOCK_REQUIRE_SERVICES is set,
// and skips it otherwise with a message naming the setup command; the
// three-broker cluster is opt-in (see Kafka3).
package testenv

import (
	"os"
	"testing"

	"github.com/nolock/nolock/internal/services"
)

// The variables scripts/services env prints.
const (
	EnvPostgres   = "NOLOCK_TEST_POSTGRES"    // a libpq DSN
	EnvKafka      = "NOLOCK_TEST_KAFKA"       // comma-separated brokers
	EnvDynamoDB   = "NOLOCK_TEST_DYNAMODB"    // endpoint URL of the default server
	EnvDynamoDBTx = "NOLOCK_TEST_DYNAMODB_TX" // endpoint URL of a server with transactions
	// EnvPostgresLog is the log file of EnvPostgres's server, whose lines
	// name their session's database ("db=NAME"; see ErrorLines).
	EnvPostgresLog = "NOLOCK_TEST_POSTGRES_LOG"
)

// need returns the value of the environment variable name, or ends the test:
// with Fatal when services are required, with Skip otherwise.
func need(t testing.TB, name string) string {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	missing(t, name+" is not set: start the services with `scripts/services up` and load them with `eval \"$(scripts/services env)\"` (or run scripts/test)")
	return ""
}

// missing ends the test for want of a service or its setup, described by
// msg: with Fatal when services are required, with Skip otherwise.
func missing(t testing.TB, msg string) {
	t.Helper()
	if Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// Required reports whether a missing service must fail a test rather than
// skip it: under CI, and under scripts/test, which started the services.
func Required() bool {
	return os.Getenv("CI") != "" || os.Getenv("NOLOCK_REQUIRE_SERVICES") != ""
}

// Name returns prefix followed by an underscore and 12 random hex digits,
// a valid identifier for a schema, topic, group or table.
func Name(prefix string) string { return services.Name(prefix) }
