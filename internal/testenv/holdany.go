package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/condcore"
)

// AnyHolds is what both backends' Holds have for HoldAnyRound.
type AnyHolds interface {
	Add(ctx context.Context, resources ...string) error
	HoldAny(ctx context.Context, resources []string, holder string, ttl time.Duration) (string, time.Time, error)
	Free(ctx context.Context, resources []string) ([]string, error)
}

// HoldAnyRound adds n resources named after prefix and races m > n
// callers of HoldAny over them, one call each, started together. It
// checks that exactly n win, each resource once, that the other m-n are
// refused with ErrHeld, and that Free then finds none free. It returns
// who won each resource.
func HoldAnyRound(t testing.TB, h AnyHolds, prefix string, n, m int) map[string]string {
	t.Helper()
	ctx := context.Background()
	seats := make([]string, n)
	for i := range seats {
		seats[i] = fmt.Sprintf("%s-seat-%d", prefix, i)
	}
	if err := h.Add(ctx, seats...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	owner := map[string]string{}
	refused := 0
	errs := make(chan error, m)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := range m {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			who := fmt.Sprintf("caller-%02d", c)
			got, _, err := h.HoldAny(ctx, seats, who, time.Minute)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				if o, dup := owner[got]; dup {
					errs <- fmt.Errorf("%s granted to %s and %s", got, o, who)
				}
				owner[got] = who
			case errors.Is(err, condcore.ErrHeld):
				refused++
			default:
				errs <- fmt.Errorf("%s: %w", who, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: %v", prefix, err)
	}
	if len(owner) != n || refused != m-n {
		t.Fatalf("%s: %d won, %d refused; want %d and %d", prefix, len(owner), refused, n, m-n)
	}
	if free, err := h.Free(ctx, seats); err != nil || len(free) != 0 {
		t.Fatalf("%s: Free = %v, %v; want none", prefix, free, err)
	}
	return owner
}
