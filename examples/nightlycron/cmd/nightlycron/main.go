// Command nightlycron runs package nightlycron's story: six replicas fire
// the nightly report at 02:00 and a dynamolock lock named by the date
// makes one of them run it; on the second night the winner crashes
// mid-job and another replica takes the lock over one lease later.
//
//	go run ./examples/nightlycron/cmd/nightlycron [-dynamodb http://127.0.0.1:18000] [-replicas 6] [-nights 5] [-lease 2s]
//
// The endpoint defaults to $AWS_ENDPOINT_URL_DYNAMODB, else $AWS_ENDPOINT_URL.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nolock/nolock/examples/localdynamo"
	"github.com/nolock/nolock/examples/nightlycron"
)

func main() {
	endpoint := flag.String("dynamodb", cmp.Or(os.Getenv("AWS_ENDPOINT_URL_DYNAMODB"), os.Getenv("AWS_ENDPOINT_URL")), "DynamoDB endpoint URL")
	replicas := flag.Int("replicas", 6, "replicas firing the job")
	nights := flag.Int("nights", 5, "nights to run")
	lease := flag.Duration("lease", 2*time.Second, "the lock's lease")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("no -dynamodb and no AWS_ENDPOINT_URL_DYNAMODB or AWS_ENDPOINT_URL")
	}
	db := localdynamo.Client(*endpoint)
	rep, err := nightlycron.Run(context.Background(), nightlycron.Config{
		DynamoDB: db, Replicas: *replicas, Nights: *nights, Lease: *lease, Job: 500 * time.Millisecond, Out: os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d nights, each report written once; %s crashed mid-job and was replaced\n", len(rep.Nights), rep.Crashed)
}
