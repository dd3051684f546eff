package conditional

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// A home outside the buckets, or without buckets, is refused by NewStock
// with an error naming it.
func TestWithHomeValidation(t *testing.T) {
	var db struct{ DB } // never called: NewStock refuses before any I/O
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"no buckets", []Option{WithHome(0)}, "home needs buckets > 1"},
		{"negative", []Option{WithBuckets(4), WithHome(-1)}, "home -1 outside [0, 4)"},
		{"past the last bucket", []Option{WithBuckets(4), WithHome(4)}, "home 4 outside [0, 4)"},
	} {
		if _, err := NewStock(db, tc.opts...); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, err, tc.want)
		}
	}
	s, err := NewStock(db, WithBuckets(4), WithHome(3))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if b := s.bucketFor("sku"); b != 3 {
		t.Fatalf("a take goes to bucket %d, want the home, 3", b)
	}
}

// refill takes exactly n units, never drives a bucket below zero, writes
// each bucket at most once, and leaves the home half of the fullest other
// bucket beyond what the batch needed.
func TestRefill(t *testing.T) {
	for _, tc := range []struct {
		name     string
		bucket   []int
		qty      []int64
		home     int
		n        int64
		wantHome int64 // the home's units after; -1: the home is not written
	}{
		{"home covers", []int{0, 1, 2}, []int64{5, 10, 10}, 1, 4, 6},
		{"home short", []int{0, 1, 2}, []int64{40, 3, 10}, 1, 5, 20},
		{"home empty, one unit", []int{0, 1, 2, 3}, []int64{0, 0, 7, 1}, 0, 1, 4},
		{"the fullest holds one", []int{0, 1}, []int64{0, 1}, 0, 1, 0},
		{"need spans buckets", []int{0, 1, 2}, []int64{1, 4, 4}, 0, 9, 0},
		{"home without a row", []int{0, 2}, []int64{6, 6}, 1, 3, -1},
		{"past int64", []int{0, 1, 2}, []int64{0, math.MaxInt64, math.MaxInt64}, 0, 1, 1 << 62},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.qty)
			bs, qs := refill(tc.bucket, slices.Clone(tc.qty), tc.home, tc.n)
			after := slices.Clone(before)
			var taken int64
			for i, b := range bs {
				if slices.Index(bs, b) != i {
					t.Fatalf("bucket %d written twice: %v %v", b, bs, qs)
				}
				j := slices.Index(tc.bucket, b)
				if j < 0 || qs[i] < 0 {
					t.Fatalf("write %d := %d outside the key's buckets or below zero", b, qs[i])
				}
				taken += before[j] - qs[i]
				after[j] = qs[i]
			}
			if taken != tc.n {
				t.Fatalf("took %d units (%v → %v), want %d", taken, before, after, tc.n)
			}
			got := int64(-1)
			if i := slices.Index(bs, tc.home); i >= 0 {
				got = qs[i]
			}
			if got != tc.wantHome {
				t.Fatalf("home holds %d after (%v → %v), want %d", got, before, after, tc.wantHome)
			}
		})
	}
}

// firstFit grants in arrival order each request the rest still covers.
func TestFirstFit(t *testing.T) {
	errs, granted := firstFit(10, []int64{4, 7, 6, 1})
	if granted != 10 || errs[0] != nil || !errors.Is(errs[1], ErrSoldOut) || errs[2] != nil || !errors.Is(errs[3], ErrSoldOut) {
		t.Fatalf("firstFit(10, [4 7 6 1]) = %v, %d; want [nil sold-out nil sold-out], 10", errs, granted)
	}
	errs, granted = firstFit(0, []int64{1})
	if granted != 0 || !errors.Is(errs[0], ErrSoldOut) {
		t.Fatalf("firstFit(0, [1]) = %v, %d", errs, granted)
	}
}
