package testenv

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/services"
)

// Rounds measures ops against each other in the same run: it runs n
// operations of each over clients goroutines, in rounds rounds of n/rounds
// (at least one) each, every round running each op once. The order of the
// ops changes from round to round, through every permutation of them in
// turn (so pass a multiple of len(ops)! as rounds), so that no op always
// runs after the same one, first in its round, or last. It returns how
// long each op took in each round: took[round][op].
func Rounds(tb testing.TB, clients, n, rounds int, ops ...func(ctx context.Context, client int) error) (took [][]time.Duration) {
	tb.Helper()
	per := max(n/rounds, 1)
	orders := permutations(len(ops))
	took = make([][]time.Duration, rounds)
	for r := range took {
		took[r] = make([]time.Duration, len(ops))
		for _, i := range orders[r%len(orders)] {
			res, err := services.RunClients(context.Background(), clients, int64(per), 0, ops[i])
			if err != nil {
				tb.Fatal(err)
			}
			took[r][i] = res.Took
		}
	}
	return took
}

// RoundsRate is op's rate over all of Rounds' rounds, in operations a
// second.
func RoundsRate(took [][]time.Duration, n, op int) float64 {
	var sum time.Duration
	for _, r := range took {
		sum += r[op]
	}
	return float64(max(n/len(took), 1)*len(took)) / sum.Seconds()
}

// RoundsRatio is the median over Rounds' rounds of op's rate over
// against's rate in the same round (1.0: op costs what against does), so
// that a burst of the machine's other load in a few rounds does not move
// it.
func RoundsRatio(took [][]time.Duration, op, against int) float64 {
	ratios := make([]float64, len(took))
	for r, t := range took {
		ratios[r] = t[against].Seconds() / t[op].Seconds()
	}
	slices.Sort(ratios)
	m := len(ratios) / 2
	if len(ratios)%2 == 1 {
		return ratios[m]
	}
	return (ratios[m-1] + ratios[m]) / 2
}

// permutations returns every order of 0..n-1, the identity first.
func permutations(n int) [][]int {
	if n <= 1 {
		return [][]int{make([]int, n)}
	}
	var all [][]int
	for _, p := range permutations(n - 1) {
		for at := len(p); at >= 0; at-- {
			q := slices.Insert(slices.Clone(p), at, n-1)
			all = append(all, q)
		}
	}
	return all
}
