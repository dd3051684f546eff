-- nolock partition: one row per (group, topic, partition) of a Kafka consumer
-- group. epoch is the fencing token: every claim bumps it, nothing lowers it,
-- every batch checks it. next_offset is the partition's position, written in
-- the same transaction as the batch's results (NULL: nothing applied yet).
-- generation, member_id and claimed_at describe the last claim. Never delete
-- rows: a deleted row restarts its epoch and unfences old owners. next_offset
-- is not indexed, so the per-batch update stays HOT.
CREATE TABLE IF NOT EXISTS {{table}} (
    group_id     text        NOT NULL,
    topic        text        NOT NULL,
    partition_id integer     NOT NULL CHECK (partition_id >= 0),
    epoch        bigint      NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    generation   integer     NOT NULL DEFAULT 0,
    member_id    text        NOT NULL DEFAULT '',
    next_offset  bigint      CHECK (next_offset >= 0),
    claimed_at   timestamptz,
    PRIMARY KEY (group_id, topic, partition_id)
) WITH (fillfactor = 70);
