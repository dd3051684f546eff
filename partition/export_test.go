package partition

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// SetBeforeFence makes every batch attempt call f before its transaction
// begins: a place for a test to pause the worker (a zombie in the making).
func SetBeforeFence(c *Consumer, f func(Claim, []kafka.Message)) { c.cfg.BeforeBatch = f }

// SetUnfenced turns the fence off: batches store their offset without
// checking the epoch. Only for the tests that show what the fence prevents.
func SetUnfenced(c *Consumer) { c.unfenced = true }

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
