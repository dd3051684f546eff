// Command etcdfence answers the background article's etcd row with etcd
// itself: a leader-only job takes etcd's own lock
// (go.etcd.io/etcd/client/v3/concurrency, used as shipped) and commits to
// a manifest row in PostgreSQL through conditional.Fenced, with the lock
// key's create revision as its fencing token. The lock is etcd's; the
// fence is nolock's.
//
// # The token
//
// A concurrency.Mutex puts a key "<prefix>/<lease id>" bound to its
// session's lease, and holds the lock once every key under the prefix with
// a lower create revision is gone. A key's CreateRevision is the revision
// of the transaction that created it, taken from etcd's single revision
// counter, which Raft replicates and which never goes backwards (not
// across leader changes or restarts either). Keys are created with the
// current revision, so a later waiter always gets a higher one, and the
// lock is granted in create-revision order: each holder's create revision
// is higher than every earlier holder's. That makes it a fencing token
// with no counter of its own to keep. It is fixed for the grant, and it is
// the number Mutex.IsOwner compares, so one number guards writes inside
// etcd (a Txn with IsOwner) and outside it (Fenced).
//
// Mutex.Header().Revision is not the token: it is the store's revision
// when this client saw its turn come (after a wait, the revision of a
// later read, moved by unrelated writes anywhere in the keyspace), a
// timestamp of an observation rather than the grant's identity. The
// Mutex does not export the create revision, so token reads it in a
// transaction guarded by IsOwner: the value returned is the one the lock
// was granted with, and the read fails once the key is gone.
//
// # The scene
//
// Worker A takes the lock (token rA), writes, and freezes (a GC pause, a
// stopped VM) past its session's TTL. Here the freeze is simulated inside
// one process: A's session stops keeping its lease alive (Session.Orphan,
// as a stopped process's keepalive goroutine stops with it) and A's
// goroutine does nothing until B has committed. etcd sees what it would
// see of a real pause: no keepalives, so the lease expires and A's key is
// deleted. Worker B, waiting in Lock, gets the lock with rB > rA and
// commits. A wakes, never having looked at its lock (a check could not
// help: the pause can fall between the check and the write), and commits
// with rA: the fence refuses it with conditional.ErrFenced and B's
// manifest stays. The same write without the fence, run in a transaction
// that is rolled back, would have changed the row. main_test.go also
// pauses a real process: a child holding the lock is stopped with SIGSTOP.
//
// etcd's lock alone is not enough for correctness: a holder learns that
// its lease ended only when it next hears from etcd, which a paused
// holder does after its write. The storage must check the token.
//
//	cd examples/etcdfence && go run . [-etcd http://127.0.0.1:12379] [-postgres postgres://…]
//
// The endpoints and DSN default to $ETCDCTL_ENDPOINTS (etcdctl's
// variable) and $DATABASE_URL. This directory is a Go
// module of its own, so the library's users never download etcd's client
// and gRPC; it needs the Go version etcd's client needs (1.26).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/nolock/nolock/conditional"
)

// sceneTTL is the session TTL of the worker that pauses, in seconds:
// etcd's shortest lease at its default election timeout (1 s); a shorter
// TTL is raised to it by the server. The other worker's lease is longer
// (waiterTTL), so a slow machine cannot expire it by accident.
const (
	sceneTTL  = 2
	waiterTTL = 10
)

func main() {
	endpoints := flag.String("etcd", os.Getenv("ETCDCTL_ENDPOINTS"), "etcd client URLs, comma-separated")
	dsn := flag.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
	flag.Parse()
	var eps []string
	if *endpoints != "" {
		eps = strings.Split(*endpoints, ",")
	}
	if err := run(context.Background(), eps, *dsn); err != nil {
		log.Fatal(err)
	}
}

// errNotOwner is returned by token when the mutex's key is gone or is no
// longer the one the lock was granted with: the lock is lost.
var errNotOwner = errors.New("etcdfence: the lock's key is gone: not the owner")

// token returns the fencing token of the lock m holds: the create revision
// of m's key, read in one transaction that succeeds only while m.IsOwner()
// holds. Call it after m.Lock returns; it is one round trip to etcd.
func token(ctx context.Context, cli *clientv3.Client, m *concurrency.Mutex) (int64, error) {
	resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpGet(m.Key())).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, errNotOwner
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 {
		return 0, errNotOwner
	}
	return kvs[0].CreateRevision, nil
}

// worker is one participant: in production its own process, so here its
// own etcd client, session (lease) and mutex.
type worker struct {
	name string
	cli  *clientv3.Client
	sess *concurrency.Session
	mu   *concurrency.Mutex
}

// newWorker connects to etcd and opens a session whose lease lasts ttl
// seconds without keepalives, with a mutex on prefix.
func newWorker(name string, endpoints []string, ttl int, prefix string) (*worker, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(ttl))
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &worker{name: name, cli: cli, sess: sess, mu: concurrency.NewMutex(sess, prefix)}, nil
}

// close revokes the worker's lease (which releases its lock, if any) and
// closes its client. A lease that already expired cannot be revoked; that
// error is not news here.
func (w *worker) close() {
	_ = w.sess.Close()
	_ = w.cli.Close()
}

