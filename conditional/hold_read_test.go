package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// holdDeployments are the ways the tests below reach PostgreSQL: directly,
// and through PgBouncer in transaction pooling (pgx in exec mode).
var holdDeployments = []string{"direct", "pgbouncer"}

// wantStatus checks Get's answer for resource against want and against
// the row as stored.
func wantStatus(t *testing.T, h *conditional.Holds, db conditional.DB, resource string, want conditional.HoldStatus) {
	t.Helper()
	got, err := h.Get(context.Background(), resource)
	if err != nil {
		t.Fatalf("Get(%q): %v", resource, err)
	}
	want.Resource = resource
	if got.Resource != want.Resource || got.Holder != want.Holder || got.Confirmed != want.Confirmed || !got.Until.Equal(want.Until) {
		t.Fatalf("Get(%q) = %+v, want %+v", resource, got, want)
	}
	row := readHold(t, db, resource)
	switch {
	case got.Confirmed:
		if row.State != "confirmed" || row.Holder != got.Holder {
			t.Fatalf("Get(%q) = %+v, but the row is %+v", resource, got, row)
		}
	case got.Holder != "":
		if row.State != "held" || row.Holder != got.Holder || row.Until == nil || !row.Until.Equal(got.Until) {
			t.Fatalf("Get(%q) = %+v, but the row is %+v", resource, got, row)
		}
	}
}

func TestHoldsGetFreeHoldAny(t *testing.T) {
	t.Parallel()
	for _, dep := range holdDeployments {
		t.Run(dep, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.PostgresVia(t, dep, 0)
			h := newHolds(t, pool)
			all := []string{"e", "d", "c", "b", "a"}
			if err := h.Add(ctx, all...); err != nil {
				t.Fatal(err)
			}
			wantFree := func(want ...string) {
				t.Helper()
				free, err := h.Free(ctx, all)
				if err != nil || !slices.Equal(free, want) {
					t.Fatalf("Free = %v, %v; want %v in the order given", free, err, want)
				}
			}
			wantStatus(t, h, pool, "a", conditional.HoldStatus{})
			wantFree(all...)

			until, err := h.Hold(ctx, "b", "alice", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, h, pool, "b", conditional.HoldStatus{Holder: "alice", Until: until})
			wantFree("e", "d", "c", "a")
			if err := h.Confirm(ctx, "b", "alice"); err != nil {
				t.Fatal(err)
			}
			wantStatus(t, h, pool, "b", conditional.HoldStatus{Holder: "alice", Confirmed: true})
			wantFree("e", "d", "c", "a")

			// HoldAny takes a free one, and a retry by the same holder gets
			// the same one again, with a new end.
			got, until, err := h.HoldAny(ctx, []string{"b", "c"}, "bob", time.Minute)
			if err != nil || got != "c" {
				t.Fatalf("HoldAny(b confirmed, c free) = %q, %v; want c", got, err)
			}
			wantStatus(t, h, pool, "c", conditional.HoldStatus{Holder: "bob", Until: until})
			again, until2, err := h.HoldAny(ctx, []string{"a", "c", "d", "e"}, "bob", 2*time.Minute)
			if err != nil || again != "c" || !until2.After(until) {
				t.Fatalf("bob's second HoldAny = %q until %v, %v; want c again, after %v", again, until2, err, until)
			}
			wantFree("e", "d", "a")

			// None free: ErrHeld naming the held one; all confirmed:
			// ErrConfirmed; an unknown one: ErrNotFound. Nothing changes.
			before := allHolds(t, pool)
			_, _, err = h.HoldAny(ctx, []string{"c", "b"}, "carol", time.Minute)
			wantHoldErr(t, "HoldAny with none free", err, "c", conditional.ErrHeld)
			_, _, err = h.HoldAny(ctx, []string{"b"}, "carol", time.Minute)
			wantHoldErr(t, "HoldAny of a confirmed one", err, "b", conditional.ErrConfirmed)
			_, _, err = h.HoldAny(ctx, []string{"a", "zz"}, "carol", time.Minute)
			wantHoldErr(t, "HoldAny with an unknown one", err, "zz", conditional.ErrNotFound)
			if _, err := h.Get(ctx, "zz"); !errors.Is(err, conditional.ErrNotFound) {
				t.Fatalf("Get of an unknown resource: %v, want ErrNotFound", err)
			}
			if _, err := h.Free(ctx, []string{"a", "zz"}); !errors.Is(err, conditional.ErrNotFound) || !strings.Contains(err.Error(), `"zz"`) {
				t.Fatalf("Free with an unknown resource: %v, want ErrNotFound naming zz", err)
			}
			if after := allHolds(t, pool); !slices.Equal(after, before) {
				t.Fatalf("refused calls changed the table:\n%v\n%v", before, after)
			}
		})
	}
}

