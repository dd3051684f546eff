package partition

// Ownership of a partition, and why it cannot be reordered.
//
// Kafka decides who should own a partition; PostgreSQL decides whose writes
// count. The partitions table holds one row per (group, topic, partition)
// with an epoch, the fencing token, and next_offset, the partition's
// position.
//
// Claim. A worker that Kafka assigned a partition claims it in one
// transaction:
//
//  1. Lock the row (creating it if missing): INSERT … ON CONFLICT DO UPDATE
//     … RETURNING. Claims and batches of one partition now run one at a
//     time, in the order they take this lock.
//  2. Ask Kafka's group coordinator, while holding the lock, whether the
//     group is Stable and this member is assigned this partition
//     (DescribeGroups). If not, the claim is refused with ErrFenced and
//     nothing changes.
//  3. Bump the epoch (epoch = epoch + 1), record generation and member, and
//     commit. The new epoch and the stored next_offset are the worker's.
//
// Batch. Every batch transaction begins with
//
//	UPDATE … SET next_offset = $new WHERE … AND epoch = $mine AND next_offset IS NOT DISTINCT FROM $prev
//
// which takes the same row lock. Zero rows means a later claim bumped the
// epoch: the transaction rolls back with ErrFenced and the worker stops.
// One row means nobody claimed since this worker did, and nobody can until
// this transaction ends; the handler's results and the new offset commit
// together or not at all. Since only the epoch's holder writes, and it
// writes batches in order from the offset its claim returned, every offset
// is applied exactly once and in order, whatever Kafka's members believe.
//
// Why the claim asks Kafka under the lock, rather than comparing generation
// numbers. The claim must not let a delayed claim from an old member (one
// paused after it was assigned the partition, or whose claim sat in the
// network) take the partition back from the current owner. Comparing the
// claimer's generation with the stored one (claim only if mine >= stored)
// handles delays within one life of the group, but Kafka's generation
// restarts at 1 when the group is deleted (DeleteGroups) or expires: after
// a reset, the rightful owner's generation 1 would lose to the stored 7
// forever, and a zombie from the old life carrying generation 7 would beat
// the new owner's generation 2. Nothing in the numbers tells the two lives
// apart.
//
// The coordinator's answer does. Claims on one row commit in the order
// they take its lock, and each asks the coordinator after taking it. So if
// claim A commits before claim B, A's question was answered before A
// committed, which is before B took the lock, which is before B's question
// was answered: the answers are in the same order as the commits, on the
// coordinator's single timeline, which runs on through resets. The last
// committed claim is therefore from a member that the coordinator, at a
// moment after every earlier claim committed, named as the partition's
// assignee in a stable group. A delayed claim asks when it finally holds
// the lock, and is refused unless it is still the assignee right then (in
// which case it is the rightful owner, and takes over from its own older
// worker). The claim does not trust the claimer's clock or its belief; a
// pause anywhere in it only delays it. Refused claims change nothing, so
// epochs rise by exactly one per successful claim and never go down, also
// across group resets.
//
// As a cheap local check before asking Kafka, a claim whose member ID is
// the stored one but whose generation is lower is refused at once: member
// IDs are unique (the coordinator generates them), and one member's
// generations only rise.
//
// A member frozen inside a transaction holds the row lock, which would
// stall the next claim for as long as the freeze. Every transaction here
// therefore sets idle_in_transaction_session_timeout to BatchTimeout: the
// server ends a frozen owner's session, its transaction rolls back, and the
// claim proceeds.
//
// What this relies on: PostgreSQL's row locks and Read Committed re-checks
// (a blocked UPDATE re-evaluates its WHERE on the committed row); the
// coordinator's group state being linearizable, which Kafka provides by
// storing it in the replicated __consumer_offsets log; and nobody writing
// the table outside this package (a deleted row restarts its epoch).
//
// Note on kafka-go v0.4.51: its Client.Heartbeat decodes Heartbeat v1+
// responses with error_code and throttle_time_ms swapped, so its error is
// always nil; that is why the claim asks with DescribeGroups instead.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/pgerr"
)

// ErrFenced means a newer owner exists: a later claim raised the
// partition's epoch above this worker's, or the coordinator no longer
// assigns the partition to this member. The batch or claim that got it
// changed nothing, and the worker stops.
var ErrFenced = errors.New("partition: fenced: a newer owner exists")

// Claim is one worker's ownership of one partition, as it was granted.
// It is a value; the handler's context carries it (see FromContext).
type Claim struct {
	GroupID   string
	Topic     string
	Partition int
	// Epoch is the fencing token: larger than every earlier claim's of
	// this (group, topic, partition), including before group resets.
	// Writes this package does not make (another store, another table)
	// can be fenced with it, e.g. with conditional.Fenced.
	Epoch int64
	// Generation and MemberID are Kafka's for the claiming member.
	Generation int32
	MemberID   string
	// Offset is where the worker starts: the stored next offset, or, when
	// none is stored yet, the group's Kafka offset, which may be
	// kafka.FirstOffset or kafka.LastOffset.
	Offset int64
}

