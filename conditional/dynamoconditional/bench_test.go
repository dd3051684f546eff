package dynamoconditional_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// BenchmarkStock takes one unit of one hot key at 1, 16 and 64 clients,
// coalesced (the default) against the single-item conditional decrement
// (WithCoalescing(false): each take one conditional UpdateItem), in
// alternating rounds on the same server, and reports takes/s and
// x-uncoalesced, the ratio of the two rates in the same run:
//
//	go test -run '^$' -bench Stock -benchtime 4000x ./conditional/dynamoconditional
func BenchmarkStock(b *testing.B) {
	ctx := context.Background()
	client := testenv.DynamoDB(b)
	table := testenv.Table(b, client, false)
	newStock := func(coalesce bool) *dynamoconditional.Stock {
		s, err := dynamoconditional.NewStock(client, table, dynamoconditional.WithCoalescing(coalesce))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	stocks := []*dynamoconditional.Stock{newStock(false), newStock(true)}
	for _, clients := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			const rounds = 4
			per := int64(b.N/rounds + 1)
			key := testenv.Name("hot")
			if err := stocks[0].Put(ctx, key, 2*rounds*per); err != nil {
				b.Fatal(err)
			}
			var took [2]time.Duration
			for r := 0; r < rounds; r++ {
				for i := range stocks {
					s := stocks[(i+r)%2] // alternate which runs first
					run, err := services.RunClients(ctx, clients, per, 0, func(ctx context.Context, _ int) error {
						return s.Take(ctx, key, 1)
					})
					if err != nil {
						b.Fatal(err)
					}
					took[(i+r)%2] += run.Took
				}
			}
			n := float64(per * rounds)
			b.ReportMetric(n/took[1].Seconds(), "takes/s")
			b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "x-uncoalesced")
		})
	}
}
