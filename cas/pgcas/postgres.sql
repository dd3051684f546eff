-- nolock cas: versioned values. version is never indexed, so updates stay HOT.
CREATE TABLE IF NOT EXISTS {{table}} (
    key     text   PRIMARY KEY,
    version bigint NOT NULL CHECK (version >= 1),
    value   bytea  NOT NULL
) WITH (fillfactor = 70);