// String names the claim for logs: "topic/partition epoch E (generation G)".
func (c Claim) String() string {
	return fmt.Sprintf("%s/%d epoch %d (generation %d)", c.Topic, c.Partition, c.Epoch, c.Generation)
}

//go:embed schema.sql
var schemaSQL string

// statements holds the package's SQL for one table, quoted once.
type statements struct {
	schema, lock, bump, fence, read, replayLock string
}

// idle sets the transaction's idle_in_transaction_session_timeout (the
// frozen-owner cut-off) from within the claim's lock statement: one
// statement, one round trip. set_config is volatile, so the CTE is not
// inlined away; the statement's row comes from joining it. The fence, run
// once per batch, sets it in its WHERE clause instead: set_config is
// volatile, so it stays a filter evaluated on the row, and the row cannot
// pass the filter (and the handler never runs) without it having run. No
// CTE scan and no join: the fence stays a plain one-row update.
const idle = `WITH idle AS (SELECT set_config('idle_in_transaction_session_timeout', $4::text, true))
`

func newStatements(table string) statements {
	t := pgx.Identifier{table}.Sanitize()
	const key = `group_id = $1 AND topic = $2 AND partition_id = $3`
	return statements{
		schema: strings.ReplaceAll(schemaSQL, "{{table}}", t) + kafkapark.NewStore(table+parkedSuffix).Schema(),
		lock: idle + `INSERT INTO ` + t + ` AS p (group_id, topic, partition_id) SELECT $1, $2, $3 FROM idle
ON CONFLICT (group_id, topic, partition_id) DO UPDATE SET epoch = p.epoch
RETURNING p.epoch, p.generation, p.member_id, p.next_offset`,
		bump: `UPDATE ` + t + ` SET epoch = epoch + 1, generation = $4, member_id = $5, claimed_at = now()
WHERE ` + key + ` RETURNING epoch, next_offset`,
		fence: `UPDATE ` + t + ` SET next_offset = $7
WHERE ` + key + ` AND epoch = $5 AND next_offset IS NOT DISTINCT FROM $6
  AND set_config('idle_in_transaction_session_timeout', $4::text, true) IS NOT NULL`,
		read: `SELECT epoch, next_offset FROM ` + t + ` WHERE ` + key,
		// replayLock takes the partition's row lock, as a batch's fence
		// and a claim do, so a replay runs between the owner's batches,
		// never beside one: the partition keeps one writer at a time. It
		// also sets the frozen-owner timeout, as they do.
		replayLock: idle + `SELECT 1 FROM ` + t + ` AS p, idle WHERE ` + key + ` FOR NO KEY UPDATE OF p`,
	}
}

// assignment is what Kafka gave one worker.
type assignment struct {
	topic      string
	partition  int
	generation int32
	member     string
	offset     int64 // the group's Kafka offset, or FirstOffset/LastOffset
}

// claim runs the claim transaction described at the top of this file. It
// returns the claim and the stored next offset (nil: none stored yet).
// Errors other than ErrFenced are transient: the caller retries them.
func (c *Consumer) claim(ctx context.Context, a assignment) (Claim, *int64, error) {
	cl := Claim{GroupID: c.cfg.GroupID, Topic: a.topic, Partition: a.partition, Generation: a.generation, MemberID: a.member}
	tx, err := c.pg.Begin(ctx, c.db)
	if err != nil {
		return cl, nil, errfmt.Errorf("partition: claim %s: begin: %w", cl, err)
	}
	defer rollback(tx)

	// 1. Lock the row, setting the frozen-owner timeout.
	var storedEpoch int64
	var storedGen int32
	var storedMember string
	var next *int64
	if err := tx.QueryRow(ctx, c.sql.lock, cl.GroupID, cl.Topic, cl.Partition, c.idleTimeout).Scan(&storedEpoch, &storedGen, &storedMember, &next); err != nil {
		return cl, nil, errfmt.Errorf("partition: claim %s: lock: %w", cl, err)
	}
	if storedMember == a.member && storedGen > a.generation {
		return cl, nil, errfmt.Errorf("partition: claim %s: member already claimed in generation %d: %w", cl, storedGen, ErrFenced)
	}

	// 2. Ask the coordinator while holding the lock.
	if err := c.assigned(ctx, a); err != nil {
		return cl, nil, errfmt.Errorf("partition: claim %s: %w", cl, err)
	}

	// 3. Bump the epoch and commit.
	if err := tx.QueryRow(ctx, c.sql.bump, cl.GroupID, cl.Topic, cl.Partition, a.generation, a.member).Scan(&cl.Epoch, &next); err != nil {
		return cl, nil, errfmt.Errorf("partition: claim %s: bump: %w", cl, err)
	}
	if err := tx.Commit(ctx); err != nil {
		// The commit runs under the Consumer's Committer, so the
		// generation ending does not cancel it in flight. If its outcome
		// is unknown and it happened after all, retrying claims again:
		// the epoch moves on by one more, which fences only this worker's
		// unknown claim. Nothing was written with it.
		return cl, nil, errfmt.Errorf("partition: claim %s: commit: %w", cl, err)
	}
	cl.Offset = a.offset
	if next != nil {
		cl.Offset = *next
	}
	return cl, next, nil
}

