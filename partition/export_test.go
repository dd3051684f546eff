package partition

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// SetBeforeFence makes every batch attempt call f before its transaction
// begins, holding no transaction and no lock: a place for a test to pause
// the worker (a zombie in the making). When f returns, the attempt begins
// with a fresh batch timeout, and the fence refuses it (ErrFenced) if a
// newer owner claimed the partition meanwhile. Set it before Run.
func SetBeforeFence(c *Consumer, f func(Claim, []kafka.Message)) { c.beforeBatch = f }

// SetUnfenced turns the fence off: batches store their offset without
// checking the epoch, with the fence's parameters and its frozen-owner
// timeout. Only for the tests that show what the fence prevents. Set it
// before Run.
func SetUnfenced(c *Consumer) {
	t := pgx.Identifier{c.cfg.Table}.Sanitize()
	c.sql.fence = idle + `UPDATE ` + t + ` SET next_offset = $7 FROM idle
WHERE group_id = $1 AND topic = $2 AND partition_id = $3 AND $5::bigint IS NOT NULL AND ($6::bigint IS NULL OR true)`
}

// ClaimAs runs one claim attempt for the given generation and member, as a
// worker would (possibly a delayed one from an old member).
func ClaimAs(ctx context.Context, c *Consumer, topic string, partition int, generation int32, member string) (Claim, error) {
	cl, _, err := c.claim(ctx, assignment{topic: topic, partition: partition, generation: generation, member: member, offset: kafka.FirstOffset})
	return cl, err
}

// Park parks m as a worker holding cl does once m failed attempts times
// with cause: in one fenced transaction that moves the stored offset from
// prev (nil: none stored) past m.
func Park(ctx context.Context, c *Consumer, cl Claim, prev *int64, m kafka.Message, cause error, attempts int) error {
	_, _, err := c.park(ctx, cl, prev, m, &exhaustedError{attempts: attempts, err: cause})
	return err
}
