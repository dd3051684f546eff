package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// newHolds makes a Holds on db and creates its table.
func newHolds(t *testing.T, db conditional.DB, opts ...conditional.Option) *conditional.Holds {
	t.Helper()
	h, err := conditional.NewHolds(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h
}

// holdState is a resource's row as stored.
type holdState struct {
	State, Holder string // Holder "" when NULL
	Until         *time.Time
}

func readHold(t *testing.T, db conditional.DB, resource string) holdState {
	t.Helper()
	var r holdState
	err := db.QueryRow(context.Background(), "SELECT state, coalesce(holder, ''), hold_until FROM nolock_holds WHERE resource = $1", resource).
		Scan(&r.State, &r.Holder, &r.Until)
	if err != nil {
		t.Fatalf("read %q: %v", resource, err)
	}
	return r
}

// allHolds returns every row of nolock_holds as text, in order.
func allHolds(t *testing.T, db conditional.DB) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), "SELECT format('%s|%s|%s|%s', resource, state, holder, hold_until) FROM nolock_holds ORDER BY resource")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// wantHoldErr checks that err is a *HoldError for resource wrapping want.
func wantHoldErr(t *testing.T, what string, err error, resource string, want error) {
	t.Helper()
	var he *conditional.HoldError
	if !errors.Is(err, want) || !errors.As(err, &he) || he.Resource != resource {
		t.Fatalf("%s: err = %v, want a HoldError for %q wrapping %v", what, err, resource, want)
	}
	if msg := err.Error(); strings.Count(msg, "conditional:") != 1 || strings.Contains(msg, "\n") {
		t.Fatalf("%s: message %q: want one line with one package prefix", what, msg)
	}
}

// waitDBPast waits until the database's clock is past until.
func waitDBPast(t *testing.T, db conditional.DB, until time.Time) {
	t.Helper()
	testenv.Until(t, "the database's clock passes "+until.String(), func() (past bool, err error) {
		err = db.QueryRow(context.Background(), "SELECT clock_timestamp() > $1", until).Scan(&past)
		return past, err
	})
}

func TestHoldsLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	if err := h.Add(ctx, "s1", "s2", "s1"); err != nil {
		t.Fatal(err)
	}

	var before time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	until, err := h.Hold(ctx, "s1", "alice", time.Minute)
	if err != nil {
		t.Fatalf("Hold of a free seat: %v", err)
	}
	if r := readHold(t, pool, "s1"); r.State != "held" || r.Holder != "alice" || r.Until == nil || !r.Until.Equal(until) {
		t.Fatalf("after Hold: %+v, want held by alice until %v", r, until)
	}
	// until is the database's clock plus the TTL.
	if lo, hi := before.Add(time.Minute), before.Add(time.Minute+10*time.Second); until.Before(lo) || until.After(hi) {
		t.Fatalf("until %v, want within [%v, %v]", until, lo, hi)
	}

	_, err = h.Hold(ctx, "s1", "bob", time.Minute)
	wantHoldErr(t, "Hold of a seat alice holds", err, "s1", conditional.ErrHeld)

	// A retried Hold by the holder succeeds and resets the end.
	again, err := h.Hold(ctx, "s1", "alice", 2*time.Minute)
	if err != nil || !again.After(until) {
		t.Fatalf("alice's retried Hold: until %v, %v; want nil and after %v", again, err, until)
	}

	if err := h.Confirm(ctx, "s1", "bob"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("bob confirms alice's hold: %v, want ErrNotHolder", err)
	}
	if err := h.Release(ctx, "s1", "bob"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("bob releases alice's hold: %v, want ErrNotHolder", err)
	}
	if r := readHold(t, pool, "s1"); r.State != "held" || r.Holder != "alice" {
		t.Fatalf("after bob's refused calls: %+v, want held by alice", r)
	}

	for i := 0; i < 2; i++ { // the second Confirm is a retry
		if err := h.Confirm(ctx, "s1", "alice"); err != nil {
			t.Fatalf("alice's Confirm #%d: %v", i+1, err)
		}
	}
	if r := readHold(t, pool, "s1"); r.State != "confirmed" || r.Holder != "alice" || r.Until != nil {
		t.Fatalf("after Confirm: %+v, want confirmed by alice", r)
	}
	for _, who := range []string{"alice", "bob"} {
		_, err := h.Hold(ctx, "s1", who, time.Minute)
		wantHoldErr(t, who+" holds a confirmed seat", err, "s1", conditional.ErrConfirmed)
	}
	if err := h.Release(ctx, "s1", "alice"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("Release of a confirmed seat: %v, want ErrNotHolder", err)
	}
	if err := h.Confirm(ctx, "s1", "bob"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("bob confirms alice's confirmed seat: %v, want ErrNotHolder", err)
	}
	if err := h.Add(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if r := readHold(t, pool, "s1"); r.State != "confirmed" || r.Holder != "alice" {
		t.Fatalf("Add of an existing seat changed it: %+v", r)
	}

	// Hold, release, and someone else holds.
	if _, err := h.Hold(ctx, "s2", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx, "s2", "alice"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if r := readHold(t, pool, "s2"); r.State != "free" || r.Holder != "" || r.Until != nil {
		t.Fatalf("after Release: %+v, want free", r)
	}
	if err := h.Release(ctx, "s2", "alice"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("Release of a free seat: %v, want ErrNotHolder", err)
	}
	if _, err := h.Hold(ctx, "s2", "bob", time.Minute); err != nil {
		t.Fatalf("bob holds the released seat: %v", err)
	}

	_, err = h.Hold(ctx, "nope", "alice", time.Minute)
	wantHoldErr(t, "Hold of an unknown seat", err, "nope", conditional.ErrNotFound)
	if err := h.Confirm(ctx, "nope", "alice"); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("Confirm of an unknown seat: %v, want ErrNotFound", err)
	}
	if err := h.Release(ctx, "nope", "alice"); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("Release of an unknown seat: %v, want ErrNotFound", err)
	}
	if got := len(allHolds(t, pool)); got != 2 {
		t.Fatalf("%d rows, want 2: unknown resources must not be created", got)
	}
}

