package conditional

import _ "embed"

// The statements, with {{table}} and {{qty}} replaced by quoted identifiers.
const (
	// One statement grants a batch of requests, first fit in arrival order:
	// o locks the row (waiting for, then reading, the newest version), g
	// walks the requests ($3) granting each one the rest covers, upd writes
	// the result only if something was granted. It returns the units before
	// the batch and one grant flag per request; no row means no such key.
	batchSQL = `WITH RECURSIVE
 o AS (SELECT {{qty}} AS qty FROM {{table}} WHERE key = $1 AND bucket = $2 FOR UPDATE),
 g(i, rest, ok) AS (
   SELECT 0, qty, true FROM o
   UNION ALL
   SELECT g.i + 1, CASE WHEN r.n <= g.rest THEN g.rest - r.n ELSE g.rest END, r.n <= g.rest
   FROM g, LATERAL (SELECT ($3::bigint[])[g.i + 1] AS n) r
   WHERE g.i < cardinality($3::bigint[])),
 fin AS (SELECT rest FROM g ORDER BY i DESC LIMIT 1),
 upd AS (UPDATE {{table}} s SET {{qty}} = fin.rest FROM fin, o
         WHERE s.key = $1 AND s.bucket = $2 AND fin.rest <> o.qty)
SELECT o.qty, (SELECT array_agg(ok ORDER BY i) FROM g WHERE i > 0) FROM o`
	// A batch of one is the plain conditional decrement: on the uncontended
	// path the library costs no more than the bare statement.
	takeSQL = `UPDATE {{table}} SET {{qty}} = {{qty}} - $3 WHERE key = $1 AND bucket = $2 AND {{qty}} >= $3`
	// addSQL adds to an existing row only (a credit), all of a batch at once.
	addSQL = `UPDATE {{table}} SET {{qty}} = {{qty}} + $3 WHERE key = $1 AND bucket = $2`
	// addFirstSQL adds to the key's first bucket: for a key with fewer
	// buckets than this Stock spreads over.
	addFirstSQL     = `UPDATE {{table}} SET {{qty}} = {{qty}} + $2 WHERE key = $1 AND bucket = (SELECT min(bucket) FROM {{table}} WHERE key = $1)`
	qtySQL          = `SELECT {{qty}} FROM {{table}} WHERE key = $1 AND bucket = $2`
	acrossSQL       = `SELECT bucket, {{qty}} FROM {{table}} WHERE key = $1 ORDER BY bucket FOR UPDATE`
	acrossUpdateSQL = `UPDATE {{table}} s SET {{qty}} = v.qty FROM unnest($2::int[], $3::bigint[]) AS v(bucket, qty)
WHERE s.key = $1 AND s.bucket = v.bucket`
	// availableSQL saturates at the largest bigint (buckets may hold more
	// between them than one int64) and is NULL for a key without rows
	// (least would skip the NULL).
	availableSQL = `SELECT (CASE WHEN sum({{qty}}) > 9223372036854775807 THEN 9223372036854775807 ELSE sum({{qty}}) END)::bigint
FROM {{table}} WHERE key = $1`
	// spread lays n out over the buckets, the remainder to the first ones.
	spread = `INSERT INTO {{table}} AS s (key, bucket, {{qty}})
SELECT $1, b, $2::bigint / $3::int + CASE WHEN b < $2::bigint % $3::int THEN 1 ELSE 0 END FROM generate_series(0, $3::int - 1) AS b
ON CONFLICT (key, bucket) `
	// Put adds n to the key's buckets, creating them if needed.
	putSQL = spread + `DO UPDATE SET {{qty}} = s.{{qty}} + EXCLUDED.{{qty}}`
	// openSQL creates the key's buckets only if the key has no bucket 0:
	// bucket 0 decides, so opening an existing key adds nothing, not even
	// from an Accounts with more buckets than the key was opened with, and
	// concurrent Opens queue on bucket 0's entry.
	openSQL = `WITH first AS (
  INSERT INTO {{table}} (key, bucket, {{qty}}) VALUES ($1, 0, $2::bigint / $3::int + CASE WHEN 0 < $2::bigint % $3::int THEN 1 ELSE 0 END)
  ON CONFLICT (key, bucket) DO NOTHING RETURNING 1)
INSERT INTO {{table}} (key, bucket, {{qty}})
SELECT $1, b, $2::bigint / $3::int + CASE WHEN b < $2::bigint % $3::int THEN 1 ELSE 0 END
FROM generate_series(1, $3::int - 1) AS b WHERE EXISTS (SELECT FROM first)
ON CONFLICT (key, bucket) DO NOTHING`
)

//go:embed stock.sql
var stockSQL string
