// Package compaction is a leader-only compaction job on a dynamolock lock,
// whose commit is fenced by the lock's token: the story `nolock demo`
// tells (-run 'paused lock holder'); examples/compactorservice is the
// service to copy.
//
// The job writes its output under fresh names and commits it by updating
// a manifest row in PostgreSQL. Worker A takes the lock and starts
// compacting, then freezes (a long GC pause: its heartbeats stop too)
// past its lease. Worker B, waiting, sees A's record version unchanged for
// a full lease of its own clock, takes over with a higher token, compacts
// and commits. A wakes up, never having seen its lock go, and commits
// too. Two manifests take both commits: one checks nothing and ends up
// listing A's stale output, B's work lost (the lock alone is not enough);
// the other is fenced with conditional.Fenced, accepts only tokens at
// least as high as the highest it has seen, and refuses A's commit with
// ErrFenced: B's output stays.
package compaction

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/examples/localdynamo"
	"github.com/nolock/nolock/observe"
)

// Config is where and how the story runs.
type Config struct {
	DynamoDB *dynamodb.Client // the lock's table is made on it and deleted
	DSN      string           // PostgreSQL; the manifests are made and dropped in its search_path
	Lease    time.Duration    // the lock's lease; worker A freezes for three
	Out      io.Writer        // the transcript
	Observer observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured.
type Report struct {
	TokenA, TokenB int64  // the tokens of worker A (frozen) and worker B (took over)
	Unchecked      string // what the manifest that checks nothing lists at the end
	Refused        bool   // A's stale commit was refused by the fenced manifest (ErrFenced)
	Files          string // what the fenced manifest lists at the end
	Fence          int64  // the highest token the fenced manifest has seen
}

const (
	key   = "compaction/events"
	input = "seg-0001..seg-0100"
)

// Run tells the story and returns its report, or an error if the fenced
// manifest accepted the frozen worker's stale commit.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.DynamoDB == nil || cfg.Lease <= 0 || cfg.Out == nil {
		return Report{}, errors.New("compaction: need a DynamoDB client, a lease and an Out")
	}
	suffix := time.Now().UnixNano()
	table := fmt.Sprintf("nolock_compaction_%d", suffix)
	drop, err := localdynamo.CreateTable(ctx, cfg.DynamoDB, table, "key") // dynamolock's default key name
	if err != nil {
		return Report{}, err
	}
	defer drop()

	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	// The manifests: one row per dataset; the fenced one keeps the
	// highest token that committed to it.
	m := manifests{pool: pool, name: fmt.Sprintf("compaction_manifest_%d", suffix)}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (dataset text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s_unchecked (dataset text PRIMARY KEY, files text NOT NULL);
INSERT INTO %[1]s (dataset, files) VALUES ('events', '%[2]s');
INSERT INTO %[1]s_unchecked VALUES ('events', '%[2]s')`, m.name, input)); err != nil {
		return Report{}, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), fmt.Sprintf("DROP TABLE %[1]s, %[1]s_unchecked", m.name))
	if m.fenced, err = conditional.NewFenced(m.name, "dataset", "fence"); err != nil {
		return Report{}, err
	}

	// Worker A's process will freeze: its link to DynamoDB is cut, as a
	// paused process sends nothing (its heartbeat goroutine is paused too).
	frozen := localdynamo.NewLink(cfg.DynamoDB)
	a, err := dynamolock.New(frozen, table, dynamolock.WithLease(cfg.Lease), dynamolock.WithOwner("worker-a"), dynamolock.WithObserver(cfg.Observer))
	if err != nil {
		return Report{}, err
	}
	defer a.Close()
	b, err := dynamolock.New(cfg.DynamoDB, table, dynamolock.WithLease(cfg.Lease), dynamolock.WithOwner("worker-b"), dynamolock.WithObserver(cfg.Observer))
	if err != nil {
		return Report{}, err
	}
	defer b.Close()

	var rep Report
	la, err := a.Acquire(ctx, key)
	if err != nil {
		return rep, err
	}
	rep.TokenA = la.Token()
	fmt.Fprintf(cfg.Out, "   worker-a: leader with token %d; compacting %s into a-0001\n", la.Token(), input)

	frozen.Cut(true)
	fmt.Fprintf(cfg.Out, "   worker-a: frozen (a GC pause) for %v, past its %v lease\n", 3*cfg.Lease, cfg.Lease)
	bDone := make(chan error, 1) // worker B waits for the lock, and alone writes to Out meanwhile
	go func() { bDone <- workerB(ctx, cfg.Out, b, m, &rep) }()
	time.Sleep(3 * cfg.Lease)
	if err := <-bDone; err != nil {
		return rep, err
	}
	frozen.Cut(false)

	// A wakes up mid-job and commits without looking at its lock: the
	// pause can fall between any check and the write, so the manifest
	// must decide.
	fmt.Fprintf(cfg.Out, "   worker-a: wakes up, sure it leads, and commits a-0001 with token %d\n", la.Token())
	refusal := m.commit(ctx, "a-0001", la.Token())
	switch {
	case errors.Is(refusal, conditional.ErrFenced):
		rep.Refused = true
	case refusal != nil:
		return rep, refusal
	}

	if err := pool.QueryRow(ctx, fmt.Sprintf("SELECT f.files, f.fence, u.files FROM %[1]s f, %[1]s_unchecked u", m.name)).
		Scan(&rep.Files, &rep.Fence, &rep.Unchecked); err != nil {
		return rep, err
	}
	fmt.Fprintf(cfg.Out, "   manifest that checks nothing: accepted it; events -> %s (worker-b's output lost)\n", rep.Unchecked)
	verdict := "ACCEPTED it"
	if rep.Refused {
		verdict = fmt.Sprintf("refused it (%v)", refusal)
	}
	fmt.Fprintf(cfg.Out, "   manifest fenced by the token: %s; events -> %s (fence %d)\n", verdict, rep.Files, rep.Fence)
	<-la.Lost()
	fmt.Fprintf(cfg.Out, "   worker-a: its lock reports: %v\n", la.Err())
	if !rep.Refused || rep.Files != "b-0001" {
		return rep, fmt.Errorf("compaction: worker-a's stale commit was accepted (manifest lists %s): fencing failed", rep.Files)
	}
	return rep, nil
}

// workerB waits for the lock, compacts and commits with its token.
func workerB(ctx context.Context, out io.Writer, b *dynamolock.Client, m manifests, rep *Report) error {
	start := time.Now()
	lb, err := b.Acquire(ctx, key)
	if err != nil {
		return err
	}
	defer lb.Release(ctx)
	rep.TokenB = lb.Token()
	fmt.Fprintf(out, "   worker-b: took over after %v with token %d; compacting into b-0001\n", time.Since(start).Round(10*time.Millisecond), lb.Token())
	if err := m.commit(ctx, "b-0001", lb.Token()); err != nil {
		return err
	}
	fmt.Fprintf(out, "   worker-b: committed b-0001 with token %d\n", lb.Token())
	return nil
}

// manifests are the two manifests a commit updates: one that checks
// nothing, and one fenced by the lock's token.
type manifests struct {
	pool   *pgxpool.Pool
	name   string // the fenced one's table; the other's has "_unchecked" appended
	fenced *conditional.Fenced
}

// commit points both manifests at files, and returns the fenced one's
// answer: conditional.ErrFenced if token is lower than one it has seen.
func (m manifests) commit(ctx context.Context, files string, token int64) error {
	if _, err := m.pool.Exec(ctx, "UPDATE "+m.name+"_unchecked SET files = $1 WHERE dataset = 'events'", files); err != nil {
		return err
	}
	return m.fenced.Update(ctx, m.pool, "events", token, map[string]any{"files": files})
}
