// Command leaderjob runs package leaderjob's story: replicas of a service
// share a leader-only job through a lease on PostgreSQL; the first leader
// freezes past its lease, another takes over with a higher token, and the
// frozen leader's late write is refused by the lease's fence.
//
//	go run ./examples/leaderjob/cmd/leaderjob [-postgres postgres://…] [-replicas 3] [-pages 30] [-lease 1s]
//
// The DSN defaults to $DATABASE_URL, else pgx's defaults (the PG*
// variables).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nolock/nolock/examples/leaderjob"
)

func main() {
	dsn := flag.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
	replicas := flag.Int("replicas", 3, "replicas competing for the job")
	pages := flag.Int("pages", 30, "pages of invoices to send")
	leaseFlag := flag.Duration("lease", time.Second, "the lock's lease")
	flag.Parse()
	rep, err := leaderjob.Run(context.Background(), leaderjob.Config{
		DSN: *dsn, Replicas: *replicas, Pages: *pages, Lease: *leaseFlag, Out: os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d pages sent once each; leaders' tokens %v; %d late page refused by the fence\n", rep.Pages, rep.Leaders, rep.Refused)
}
