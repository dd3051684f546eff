package dynamocas_test

// The examples are whole programs: DynamoDB comes from the AWS SDK's
// default configuration and the table from DYNAMODB_TABLE (stand-ins for
// your own). Under go test, TestMain points AWS_ENDPOINT_URL_DYNAMODB at the
// test services and DYNAMODB_TABLE at a fresh table (see
// testenv.ExampleMain), so the examples run and their Output is checked.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
)

type Counter struct{ Views int }

// A Store on DynamoDB: every write is conditioned on the version.
func ExampleNewBackend() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx) // region, credentials, AWS_ENDPOINT_URL_DYNAMODB
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE") // a table whose string hash key is "pk"
	backend, err := dynamocas.NewBackend(ddb, table)
	if err != nil {
		log.Fatal(err)
	}
	store, _ := cas.NewStore(backend, cas.JSON[Counter]{})
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
	fmt.Println("stale delete refused:", errors.Is(err, cas.ErrConflict))
	// Output:
	// views: 1 version: 2
	// stale delete refused: true
}
