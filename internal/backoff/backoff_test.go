package backoff

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

var errConflict = errors.New("conflict")

func always(error) bool { return true }

func TestDelayBounds(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond}
	for i := 0; i < 100; i++ {
		if d := p.Delay(1); d != 0 {
			t.Fatalf("the first attempt waited %v", d)
		}
	}
	windows := map[int]time.Duration{2: 10 * time.Millisecond, 3: 20 * time.Millisecond,
		4: 40 * time.Millisecond, 5: 80 * time.Millisecond, 6: 100 * time.Millisecond, 70: 100 * time.Millisecond}
	for n, window := range windows {
		var max time.Duration
		for i := 0; i < 2000; i++ {
			d := p.Delay(n)
			if d < 0 || d > window {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", n, d, window)
			}
			max = maxDur(max, d)
		}
		// Full jitter spreads over the whole window: 2000 draws reach its top half.
		if max < window/2 {
			t.Errorf("attempt %d: largest of 2000 delays %v, want some above %v", n, max, window/2)
		}
	}
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

func TestDelayUsesInjectedRandomness(t *testing.T) {
	var asked int64
	p := Policy{Base: time.Millisecond, Cap: time.Second, Int64N: func(n int64) int64 { asked = n; return n - 1 }}
	if d := p.Delay(4); d != 4*time.Millisecond || asked != int64(4*time.Millisecond)+1 {
		t.Fatalf("Delay(4) = %v (asked for [0,%d)), want the top of a 4ms window", d, asked)
	}
}

func TestRetryStopsAtAttempts(t *testing.T) {
	p := Policy{Base: time.Microsecond, Cap: time.Microsecond, Attempts: 4}
	calls, retries := 0, 0
	err := p.Retry(context.Background(), func(_ context.Context, attempt int) error {
		calls++
		if attempt != calls {
			t.Fatalf("attempt %d on call %d", attempt, calls)
		}
		return errConflict
	}, always, func(int, error, time.Duration) { retries++ })
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "after 4 attempts") || !errors.Is(err, errConflict) {
		t.Fatalf("err = %v, want ExhaustedError after 4 attempts wrapping the conflict", err)
	}
	if calls != 4 || retries != 3 {
		t.Fatalf("calls %d, onRetry %d; want 4 and 3", calls, retries)
	}
}

func TestRetryReturnsSuccessAndPermanentErrors(t *testing.T) {
	permanent := errors.New("bad input")
	calls := 0
	err := Policy{}.Retry(context.Background(), func(context.Context, int) error {
		calls++
		if calls < 3 {
			return errConflict
		}
		return nil
	}, always, nil)
	if err != nil || calls != 3 {
		t.Fatalf("err %v after %d calls; want success on the third", err, calls)
	}
	calls = 0
	err = Policy{}.Retry(context.Background(), func(context.Context, int) error { calls++; return permanent },
		func(err error) bool { return errors.Is(err, errConflict) }, nil)
	if err != permanent || calls != 1 {
		t.Fatalf("err %v after %d calls; want the permanent error at once", err, calls)
	}
}

func TestRetryHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := Policy{Base: time.Hour, Cap: time.Hour, Attempts: 100}
	calls := 0
	err := p.Retry(ctx, func(context.Context, int) error {
		calls++
		cancel() // the second attempt would wait up to an hour
		return errConflict
	}, always, nil)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errConflict) || calls != 1 {
		t.Fatalf("err %v after %d calls; want context.Canceled joined with the last conflict after 1", err, calls)
	}
}

// Every retry waits, the first included, unless Immediate says the failure
// is one a retry at once resolves; then only its first retry is immediate.
func TestFirstRetryWaitsUnlessImmediate(t *testing.T) {
	errDeadlock := errors.New("deadlock")
	for _, tc := range []struct {
		name      string
		fail      error
		immediate bool
	}{{"deadlock", errDeadlock, false}, {"conflict", errConflict, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var delays []time.Duration
			p := Policy{Base: time.Microsecond, Cap: time.Microsecond, Attempts: 3,
				Int64N:    func(n int64) int64 { return n - 1 },
				Immediate: func(err error) bool { return errors.Is(err, errConflict) }}
			_ = p.Retry(context.Background(), func(context.Context, int) error { return tc.fail }, always,
				func(_ int, _ error, d time.Duration) { delays = append(delays, d) })
			if len(delays) != 2 || delays[1] == 0 || (delays[0] == 0) != tc.immediate {
				t.Fatalf("delays %v; want the first immediate: %v, the second not", delays, tc.immediate)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Policy{{Base: -1}, {Cap: -1}, {Base: time.Second, Cap: time.Millisecond}, {Attempts: -1}} {
		if err := p.Validate(); err == nil {
			t.Errorf("%+v: want an error", p)
		}
		if err := p.Retry(context.Background(), func(context.Context, int) error { t.Fatal("op ran"); return nil }, always, nil); err == nil {
			t.Errorf("%+v: Retry ran with an invalid policy", p)
		}
	}
}
