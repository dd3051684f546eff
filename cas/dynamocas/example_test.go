package dynamocas_test

// The example is a whole program: DynamoDB comes from exampleDynamoDB (a
// stand-in for your own client and table). It has no Output comment, so go
// test only compiles it; TestExamples runs it against the test services and
// checks what it prints.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/internal/testenv"
)

type Counter struct{ Views int }

// A Store on DynamoDB: every write is conditioned on the version.
func ExampleNewBackend() {
	ctx := context.Background()
	ddb, table := exampleDynamoDB() // your client, and a table whose string hash key is "pk"
	backend, err := dynamocas.NewBackend(ddb, table, "pk")
	if err != nil {
		log.Fatal(err)
	}
	store, _ := dynamocas.NewStore(backend, dynamocas.JSON[Counter]{})
	defer store.Close()
	if err := store.Create(ctx, "page/home", Counter{}); err != nil {
		log.Fatal(err)
	}
	v, err := store.Update(ctx, "page/home", func(c Counter) (Counter, error) { c.Views++; return c, nil })
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("views:", v.Value.Views, "version:", v.Version)
	err = backend.Delete(ctx, "page/home", v.Version-1) // a stale version
	fmt.Println("stale delete refused:", errors.Is(err, dynamocas.ErrConflict))
}

// TestExamples runs each Example against the test services, on a fresh
// DynamoDB table.
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name string
		run  func()
		want string
	}{
		{"NewBackend", ExampleNewBackend, "views: 1 version: 2\nstale delete refused: true\n"},
	} {
		t.Run(ex.name, func(t *testing.T) {
			exampleDynamoDB = func() (*dynamodb.Client, string) {
				ddb := testenv.DynamoDB(t)
				return ddb, testenv.Table(t, ddb, false)
			}
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}

// exampleDynamoDB returns the example's client and a table; TestExamples
// sets it for each example.
var exampleDynamoDB func() (*dynamodb.Client, string)
