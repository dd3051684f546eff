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
	var m Modes
	exec := pool(t, base+"?default_query_exec_mode=describe_exec")
	if got := mode(m.For(exec).Args(1)); got != pgx.QueryExecModeExec {
		t.Errorf("describe_exec pool: first arg %v, want exec mode", got)
	}
	named := pool(t, base+"?application_name=learn")
	other := pool(t, base+"?application_name=other")
	missing := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "26000"})
	if got := mode(m.For(named).Args(1)); got != 1 {
		t.Errorf("cache_statement pool before any failure: first arg %v, want none added", got)
	}
	if m.Learn(exec, missing) || m.Learn(named, &pgconn.PgError{Code: "23505"}) || m.Learn(named, nil) {
		t.Error("Learn took a non-cache_statement db or another error")
	}
	if m.Unnamed(named) {
		t.Fatal("Unnamed before Learn")
	}
	o := m.For(named) // held from before: sees what is learnt later
	if !m.Learn(named, missing) || !m.Unnamed(named) {
		t.Fatal("Learn did not take a 26000 on a cache_statement pool")
	}
	if got := mode(o.Args(1)); got != pgx.QueryExecModeCacheDescribe {
		t.Errorf("after Learn: first arg %v, want cache_describe", got)
	}
	if got := mode(m.ForEach(named).Args()); got != pgx.QueryExecModeCacheDescribe {
		t.Errorf("ForEach after Learn: first arg %v, want cache_describe", got)
	}
	if m.Unnamed(other) || mode(m.For(other).Args(1)) != 1 {
		t.Error("another endpoint (other session parameters) fell back too")
	}
	if got := Explain(missing); got == missing || Explain(got) != got {
		t.Errorf("Explain: %v", got)
	}

	// What one owner learns is its own: another Modes on the same pool
	// has learnt nothing.
	var m2 Modes
	if m2.Unnamed(named) || mode(m2.For(named).Args(1)) != 1 || mode(m2.ForEach(named).Args(1)) != 1 {
		t.Error("a second Modes sees what the first learnt")
	}
}

// TestModesBounded checks that a Modes keeps at most maxEndpoints
// endpoints, and that what it learns of an endpoint past them holds for
// every such endpoint (sent unnamed: never wrong).
func TestModesBounded(t *testing.T) {
	const base = "postgres://u@127.0.0.1:1/db?application_name="
	var m Modes
	missing := &pgconn.PgError{Code: "26000"}
	var pools []*pgxpool.Pool
	for i := range maxEndpoints + 3 {
		p := pool(t, base+fmt.Sprint(i))
		pools = append(pools, p)
		m.For(p)
	}
	if n := len(m.endpoints); n != maxEndpoints {
		t.Fatalf("%d endpoints kept, want %d", n, maxEndpoints)
	}
	late := pools[maxEndpoints+1]
	if !m.Learn(late, missing) {
		t.Fatal("Learn refused an endpoint past the bound")
	}
	for i, p := range pools {
		if got, want := m.Unnamed(p), i >= maxEndpoints; got != want {
			t.Errorf("pool %d: Unnamed %v, want %v", i, got, want)
		}
	}
	if n := len(m.endpoints); n != maxEndpoints {
		t.Errorf("%d endpoints kept after Learn, want %d", n, maxEndpoints)
	}
}