// A hold past its end, by the database's clock, is reported free by Get
// and Free, and HoldAny takes it.
func TestHoldsReadExpiry(t *testing.T) {
	t.Parallel()
	for _, dep := range holdDeployments {
		t.Run(dep, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.PostgresVia(t, dep, 0)
			h := newHolds(t, pool)
			if err := h.Add(ctx, "s1", "s2"); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Hold(ctx, "s2", "alice", time.Minute); err != nil {
				t.Fatal(err)
			}
			until, err := h.Hold(ctx, "s1", "alice", testenv.Scale(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			waitDBPast(t, pool, until)
			if r := readHold(t, pool, "s1"); r.State != "held" || r.Holder != "alice" {
				t.Fatalf("the ended hold's row: %+v, want still held by alice", r)
			}
			wantStatus(t, h, pool, "s1", conditional.HoldStatus{})
			if free, err := h.Free(ctx, []string{"s2", "s1"}); err != nil || !slices.Equal(free, []string{"s1"}) {
				t.Fatalf("Free = %v, %v; want [s1]", free, err)
			}
			got, until, err := h.HoldAny(ctx, []string{"s1", "s2"}, "bob", time.Minute)
			if err != nil || got != "s1" {
				t.Fatalf("HoldAny = %q, %v; want the ended hold s1", got, err)
			}
			wantStatus(t, h, pool, "s1", conditional.HoldStatus{Holder: "bob", Until: until})
		})
	}
}

// Rounds of M callers of HoldAny over N < M resources, one call each:
// exactly N win, each resource goes to one of them, the other M-N get
// ErrHeld, and Get and Free agree with the table.
func TestHoldAnyRace(t *testing.T) {
	t.Parallel()
	for _, dep := range holdDeployments {
		t.Run(dep, func(t *testing.T) {
			t.Parallel()
			pool := testenv.PostgresVia(t, dep, 0)
			newHolds(t, pool)
			db := &countingDB{DB: pool}
			h, err := conditional.NewHolds(db)
			if err != nil {
				t.Fatal(err)
			}
			const rounds, n, m = 5, 8, 40
			for round := range rounds {
				calls := db.calls.Load()
				owner := testenv.HoldAnyRound(t, h, fmt.Sprint("r", round), n, m)
				t.Logf("round %d: %d callers, %d resources: %d statements", round, m, n, db.calls.Load()-calls)
				for s, who := range owner {
					wantStatus(t, h, pool, s, conditional.HoldStatus{Holder: who, Until: *readHold(t, pool, s).Until})
				}
			}
		})
	}
}

// countingDB is a DB that counts the calls that reach it.
type countingDB struct {
	conditional.DB
	calls atomic.Int32
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.calls.Add(1)
	return c.DB.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.calls.Add(1)
	return c.DB.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.calls.Add(1)
	return c.DB.QueryRow(ctx, sql, args...)
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.calls.Add(1)
	return c.DB.Begin(ctx)
}

// Bad input to Get, Free and HoldAny is ErrInvalid naming the argument,
// refused before any call reaches the database, and changes nothing.
func TestHoldsReadBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	newHolds(t, pool)
	db := &countingDB{DB: pool}
	h, err := conditional.NewHolds(db)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Add(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "a", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	before := allHolds(t, pool)
	calls := db.calls.Load()
	long := strings.Repeat("r", conditional.MaxKeyLen+1)
	tooMany := make([]string, conditional.MaxResources+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprint(i)
	}
	holdAny := func(rs []string, who string, ttl time.Duration) func() error {
		return func() error { _, _, err := h.HoldAny(ctx, rs, who, ttl); return err }
	}
	free := func(rs []string) func() error {
		return func() error { _, err := h.Free(ctx, rs); return err }
	}
	for _, tc := range []struct {
		name, want string
		op         func() error
	}{
		{"get empty", "resource is empty", func() error { _, err := h.Get(ctx, ""); return err }},
		{"get long", "resource is 513 bytes", func() error { _, err := h.Get(ctx, long); return err }},
		{"get NUL", "resource contains a NUL", func() error { _, err := h.Get(ctx, "a\x00"); return err }},
		{"free nothing", "resources is empty", free(nil)},
		{"free too many", "resources has 101 entries, more than 100", free(tooMany)},
		{"free duplicate", `resources has "b" twice`, free([]string{"b", "a", "b"})},
		{"free empty entry", "resources[1] is empty", free([]string{"b", ""})},
		{"free invalid UTF-8", "resources[0] is not valid UTF-8", free([]string{"\xff"})},
		{"hold any nothing", "resources is empty", holdAny(nil, "bob", time.Minute)},
		{"hold any too many", "more than 100", holdAny(tooMany, "bob", time.Minute)},
		{"hold any duplicate", `resources has "b" twice`, holdAny([]string{"b", "b"}, "bob", time.Minute)},
		{"hold any empty entry", "resources[0] is empty", holdAny([]string{""}, "bob", time.Minute)},
		{"hold any empty holder", "holder is empty", holdAny([]string{"b"}, "", time.Minute)},
		{"hold any long holder", "holder is 513 bytes", holdAny([]string{"b"}, long, time.Minute)},
		{"hold any zero ttl", "ttl 0s", holdAny([]string{"b"}, "bob", 0)},
		{"hold any sub-µs ttl", "ttl 500ns", holdAny([]string{"b"}, "bob", 500)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	var noCtx context.Context // typed, so that vet accepts passing it
	if _, err := h.Get(noCtx, "a"); !errors.Is(err, conditional.ErrInvalid) {
		t.Errorf("Get with a nil ctx: %v, want ErrInvalid", err)
	}
	if _, _, err := h.HoldAny(noCtx, []string{"b"}, "bob", time.Minute); !errors.Is(err, conditional.ErrInvalid) {
		t.Errorf("HoldAny with a nil ctx: %v, want ErrInvalid", err)
	}
	if n := db.calls.Load() - calls; n != 0 {
		t.Errorf("bad input reached the database %d times, want 0", n)
	}
	if after := allHolds(t, pool); !slices.Equal(after, before) {
		t.Fatalf("bad input changed the table:\n%v\n%v", before, after)
	}
}

// HoldAny reports one event per call, bad input included: held with the
// resource it held, refused or failed with its resources, sorted, joined
// by ","; Get and Free report none.
func TestHoldAnyObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	events := &testenv.Events{}
	h := newHolds(t, pool, conditional.WithObserver(observe.Func(events.Observe)))
	if err := h.Add(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if got, _, err := h.HoldAny(ctx, []string{"a"}, "alice", time.Minute); err != nil || got != "a" {
		t.Fatalf("HoldAny = %q, %v", got, err)
	}
	if _, err := h.Hold(ctx, "b", "bob", time.Minute); err != nil {
		t.Fatal(err)
	}
	_, _, err := h.HoldAny(ctx, []string{"b", "a"}, "carol", time.Minute)
	wantHoldErr(t, "HoldAny with none free", err, "a", conditional.ErrHeld)
	_, _, err = h.HoldAny(ctx, []string{"zz", "a"}, "carol", time.Minute)
	wantHoldErr(t, "HoldAny with an unknown one", err, "zz", conditional.ErrNotFound)
	if _, _, err := h.HoldAny(ctx, []string{"b", "b"}, "carol", time.Minute); !errors.Is(err, conditional.ErrInvalid) {
		t.Fatalf("HoldAny with a duplicate: %v, want ErrInvalid", err)
	}
	if _, err := h.Get(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Free(ctx, []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	events.WantNames(t, map[string][]string{
		"a":    {"conditional.held"},
		"b":    {"conditional.held"},
		"a,b":  {"conditional.refused"},
		"a,zz": {"conditional.failed"},
		"b,b":  {"conditional.failed"},
	})
	for _, e := range events.Of("a", "conditional.held") {
		if e.N != 1 || e.Duration <= 0 {
			t.Errorf("HoldAny's held event: N %d, Duration %v; want 1 and > 0", e.N, e.Duration)
		}
	}
	if errs := events.Errs("a,b", "conditional.refused"); len(errs) != 1 || !errors.Is(errs[0], conditional.ErrHeld) {
		t.Errorf("HoldAny's refusal: %v, want ErrHeld", errs)
	}
}