func TestHoldsTableOption(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool, conditional.WithTable(`seat "holds"`))
	if !strings.Contains(h.Schema(), `"seat ""holds"""`) {
		t.Fatalf("schema does not quote the table name:\n%s", h.Schema())
	}
	if err := h.Add(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "s", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	var holder string
	if err := pool.QueryRow(ctx, `SELECT holder FROM "seat ""holds"""`).Scan(&holder); err != nil || holder != "alice" {
		t.Fatalf("holder %q (%v), want alice", holder, err)
	}
}

// An expired hold, by the database's clock, cannot be confirmed, can still
// be released by its holder, and can be taken by anyone.
func TestHoldsExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	if err := h.Add(ctx, "s1", "s2"); err != nil {
		t.Fatal(err)
	}
	ttl := testenv.Scale(300 * time.Millisecond) // bob's Hold below comes before it ends
	until, err := h.Hold(ctx, "s1", "alice", ttl)
	if err != nil {
		t.Fatal(err)
	}
	until2, err := h.Hold(ctx, "s2", "alice", ttl)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Hold(ctx, "s1", "bob", time.Minute)
	wantHoldErr(t, "Hold before expiry", err, "s1", conditional.ErrHeld)

	waitDBPast(t, pool, until)
	if err := h.Confirm(ctx, "s1", "alice"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("Confirm of an expired hold: %v, want ErrNotHolder", err)
	}
	if r := readHold(t, pool, "s1"); r.State != "held" || r.Holder != "alice" {
		t.Fatalf("the refused Confirm changed the row: %+v", r)
	}
	if _, err := h.Hold(ctx, "s1", "bob", time.Minute); err != nil {
		t.Fatalf("bob holds the expired seat: %v", err)
	}
	if r := readHold(t, pool, "s1"); r.State != "held" || r.Holder != "bob" {
		t.Fatalf("after bob's Hold: %+v, want held by bob", r)
	}
	if err := h.Release(ctx, "s1", "alice"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("alice releases bob's seat: %v, want ErrNotHolder", err)
	}
	if err := h.Confirm(ctx, "s1", "bob"); err != nil {
		t.Fatalf("bob confirms: %v", err)
	}

	// The holder may release its own expired hold.
	waitDBPast(t, pool, until2)
	if err := h.Release(ctx, "s2", "alice"); err != nil {
		t.Fatalf("Release of one's own expired hold: %v", err)
	}
	if r := readHold(t, pool, "s2"); r.State != "free" {
		t.Fatalf("after Release: %+v, want free", r)
	}
}

