-- nolock lease: one row per lock key, never deleted, so the fencing token
-- only grows. Expiry is judged by the database's clock_timestamp() only.
CREATE TABLE IF NOT EXISTS {{table}} (
    key        text        PRIMARY KEY,
    owner      text        NOT NULL,
    nonce      text        NOT NULL, -- names one acquisition, to resolve a lost answer
    token      bigint      NOT NULL, -- the fencing token: +1 on every acquisition
    expires_at timestamptz NOT NULL,
    released   boolean     NOT NULL DEFAULT false,
    data       bytea
);