// errNotAssigned is the coordinator's "no": wrapped with ErrFenced.
func errNotAssigned(format string, args ...any) error {
	return errfmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrFenced)
}

// assigned asks the group coordinator whether the group is stable and a is
// assigned to its member. A "no" wraps ErrFenced; other errors (the
// coordinator moved or is loading, the network) are transient.
func (c *Consumer) assigned(ctx context.Context, a assignment) error {
	res, err := c.kafka.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{c.cfg.GroupID}})
	if err != nil {
		return errfmt.Errorf("describe group: %w", err)
	}
	if len(res.Groups) != 1 {
		return errfmt.Errorf("describe group: %d groups in the answer", len(res.Groups))
	}
	g := res.Groups[0]
	if g.Error != nil {
		if kafkaerr.Retriable(g.Error) {
			return errfmt.Errorf("describe group: %w", g.Error)
		}
		return errNotAssigned("describe group: %v", g.Error)
	}
	if g.GroupState != "Stable" {
		return errNotAssigned("group is %s, not Stable", g.GroupState)
	}
	for _, m := range g.Members {
		if m.MemberID != a.member {
			continue
		}
		for _, t := range m.MemberAssignments.Topics {
			if t.Topic == a.topic && slices.Contains(t.Partitions, a.partition) {
				return nil
			}
		}
		return errNotAssigned("member %s is not assigned %s/%d", a.member, a.topic, a.partition)
	}
	return errNotAssigned("member %s is not in the group", a.member)
}

// fenceOutcome is what the fence statement found.
type fenceOutcome int

const (
	fenceHeld    fenceOutcome = iota // the row is at my epoch and offset: go on
	fenceApplied                     // an earlier attempt of this batch committed
)

// checkFence runs the fence at the start of a batch transaction: it sets
// the frozen-owner timeout and moves the stored offset from prev to next
// only if the row is still at cl.Epoch. If the row is at my epoch and
// already at next, an earlier attempt whose commit was reported lost did
// commit: the batch must not run again. Anything else wraps ErrFenced.
func (c *Consumer) checkFence(ctx context.Context, tx pgx.Tx, cl Claim, prev *int64, next int64) (fenceOutcome, error) {
	tag, err := tx.Exec(ctx, c.sql.fence, cl.GroupID, cl.Topic, cl.Partition, c.idleTimeout, cl.Epoch, prev, next)
	if err != nil {
		return 0, errfmt.Errorf("partition: fence %s: %w", cl, err)
	}
	if tag.RowsAffected() == 1 {
		return fenceHeld, nil
	}
	var epoch int64
	var stored *int64
	if err := tx.QueryRow(ctx, c.sql.read, cl.GroupID, cl.Topic, cl.Partition).Scan(&epoch, &stored); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, errfmt.Errorf("partition: fence %s: the partition's row is gone: %w", cl, ErrFenced)
		}
		return 0, errfmt.Errorf("partition: fence %s: %w", cl, err)
	}
	if epoch == cl.Epoch && stored != nil && *stored == next {
		return fenceApplied, nil
	}
	return 0, errfmt.Errorf("partition: fence %s: row at epoch %d, offset %s: %w", cl, epoch, offsetString(stored), ErrFenced)
}

func offsetString(o *int64) string {
	if o == nil {
		return "none"
	}
	return strconv.FormatInt(*o, 10)
}

// rollback ends tx if it is still open; after a commit it does nothing.
func rollback(tx pgx.Tx) {
	_ = tx.Rollback(context.Background())
}

// transient reports whether a failed batch may succeed as it is on a
// fresh attempt: the connection failed or the server gave up on it
// (SQLSTATE classes 08, 53, 57; 25P03, the frozen-owner timeout; 55P03), or
// a serialization failure or deadlock. Other errors count toward
// MaxAttempts. For the handler's errors, see handlerfail.Classify.
func transient(err error, tx pgx.Tx) bool {
	if err == nil || errors.Is(err, ErrFenced) {
		return false
	}
	if pgerr.Conflict(err) || pgerr.Ambiguous(err) || pgerr.Unsent(err) || pgerr.ServerTrouble(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "55P03"
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	return tx != nil && tx.Conn() != nil && tx.Conn().IsClosed()
}
