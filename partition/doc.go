// Package partition consumes Kafka partitions with one writer per partition,
// fenced in PostgreSQL: every batch is applied in a transaction that first
// checks that this worker still owns the partition (its epoch is the row's)
// and stores the partition's next offset with the batch's results. An owner
// that paused past its session (a GC pause, a frozen VM) and wakes up to
// write after the partition moved on is refused with ErrFenced, so each
// message's effect is applied exactly once and in offset order, whatever
// Kafka's rebalances do.
//
// Use it when a stream's effects land in PostgreSQL and must not be doubled
// or reordered: balances, inventories, projections keyed by the message key.
// Kafka gives each partition to one member of a consumer group at a time,
// but only as seen by Kafka: kafka-go has no revocation callback and no
// fence, and a member paused past its session timeout resumes still
// believing it owns its partitions. The fence closes that window where the
// effect lands.
//
// How it works, in one paragraph: a Consumer joins the group with kafka-go's
// ConsumerGroup and runs one worker per assigned partition for the length of
// the generation. A worker claims its partition in PostgreSQL: it locks the
// partition's row, checks with Kafka's group coordinator that the group is
// stable and the partition is assigned to this member, and bumps the row's
// epoch. The epoch is the fencing token. The worker then reads the partition
// from the stored offset with a group-less kafka.Reader and hands batches to
// the Handler inside transactions that begin with the fence. The whole
// algorithm, and why claims cannot be reordered, is in fence.go.
//
// When not to use it: when the effect leaves PostgreSQL (an e-mail, a
// payment API): the fence guards only what commits in the same transaction;
// use idempotency keys there. When ordering does not matter and messages
// carry their own IDs, package inbox is simpler.
//
// What it does not promise: the handler may run more than once for a batch
// (each attempt is a fresh transaction; only the committed one counts);
// throughput is one transaction at a time per partition; and a message
// whose handler keeps failing is parked (recorded in the parked table in
// the transaction that moves the partition past it), so its partition's
// later messages are applied without it; an operator may replay it later
// (Consumer.ReplayParked), out of offset order, or purge it.
package partition
