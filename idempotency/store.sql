-- nolock idempotency: one row per (scope, key), claimed and completed in the
-- same transaction as the effect it records, so a committed row always holds
-- its result. Expiry is judged by the database's now().
CREATE TABLE IF NOT EXISTS {{table}} (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    terminal    boolean     NOT NULL DEFAULT false,
    result      bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);
-- For Reap. The result is written by a HOT update of an unindexed column.
CREATE INDEX IF NOT EXISTS {{expires_index}} ON {{table}} (expires_at);