// A database whose clock runs an hour ahead of the clients' decides that a
// ten-minute hold has expired; a Holds that judged by the client's clock
// would refuse. The skewed clock is a clock_timestamp() in the test's
// schema, placed before pg_catalog in the search_path of a second pool.
func TestHoldsExpiryJudgedByDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 0)
	h := newHolds(t, pool)
	_, err := pool.Exec(ctx, `CREATE FUNCTION clock_timestamp() RETURNS timestamptz LANGUAGE sql
AS $$ SELECT pg_catalog.clock_timestamp() + interval '1 hour' $$`)
	if err != nil {
		t.Fatal(err)
	}
	ahead := testenv.Pool(t, testenv.PostgresDSNFor(t, schema+", pg_catalog"), 0)
	var skew time.Duration
	if err := ahead.QueryRow(ctx, "SELECT clock_timestamp() - pg_catalog.clock_timestamp()").Scan(&skew); err != nil {
		t.Fatal(err)
	}
	if skew < 59*time.Minute {
		t.Fatalf("the skewed pool's clock is %v ahead, want an hour", skew)
	}
	hAhead, err := conditional.NewHolds(ahead)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Add(ctx, "s1", "s2"); err != nil {
		t.Fatal(err)
	}

	if _, err := h.Hold(ctx, "s1", "alice", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	// By the clients' clock alice holds for ten more minutes; by the
	// database's (as the second pool sees it) her hold ended 50 minutes ago.
	if err := hAhead.Confirm(ctx, "s1", "alice"); !errors.Is(err, conditional.ErrNotHolder) {
		t.Fatalf("Confirm judged by a clock an hour ahead: %v, want ErrNotHolder", err)
	}
	until, err := hAhead.Hold(ctx, "s1", "bob", 10*time.Minute)
	if err != nil {
		t.Fatalf("Hold judged by a clock an hour ahead: %v, want the expired hold taken", err)
	}
	if min := time.Now().Add(69 * time.Minute); until.Before(min) {
		t.Fatalf("bob's hold ends %v, want after %v: the end comes from the database's clock", until, min)
	}
	// And the normal clock sees bob's hold as current.
	_, err = h.Hold(ctx, "s1", "alice", time.Minute)
	wantHoldErr(t, "alice after bob", err, "s1", conditional.ErrHeld)

	// HoldAll judges by the same clock.
	if _, err := h.Hold(ctx, "s2", "alice", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := hAhead.HoldAll(ctx, []string{"s2"}, "carol", time.Minute); err != nil {
		t.Fatalf("HoldAll judged by a clock an hour ahead: %v, want the expired hold taken", err)
	}
	if r := readHold(t, pool, "s2"); r.Holder != "carol" {
		t.Fatalf("after carol's HoldAll: %+v", r)
	}
}

// 64 holders race for one seat, many times over: exactly one wins each.
func TestHoldsRaceOneWinner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	const rounds, racers = 10, 64
	for round := 0; round < rounds; round++ {
		seat := fmt.Sprintf("seat-%d", round)
		if err := h.Add(ctx, seat); err != nil {
			t.Fatal(err)
		}
		var won, held atomic.Int32
		var winner atomic.Value
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, racers)
		for i := 0; i < racers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				who := fmt.Sprintf("holder-%d", i)
				_, err := h.Hold(ctx, seat, who, time.Minute)
				switch {
				case err == nil:
					won.Add(1)
					winner.Store(who)
				case errors.Is(err, conditional.ErrHeld):
					held.Add(1)
				default:
					errs <- err
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		if won.Load() != 1 || held.Load() != racers-1 {
			t.Fatalf("round %d: %d won, %d refused; want 1 and %d", round, won.Load(), held.Load(), racers-1)
		}
		if r := readHold(t, pool, seat); r.State != "held" || r.Holder != winner.Load() {
			t.Fatalf("round %d: row %+v, want held by the winner %v", round, r, winner.Load())
		}
	}
}

func TestHoldAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	if err := h.Add(ctx, "a", "b", "c", "d", "e"); err != nil {
		t.Fatal(err)
	}
	want := []string{"c", "a", "b"}
	in := slices.Clone(want)
	until, err := h.HoldAll(ctx, in, "alice", time.Minute)
	if err != nil {
		t.Fatalf("HoldAll of free seats: %v", err)
	}
	if !slices.Equal(in, want) {
		t.Fatalf("HoldAll modified its argument: %v", in)
	}
	for _, s := range want {
		if r := readHold(t, pool, s); r.State != "held" || r.Holder != "alice" || !r.Until.Equal(until) {
			t.Fatalf("%s: %+v, want held by alice until %v", s, r, until)
		}
	}
	before := allHolds(t, pool)

	_, err = h.HoldAll(ctx, []string{"e", "d", "b"}, "bob", time.Minute)
	wantHoldErr(t, "HoldAll overlapping alice's", err, "b", conditional.ErrHeld)
	_, err = h.HoldAll(ctx, []string{"e", "zz", "d", "a"}, "bob", time.Minute)
	wantHoldErr(t, "HoldAll with an unknown seat", err, "zz", conditional.ErrNotFound)
	if after := allHolds(t, pool); !slices.Equal(after, before) {
		t.Fatalf("refused HoldAlls changed the table:\n%v\n%v", before, after)
	}

	if err := h.Confirm(ctx, "c", "alice"); err != nil {
		t.Fatal(err)
	}
	before = allHolds(t, pool)
	_, err = h.HoldAll(ctx, []string{"d", "c"}, "bob", time.Minute)
	wantHoldErr(t, "HoldAll with a confirmed seat", err, "c", conditional.ErrConfirmed)
	// alice re-holding a, b and her confirmed c: refused whole, a and b keep
	// their old end.
	_, err = h.HoldAll(ctx, []string{"a", "b", "c"}, "alice", 2*time.Minute)
	wantHoldErr(t, "HoldAll with one's own confirmed seat", err, "c", conditional.ErrConfirmed)
	if after := allHolds(t, pool); !slices.Equal(after, before) {
		t.Fatalf("refused HoldAlls changed the table:\n%v\n%v", before, after)
	}

	// A retried HoldAll by the holder succeeds and extends.
	again, err := h.HoldAll(ctx, []string{"b", "a"}, "alice", 2*time.Minute)
	if err != nil || !again.After(until) {
		t.Fatalf("alice's retried HoldAll: %v, %v; want nil, after %v", again, err, until)
	}
	if _, err := h.HoldAll(ctx, []string{"d", "e"}, "bob", time.Minute); err != nil {
		t.Fatalf("bob's HoldAll of free seats: %v", err)
	}
}

