// Package services holds the plumbing that talks to the local services
// scripts/services starts (PostgreSQL, Apache Kafka, DynamoDB-compatible
// servers): clients, fresh topics and tables, and the races that prove each
// server is real and exact under concurrency. internal/testenv wraps it for
// tests; `nolock demo` uses it directly.
package services

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
)

// Name returns prefix followed by an underscore and 12 random hex digits,
// a valid identifier for a schema, topic, group or table.
func Name(prefix string) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return strings.ToLower(prefix) + "_" + hex.EncodeToString(b)
}

// WithSearchPath returns the postgres:// URL dsn with search_path set to
// schema, and application_name too, so a test can find its own backends in
// pg_stat_activity. pgx sends unknown URL parameters as run-time settings.
func WithSearchPath(dsn, schema string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("want a postgres:// URL, got %q (%v)", dsn, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema)
	// pgx does not decode "+" as a space in URL parameters, so a search
	// path like "s, pg_catalog" must travel as %20.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String(), nil
}
