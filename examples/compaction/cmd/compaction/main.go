// Command compaction runs package compaction's story: a leader-only
// compaction job holds a dynamolock lock and freezes past its lease;
// another worker takes over with a higher token and commits; the frozen
// worker's late commit overwrites a manifest that checks nothing, and is
// refused by one fenced by the lock's token.
//
//	go run ./examples/compaction/cmd/compaction [-dynamodb http://127.0.0.1:18000] [-postgres postgres://…] [-lease 1s]
//
// The endpoint and DSN default to $NOLOCK_TEST_DYNAMODB and
// $NOLOCK_TEST_POSTGRES (see scripts/services).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nolock/nolock/examples/compaction"
	"github.com/nolock/nolock/examples/localdynamo"
)

func main() {
	endpoint := flag.String("dynamodb", os.Getenv("NOLOCK_TEST_DYNAMODB"), "DynamoDB endpoint URL")
	dsn := flag.String("postgres", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	lease := flag.Duration("lease", time.Second, "the lock's lease")
	flag.Parse()
	if *endpoint == "" || *dsn == "" {
		log.Fatal(`no -dynamodb/-postgres and no NOLOCK_TEST_DYNAMODB/NOLOCK_TEST_POSTGRES: run scripts/services up, then eval "$(scripts/services env)"`)
	}
	db := localdynamo.Client(*endpoint)
	rep, err := compaction.Run(context.Background(), compaction.Config{DynamoDB: db, DSN: *dsn, Lease: *lease, Out: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("worker-a's stale commit (token %d) refused; the manifest keeps worker-b's %s (token %d)\n", rep.TokenA, rep.Files, rep.TokenB)
}