func run(ctx context.Context, endpoints []string, dsn string) error {
	if len(endpoints) == 0 || dsn == "" {
		return errors.New("no -etcd/-postgres and no ETCDCTL_ENDPOINTS/DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	suffix := time.Now().UnixNano()
	// The manifest: one row per dataset, with the highest token that
	// committed to it.
	manifest := fmt.Sprintf("nolock_etcd_manifest_%d", suffix)
	ident := pgx.Identifier{manifest}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+ident+` (dataset text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0);
INSERT INTO `+ident+` (dataset, files) VALUES ('events', 'seg-0001..seg-0100')`); err != nil {
		return err
	}
	defer pool.Exec(context.Background(), "DROP TABLE "+ident)
	fenced, err := conditional.NewFenced(manifest, "dataset", "fence")
	if err != nil {
		return err
	}

	prefix := fmt.Sprintf("/nolock/etcdfence/%d/compaction-events", suffix)
	a, err := newWorker("worker-a", endpoints, sceneTTL, prefix)
	if err != nil {
		return err
	}
	defer a.close()
	b, err := newWorker("worker-b", endpoints, waiterTTL, prefix)
	if err != nil {
		return err
	}
	defer b.close()

	if err := a.mu.Lock(ctx); err != nil {
		return err
	}
	ta, err := token(ctx, a.cli, a.mu)
	if err != nil {
		return err
	}
	fmt.Printf("worker-a: holds etcd's lock with token %d (its key's create revision); compacting into a-0001\n", ta)
	if err := fenced.Update(ctx, pool, "events", ta, nil); err != nil { // advance the fence: older holders are out from here on
		return err
	}

	type result struct {
		token int64
		err   error
	}
	bDone := make(chan result, 1)
	go func() {
		tb, err := b.takeOver(ctx, fenced, pool, ta)
		bDone <- result{tb, err}
	}()

	// A freezes: its lease is no longer kept alive, and it runs nothing
	// until B has committed.
	a.sess.Orphan()
	fmt.Printf("worker-a: frozen (GC pause) past its %d s session TTL: no keepalives reach etcd\n", sceneTTL)
	rb := <-bDone
	if rb.err != nil {
		return rb.err
	}

	// A wakes up mid-job and commits without looking at its lock.
	err = fenced.Update(ctx, pool, "events", ta, map[string]any{"files": "a-0001"})
	switch {
	case errors.Is(err, conditional.ErrFenced):
		fmt.Printf("worker-a: woke up; commit with token %d refused: %v\n", ta, err)
	case err != nil:
		return err
	default:
		return errors.New("worker-a's stale commit was accepted: fencing failed")
	}
	gone, err := a.cli.Get(ctx, a.mu.Key())
	if err != nil {
		return err
	}
	fmt.Printf("etcd: worker-a's lock key exists: %v (its lease expired during the pause)\n", len(gone.Kvs) > 0)

	// The counterfactual: the same commit without the fence lands.
	n, err := unfencedWrite(ctx, pool, ident, ta)
	if err != nil {
		return err
	}
	fmt.Printf("without the fence: worker-a's commit would have overwritten %d row (run and rolled back)\n", n)
	if n != 1 {
		return fmt.Errorf("the unfenced commit would have changed %d rows, want 1: the scene shows nothing", n)
	}

	var files string
	var fence int64
	if err := pool.QueryRow(ctx, "SELECT files, fence FROM "+ident+" WHERE dataset = 'events'").Scan(&files, &fence); err != nil {
		return err
	}
	fmt.Printf("manifest: events -> %s (fence %d)\n", files, fence)
	if files != "b-0001" || fence != rb.token {
		return fmt.Errorf("manifest holds %q with fence %d, want b-0001 with worker-b's token %d", files, fence, rb.token)
	}
	return nil
}

// takeOver waits for the lock, checks its token against the previous
// holder's, commits, and releases the lock.
func (w *worker) takeOver(ctx context.Context, fenced *conditional.Fenced, pool *pgxpool.Pool, prev int64) (int64, error) {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := w.mu.Lock(lctx); err != nil {
		return 0, fmt.Errorf("%s: lock: %w", w.name, err)
	}
	defer w.mu.Unlock(context.Background())
	tb, err := token(ctx, w.cli, w.mu)
	if err != nil {
		return 0, err
	}
	fmt.Printf("%s: took over after %v with token %d; compacting into b-0001\n", w.name, time.Since(start).Round(100*time.Millisecond), tb)
	if tb <= prev {
		return 0, fmt.Errorf("%s: token %d is not above the previous holder's %d", w.name, tb, prev)
	}
	if err := fenced.Update(ctx, pool, "events", tb, map[string]any{"files": "b-0001"}); err != nil {
		return 0, err
	}
	fmt.Printf("%s: committed b-0001 with token %d\n", w.name, tb)
	return tb, nil
}

// unfencedWrite runs the stale holder's commit with no fence condition in
// a transaction that it rolls back, and returns how many rows it changed.
func unfencedWrite(ctx context.Context, pool *pgxpool.Pool, ident string, token int64) (int64, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, "UPDATE "+ident+" SET files = $1, fence = $2 WHERE dataset = 'events'", "a-0001", token)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
