package handlerfail

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassify(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("exec: %w", &pgconn.PgError{Code: code}) }
	plain := errors.New("downstream refused")
	for _, tc := range []struct {
		name              string
		err               error
		connLost, expired bool
		want              Kind
	}{
		{"plain", plain, false, false, Counted},
		{"permanent", MarkPermanent(plain), false, false, Permanent},
		{"permanent wrapped", fmt.Errorf("x: %w", MarkPermanent(pg("40001"))), false, false, Permanent},
		{"permanent past its time", MarkPermanent(plain), false, true, Permanent},
		{"serialization failure", pg("40001"), false, false, Database},
		{"deadlock", pg("40P01"), false, false, Database},
		{"admin shutdown", pg("57P01"), false, false, Database},
		{"too many connections", pg("53300"), false, false, Database},
		{"connection failure", pg("08006"), false, false, Database},
		{"statement timeout", pg("57014"), false, false, Counted},
		{"lock timeout", pg("55P03"), false, false, Counted},
		{"unique violation", pg("23505"), false, false, Counted},
		{"no code", pg(""), false, false, Counted},
		{"one-character code", pg("0"), false, false, Counted},
		{"connection lost", plain, true, false, Database},
		{"deadlock past the batch's time", pg("40P01"), false, true, Counted},
		{"deadline past the batch's time", context.DeadlineExceeded, true, true, Counted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.err, tc.connLost, tc.expired); got != tc.want {
				t.Fatalf("Classify(%v, %v, %v) = %v, want %v", tc.err, tc.connLost, tc.expired, got, tc.want)
			}
		})
	}
	if MarkPermanent(nil) != nil {
		t.Fatal("MarkPermanent(nil) is not nil")
	}
}

// Database failures count only once more than Bound came in a row; any
// other failure resets the run and counts.
func TestTally(t *testing.T) {
	tl := Tally{Bound: 2}
	var got []bool
	for _, k := range []Kind{Database, Database, Database, Database, Counted, Database, Permanent} {
		got = append(got, tl.Counts(k))
	}
	want := []bool{false, false, true, true, true, false, true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
}
