-- nolock conditional: a quantity (Stock: qty, Accounts: balance) held in one
-- row per (key, bucket).
-- The quantity is never indexed, so decrements stay HOT updates; fillfactor leaves
-- room on the page for the new row versions.
CREATE TABLE IF NOT EXISTS {{table}} (
    key    text   NOT NULL,
    bucket int    NOT NULL DEFAULT 0,
    {{qty}} bigint NOT NULL CHECK ({{qty}} >= 0),
    PRIMARY KEY (key, bucket)
) WITH (fillfactor = 70);
