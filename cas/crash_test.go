package cas_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// Fault: the PostgreSQL server crashes (every server process killed at
// once; a cluster of the test's own) while 16 workers add 1 to 4 counters
// through a combining Store, each retrying every error, and comes back
// 300 ms later. Each counter ends between the increments its workers were
// told committed and that plus the ones left ambiguous, and only the
// writes in flight at the crash are ambiguous.
func TestStoreServerCrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute)) // a guard against a hang
	defer cancel()
	srv := testenv.PostgresServer(t)
	pool := testenv.Pool(t, srv.DSN(), 8)
	backend, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := cas.NewStore[int64](backend, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const keys, workers, perWorker = 4, 16, 150
	for k := 0; k < keys; k++ {
		if err := store.Create(ctx, fmt.Sprint("c", k), 0); err != nil {
			t.Fatal(err)
		}
	}
	var confirmed, ambiguous [keys]atomic.Int64
	var done, failed atomic.Int64
	crash := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := w % keys
			for i := 0; i < perWorker; {
				_, err := store.Update(ctx, fmt.Sprint("c", k), func(n int64) (int64, error) { return n + 1, nil })
				switch {
				case err == nil:
					confirmed[k].Add(1)
					i++
					if done.Add(1) == workers*perWorker/3 {
						once.Do(func() { close(crash) })
					}
					continue
				case ctx.Err() != nil:
					t.Errorf("worker %d: %v", w, err)
					return
				case errors.Is(err, cas.ErrAmbiguousCommit):
					ambiguous[k].Add(1)
					i++ // it may have counted: do not add another
				}
				failed.Add(1)
				time.Sleep(20 * time.Millisecond) // the client's pause before it retries
			}
		}()
	}
	<-crash
	srv.CrashFor(300 * time.Millisecond)
	wg.Wait()
	if t.Failed() {
		return
	}
	if failed.Load() == 0 {
		t.Fatal("the crash failed no call: the test tested nothing")
	}
	var amb int64
	for k := 0; k < keys; k++ {
		v, err := store.Get(ctx, fmt.Sprint("c", k))
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := confirmed[k].Load(), confirmed[k].Load()+ambiguous[k].Load()
		if v.Value < lo || v.Value > hi {
			t.Errorf("c%d = %d, want between %d confirmed and %d confirmed or ambiguous", k, v.Value, lo, hi)
		}
		amb += ambiguous[k].Load()
	}
	// One Update in flight per worker at the crash, and at most one more
	// through a connection that died idle; one that found the server down
	// sent nothing.
	if amb > 2*workers {
		t.Errorf("%d Updates ambiguous, more than the %d that can have been in flight", amb, 2*workers)
	}
	testenv.Figures(t, "cas.Store server crash", "%d increments confirmed, %d ambiguous (at most %d can be in flight); %d calls failed across the crash and were retried; every counter between its confirmed and its confirmed plus ambiguous",
		workers*perWorker-int(amb), amb, 2*workers, failed.Load())
}
