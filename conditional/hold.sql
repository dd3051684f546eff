-- nolock conditional: one row per holdable resource (a seat, a slot).
-- free: holder and hold_until are NULL; held: both set, the hold ends at
-- hold_until by the database's clock; confirmed: holder set, final.
-- Only the primary key is indexed, so holds and releases stay HOT updates;
-- fillfactor leaves room on the page for the new row versions.
CREATE TABLE IF NOT EXISTS {{table}} (
    resource   text        NOT NULL PRIMARY KEY,
    state      text        NOT NULL DEFAULT 'free' CHECK (state IN ('free', 'held', 'confirmed')),
    holder     text,
    hold_until timestamptz,
    CHECK ((state = 'free') = (holder IS NULL)),
    CHECK ((state = 'held') = (hold_until IS NOT NULL))
) WITH (fillfactor = 70);