// 16 goroutines, each repeatedly holding 3 random seats of 10 at once and
// releasing them, with 4 more holding single seats: no deadlock (40P01) or
// other error, no seat is ever granted to two holders, every success's
// seats really are its own, and a refused HoldAll leaves nothing held.
func TestHoldAllOverlappingNeverDeadlocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	seats := make([]string, 10)
	for i := range seats {
		seats[i] = fmt.Sprintf("seat-%02d", i)
	}
	if err := h.Add(ctx, seats...); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	owner := map[string]string{} // seat → who the database granted it to
	claim := func(who string, got []string) error {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range got {
			if o := owner[s]; o != "" {
				return fmt.Errorf("%s granted to %s while %s holds it", s, who, o)
			}
			owner[s] = who
		}
		return nil
	}
	unclaim := func(got []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range got {
			delete(owner, s)
		}
	}
	countMine := func(who string) (n int, err error) {
		err = pool.QueryRow(ctx, "SELECT count(*) FROM nolock_holds WHERE holder = $1 AND state = 'held' AND hold_until > clock_timestamp()", who).Scan(&n)
		return n, err
	}

	const multi, single, rounds = 16, 4, 40
	var granted, refused atomic.Int64
	errs := make(chan error, multi+single)
	var wg sync.WaitGroup
	worker := func(who string, size int) error {
		for round := 0; round < rounds; round++ {
			want := make([]string, 0, size)
			for _, i := range rand.Perm(len(seats))[:size] {
				want = append(want, seats[i])
			}
			var err error
			if size == 1 {
				_, err = h.Hold(ctx, want[0], who, time.Minute)
			} else {
				_, err = h.HoldAll(ctx, want, who, time.Minute)
			}
			if errors.Is(err, conditional.ErrHeld) {
				refused.Add(1)
				if n, err := countMine(who); err != nil || n != 0 {
					return fmt.Errorf("%s holds %d seats (%v) after a refusal, want 0", who, n, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", who, err)
			}
			granted.Add(1)
			if err := claim(who, want); err != nil {
				return err
			}
			if n, err := countMine(who); err != nil || n != size {
				return fmt.Errorf("%s holds %d seats (%v) after a grant of %d", who, n, err, size)
			}
			unclaim(want)
			for _, s := range want {
				if err := h.Release(ctx, s, who); err != nil {
					return fmt.Errorf("%s releases %s: %w", who, s, err)
				}
			}
		}
		return nil
	}
	for g := 0; g < multi+single; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := 3
			if g >= multi {
				size = 1
			}
			if err := worker(fmt.Sprintf("g%02d", g), size); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	total := int64((multi + single) * rounds)
	t.Logf("%d granted, %d refused of %d", granted.Load(), refused.Load(), total)
	if granted.Load()+refused.Load() != total || granted.Load() == 0 {
		t.Fatalf("%d granted + %d refused, want %d in all and some granted", granted.Load(), refused.Load(), total)
	}
	for _, row := range allHolds(t, pool) {
		if !strings.Contains(row, "|free|") {
			t.Errorf("after every release: %s, want free", row)
		}
	}
}

// A Holds made on a caller's transaction confirms with it: a rollback
// leaves the hold as it was.
func TestHoldsConfirmInCallerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	if err := h.Add(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "s", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			ht, err := conditional.NewHolds(tx)
			if err != nil {
				return err
			}
			if err := ht.Confirm(ctx, "s", "alice"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the caller's own write would go here
				return err
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if err != nil && !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		want := map[bool]string{false: "held", true: "confirmed"}[commit]
		if r := readHold(t, pool, "s"); r.State != want || r.Holder != "alice" {
			t.Fatalf("commit=%v: %+v, want %s by alice", commit, r, want)
		}
	}
}

var errRollback = errors.New("roll back")

// Bad input is ErrInvalid naming the argument, and changes nothing.
func TestHoldsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	h := newHolds(t, pool)
	if err := h.Add(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "a", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	before := allHolds(t, pool)
	long := strings.Repeat("r", conditional.MaxKeyLen+1)
	hold := func(r, who string, ttl time.Duration) func() error {
		return func() error { _, err := h.Hold(ctx, r, who, ttl); return err }
	}
	holdAll := func(rs []string, who string, ttl time.Duration) func() error {
		return func() error { _, err := h.HoldAll(ctx, rs, who, ttl); return err }
	}
	for _, tc := range []struct {
		name, want string
		op         func() error
	}{
		{"hold empty resource", "resource is empty", hold("", "alice", time.Minute)},
		{"hold long resource", "resource is 513 bytes", hold(long, "alice", time.Minute)},
		{"hold NUL resource", "resource contains a NUL", hold("a\x00", "alice", time.Minute)},
		{"hold empty holder", "holder is empty", hold("b", "", time.Minute)},
		{"hold long holder", "holder is 513 bytes", hold("b", long, time.Minute)},
		{"hold zero ttl", "ttl 0s", hold("b", "bob", 0)},
		{"hold negative ttl", "ttl -1s", hold("b", "bob", -time.Second)},
		{"hold sub-µs ttl", "ttl 500ns", hold("b", "bob", 500)},
		{"hold all nothing", "resources is empty", holdAll(nil, "bob", time.Minute)},
		{"hold all duplicate", `resources has "b" twice`, holdAll([]string{"b", "a", "b"}, "bob", time.Minute)},
		{"hold all empty entry", "resources[1] is empty", holdAll([]string{"b", ""}, "bob", time.Minute)},
		{"hold all empty holder", "holder is empty", holdAll([]string{"b"}, "", time.Minute)},
		{"hold all zero ttl", "ttl 0s", holdAll([]string{"b"}, "bob", 0)},
		{"confirm empty resource", "resource is empty", func() error { return h.Confirm(ctx, "", "alice") }},
		{"confirm empty holder", "holder is empty", func() error { return h.Confirm(ctx, "a", "") }},
		{"release empty holder", "holder is empty", func() error { return h.Release(ctx, "a", "") }},
		{"release long resource", "resource is 513 bytes", func() error { return h.Release(ctx, long, "alice") }},
		{"add empty entry", "resources[1] is empty", func() error { return h.Add(ctx, "c", "") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if after := allHolds(t, pool); !slices.Equal(after, before) {
		t.Fatalf("bad input changed the table:\n%v\n%v", before, after)
	}
	if _, err := conditional.NewHolds(nil); !errors.Is(err, conditional.ErrInvalid) {
		t.Errorf("NewHolds(nil): %v, want ErrInvalid", err)
	}
	if _, err := conditional.NewHolds(pool, conditional.WithTable("")); !errors.Is(err, conditional.ErrInvalid) {
		t.Errorf("NewHolds with an empty table name: %v, want ErrInvalid", err)
	}
}
