package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// etcd's own lock, fenced by nolock: the lock key's create revision is the
// token conditional.Fenced checks. etcd comes from ETCD_ENDPOINTS and
// PostgreSQL from DATABASE_URL (stand-ins for your own); TestExamples sets
// them to the test services and a fresh schema, runs it and checks what it
// prints.
func Example_fence() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(os.Getenv("ETCD_ENDPOINTS"), ","),
		DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE manifest (dataset text PRIMARY KEY, files text, fence bigint);
		INSERT INTO manifest VALUES ('events', 'seg-0001', NULL)`); err != nil {
		log.Fatal(err)
	}
	manifest, _ := conditional.NewFenced("manifest", "dataset", "fence")
	out := "seg-0101" // what the compaction wrote

	commit := func(ctx context.Context) error {
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10)) // the lease: 10 s without keepalives
		if err != nil {
			return err
		}
		defer sess.Close() // revokes the lease: releases the lock
		m := concurrency.NewMutex(sess, "/locks/compaction/events")
		if err := m.Lock(ctx); err != nil { // waits in line (create-revision order)
			return err
		}
		defer m.Unlock(context.Background())

		// The token: the lock key's create revision, read while the key is ours.
		resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpGet(m.Key())).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return errors.New("the lock was lost") // the key is gone
		}
		token := resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision

		// Fence every write to what the lock protects with it (manifest: a conditional.Fenced):
		return manifest.Update(ctx, pool, "events", token, map[string]any{"files": out}) // ErrFenced: a newer holder wrote
	}
	fmt.Println("committed:", commit(ctx))
	var files string
	_ = pool.QueryRow(ctx, `SELECT files FROM manifest WHERE dataset = 'events'`).Scan(&files)
	fmt.Println(files)
}

// TestExamples runs Example_fence on the test services, in a fresh schema.
func TestExamples(t *testing.T) {
	t.Setenv("ETCD_ENDPOINTS", strings.Join(testenv.Etcd(t), ","))
	t.Setenv("DATABASE_URL", testenv.PostgresFreshDSN(t))
	want := "committed: <nil>\nseg-0101\n"
	if got := testenv.Printed(t, Example_fence); got != want {
		t.Errorf("printed\n%s\nwant\n%s", got, want)
	}
}
