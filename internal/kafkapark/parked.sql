-- Parked messages: each a message that failed its attempts (or failed
-- permanently), kept until an operator replays or purges it. The same
-- layout in inbox and partition. epoch is partition's claim under which it
-- was parked (0 in inbox); message_id is inbox's identity of the message,
-- recorded as processed again by a replay (NULL in partition).
CREATE TABLE IF NOT EXISTS {{parked}} (
    group_id     text        NOT NULL,
    topic        text        NOT NULL,
    partition_id integer     NOT NULL CHECK (partition_id >= 0),
    "offset"     bigint      NOT NULL CHECK ("offset" >= 0),
    key          bytea,
    value        bytea,
    headers      jsonb       NOT NULL,
    error        text        NOT NULL,
    attempts     integer     NOT NULL,
    epoch        bigint      NOT NULL DEFAULT 0,
    message_id   text,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition_id, "offset")
);
-- For PurgeParkedOlderThan, which deletes in batches of the oldest.
CREATE INDEX IF NOT EXISTS {{parked_at}} ON {{parked}} (group_id, parked_at);
