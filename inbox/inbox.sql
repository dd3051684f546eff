-- nolock inbox: the messages a consumer has processed (ByHeader, ByFunc, ByOffset),
CREATE TABLE IF NOT EXISTS {{inbox}} (
    consumer     text        NOT NULL,
    id           text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, id)
);
CREATE INDEX IF NOT EXISTS {{inbox_processed_at}} ON {{inbox}} (processed_at);
-- the next offset per partition (ByWatermark),
CREATE TABLE IF NOT EXISTS {{watermarks}} (
    consumer  text   NOT NULL,
    topic     text   NOT NULL,
    partition int    NOT NULL,
    next      bigint NOT NULL,
    PRIMARY KEY (consumer, topic, partition)
);
-- and failed attempts, counted outside the failing transaction.
CREATE TABLE IF NOT EXISTS {{attempts}} (
    consumer   text        NOT NULL,
    id         text        NOT NULL,
    attempts   int         NOT NULL,
    last_error text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, id)
);
