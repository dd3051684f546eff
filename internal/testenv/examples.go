package testenv

import (
	"net/url"
	"testing"
)

// ExampleDeployment is one way an example's test reaches PostgreSQL.
type ExampleDeployment struct {
	Name string
	// DSN returns a DSN whose sessions use a fresh schema, made for the
	// calling test and dropped when it ends.
	DSN func(t testing.TB) string
}

// ExampleDeployments lists the deployments an example's test runs on:
// the shared PostgreSQL directly, in pgx's default mode, and through the
// shared PgBouncer (transaction pooling) in exec mode, the setting
// docs/deploying.md gives for PgBouncer before 1.21. Under NOLOCK_STRESS=1
// the list adds PgBouncer in every other mode it serves: simple_protocol,
// cache_describe and describe_exec.
func ExampleDeployments() []ExampleDeployment {
	d := []ExampleDeployment{{"direct", PostgresFreshDSN}, viaPgBouncer("exec")}
	if Stress() {
		d = append(d, viaPgBouncer("simple_protocol"), viaPgBouncer("cache_describe"), viaPgBouncer("describe_exec"))
	}
	return d
}

// viaPgBouncer is the deployment through the shared PgBouncer with pgx's
// default_query_exec_mode set to mode in the DSN.
func viaPgBouncer(mode string) ExampleDeployment {
	return ExampleDeployment{"pgbouncer/" + mode, func(t testing.TB) string {
		t.Helper()
		_, schema := PostgresSchema(t, 1)
		dsn := PgBouncerDSNFor(t, schema)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("testenv: %s: %v", EnvPgBouncer, err)
		}
		q := u.Query()
		q.Set("default_query_exec_mode", mode)
		u.RawQuery = q.Encode()
		return u.String()
	}}
}
