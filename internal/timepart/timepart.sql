-- Time-partitioned layout (nolock schema -partitioned) of the idempotency
-- records and the inbox ids: for volumes whose retention is cheaper as a
-- DROP TABLE of a day than as DELETEs. Each table is partitioned by range
-- of its key, one partition per UTC day of keys that are UUIDv7 as text
-- (their first 48 bits are milliseconds since 1970, so they sort by time).
-- PostgreSQL requires a partitioned table's primary key to include the
-- partition key: partitioning by a time column (created_at, processed_at)
-- would make (scope, key) unique only within a partition, and the
-- library's INSERT … ON CONFLICT (scope, key) is refused there (42P10).
-- Keys of any other form go to the DEFAULT partition, where Reap deletes
-- them as on the plain layout.
--
-- {{function}}(table, first, days) creates the partitions of days UTC days
-- from first (those missing), with the DEFAULT partition's storage
-- options, and returns how many it created. Run it ahead of time, e.g.
-- daily for the week ahead: a day's partition cannot be created once the
-- DEFAULT partition holds rows of that day.
--   SELECT {{function}}('{{idem_name}}', current_date, 7);
--   SELECT {{function}}('{{inbox_name}}', current_date, 7);
-- Retention drops a day whose every record has expired (its keys' day
-- plus the retention, plus a margin for keys made before their first use).
-- DROP TABLE of a partition takes an ACCESS EXCLUSIVE lock on the whole
-- table for a moment (DETACH … CONCURRENTLY is refused beside a DEFAULT
-- partition): bound its wait, and retry later if it gives up.
--   SET lock_timeout = '1s'; DROP TABLE {{idem_name}}_20260101;
CREATE OR REPLACE FUNCTION {{function}}(parent regclass, first date, days int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  nsp name;
  rel name;
  opts text;
  bound text[];
  made int := 0;
BEGIN
  PERFORM pg_advisory_xact_lock({{lock}}); -- the lock of nolock's other DDL
  SELECT n.nspname, c.relname INTO nsp, rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = parent;
  SELECT ' WITH (' || array_to_string(d.reloptions, ', ') || ')' INTO opts
    FROM pg_partitioned_table p JOIN pg_class d ON d.oid = p.partdefid WHERE p.partrelid = parent;
  FOR i IN 0 .. days - 1 LOOP
    -- the first UUIDv7 of day first + i and of the day after, as text
    SELECT array_agg(substr(h, 1, 8) || '-' || substr(h, 9, 4) ORDER BY day) INTO bound
      FROM (SELECT day, lpad(to_hex((extract(epoch FROM day::timestamp AT TIME ZONE 'UTC') * 1000)::bigint), 12, '0') AS h
            FROM unnest(ARRAY[first + i, first + i + 1]) AS day) b;
    IF to_regclass(format('%I.%I', nsp, rel || '_' || to_char(first + i, 'YYYYMMDD'))) IS NULL THEN
      EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)%s',
        nsp, rel || '_' || to_char(first + i, 'YYYYMMDD'), parent, bound[1], bound[2], coalesce(opts, ''));
      made := made + 1;
    END IF;
  END LOOP;
  RETURN made;
END $$;
-- idempotency.Store's records, partitioned by key (COLLATE "C": bytes
-- order, as UUIDv7 text sorts by time).
CREATE TABLE IF NOT EXISTS {{idem}} (
    scope       text        NOT NULL,
    key         text        COLLATE "C" NOT NULL,
    fingerprint bytea       NOT NULL,
    terminal    boolean     NOT NULL DEFAULT false,
    result      bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
) PARTITION BY RANGE (key);
CREATE TABLE IF NOT EXISTS {{idem_default}} PARTITION OF {{idem}} DEFAULT WITH (fillfactor = 80);
CREATE INDEX IF NOT EXISTS {{idem_expires}} ON {{idem}} (expires_at);
-- inbox.Inbox's ids, partitioned by id.
CREATE TABLE IF NOT EXISTS {{inbox}} (
    consumer     text        NOT NULL,
    id           text        COLLATE "C" NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, id)
) PARTITION BY RANGE (id);
CREATE TABLE IF NOT EXISTS {{inbox_default}} PARTITION OF {{inbox}} DEFAULT;
CREATE INDEX IF NOT EXISTS {{inbox_processed_at}} ON {{inbox}} (processed_at);
