package pgmode

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pool returns a pool on dsn that never connects (nothing here sends).
func pool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func mode(args []any) any {
	if len(args) == 0 {
		return nil
	}
	return args[0]
}

func TestOverride(t *testing.T) {
	const base = "postgres://u@127.0.0.1:1/db"
	exec := pool(t, base+"?default_query_exec_mode=describe_exec")
	if got := mode(For(exec).Args(1)); got != pgx.QueryExecModeExec {
		t.Errorf("describe_exec pool: first arg %v, want exec mode", got)
	}
	named := pool(t, base+"?application_name=learn")
	other := pool(t, base+"?application_name=other")
	missing := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "26000"})
	if got := mode(For(named).Args(1)); got != 1 {
		t.Errorf("cache_statement pool before any failure: first arg %v, want none added", got)
	}
	if Learn(exec, missing) || Learn(named, &pgconn.PgError{Code: "23505"}) || Learn(named, nil) {
		t.Error("Learn took a non-cache_statement db or another error")
	}
	if Unnamed(named) {
		t.Fatal("Unnamed before Learn")
	}
	o := For(named) // held from before: sees what is learnt later
	if !Learn(named, missing) || !Unnamed(named) {
		t.Fatal("Learn did not take a 26000 on a cache_statement pool")
	}
	if got := mode(o.Args(1)); got != pgx.QueryExecModeCacheDescribe {
		t.Errorf("after Learn: first arg %v, want cache_describe", got)
	}
	if got := mode(ForEach(named).Args()); got != pgx.QueryExecModeCacheDescribe {
		t.Errorf("ForEach after Learn: first arg %v, want cache_describe", got)
	}
	if Unnamed(other) || mode(For(other).Args(1)) != 1 {
		t.Error("another endpoint (other session parameters) fell back too")
	}
	if got := Explain(missing); got == missing || Explain(got) != got {
		t.Errorf("Explain: %v", got)
	}
}
