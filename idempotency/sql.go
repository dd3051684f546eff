package idempotency

import _ "embed"

//go:embed store.sql
var storeSQL string

// The statements, with {{table}} replaced by the quoted table name.
const (
	// claimSQL claims a key. It first takes the key's advisory lock (see
	// keyLock). Under Read Committed an insert that meets
	// another transaction's uncommitted row for the key waits for it: if it
	// rolls back, the insert claims the key; if it commits, the insert does
	// nothing. A committed row (live or expired) makes it do nothing at
	// once, without writing anything.
	//
	// The wait is bounded by lock_timeout ($5; NULL keeps the connection's
	// own) for this statement only: the source row sets it, saving the
	// connection's value, before the insert can wait, and RETURNING
	// restores it once the key is claimed (fn runs with the connection's
	// setting). When the claim fails, the transaction ends without fn, so
	// there is nothing to restore. All in one statement: each statement in
	// a pipeline costs as much as a small query.
	claimSQL = `INSERT INTO {{table}} (scope, key, fingerprint, expires_at)
SELECT $1, $2, $3, now() + $4::bigint * interval '1 microsecond'
FROM (SELECT set_config('nolock.lock_timeout', current_setting('lock_timeout'), true),
             set_config('lock_timeout', coalesce($5, current_setting('lock_timeout')), true),
             ` + keyLock + `) AS bound
ON CONFLICT (scope, key) DO NOTHING
RETURNING created_at, expires_at, set_config('lock_timeout', current_setting('nolock.lock_timeout'), true)`
	// readSQL reads a key's record, whether it has expired and whether the
	// server has a synchronous standby (see found): the row a failed claim
	// met (with a snapshot taken after the claim's wait), or the one Get
	// and a call that reads first look up. "+ interval '0 s'" keeps the planner
	// on the primary key rather than the expiry index.
	readSQL = `SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now(),
       current_setting('synchronous_standby_names') <> ''
FROM {{table}} WHERE scope = $1 AND key = $2`
	// takeoverSQL claims a key whose record has expired, in place, its wait
	// bounded like the claim's, under the key's advisory lock like the
	// claim. Two takers queue on the row lock; the second re-checks the row
	// the first left and takes it only if the first rolled back.
	takeoverSQL = `UPDATE {{table}} SET fingerprint = $3, terminal = false, result = NULL, created_at = now(),
  expires_at = now() + $4::bigint * interval '1 microsecond'
FROM (SELECT set_config('nolock.lock_timeout', current_setting('lock_timeout'), true),
             set_config('lock_timeout', coalesce($5, current_setting('lock_timeout')), true),
             ` + keyLock + `) AS bound
WHERE scope = $1 AND key = $2 AND expires_at + interval '0 s' <= now()
RETURNING created_at, expires_at, set_config('lock_timeout', current_setting('nolock.lock_timeout'), true)`
	// recordSQL stores fn's result in the claimed row. It is pipelined with
	// COMMIT, so it must fail rather than update nothing if the row is gone
	// (fn deleted it): 1/0 raises, and the COMMIT behind it never runs.
	recordSQL = `WITH r AS (UPDATE {{table}} SET result = $3, terminal = $4 WHERE scope = $1 AND key = $2 RETURNING 1)
SELECT 1 / count(*) FROM r`
	reapSQL = `DELETE FROM {{table}} t USING (
  SELECT scope, key FROM {{table}} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) e WHERE t.scope = e.scope AND t.key = e.key AND t.expires_at <= now()`
)

// keyLock, in a claim's source row, takes the key's transaction-level
// advisory lock (a hash of scope and key seeded with the table's OID), after lock_timeout is set and before the
// claim's insert or update. A key whose live record the statement's
// snapshot sees is not locked: the claim then returns no row without
// waiting, and the replay that follows (its read, its commit, on a server
// with a synchronous standby its wait for the standby) holds nothing that
// other calls of the key wait on.
const keyLock = `CASE WHEN EXISTS (SELECT FROM {{table}} WHERE scope = $1 AND key = $2 AND expires_at + interval '0 s' > now()) THEN NULL
  ELSE pg_advisory_xact_lock(hashtextextended(length($1) || ':' || $1 || $2, {{table_literal}}::regclass::oid::bigint))::text END`

// syncMarkSQL writes a WAL record in its transaction (a transactional
// logical message, ignored by logical decoding unless asked for) when the
// server has a synchronous standby: PostgreSQL makes a COMMIT wait for the
// standby only when its transaction wrote WAL, so the transaction's COMMIT
// then waits until the standby holds the WAL up to it.
const syncMarkSQL = `SELECT pg_logical_emit_message(true, 'nolock', '') WHERE current_setting('synchronous_standby_names') <> ''`

// claimedSQL wraps the caller's statement (%[1]s) for Exec's default, in
// the transaction that claimed the key: it runs the effect and stores its
// RETURNING rows in the claimed row, in one statement sent with COMMIT.
// nolock_bound runs first (the effect is pulled only through a LATERAL
// join on it, and a MATERIALIZED CTE is not folded into its user): it
// bounds every lock wait of the statement by lock_timeout ($%[2]d), for
// the rest of the transaction; the effect's rows may be held by another
// request in flight. If the
// claimed row is gone (the statement deleted it), the statement fails
// (1 / 0), and the COMMIT behind it never runs. Parameters $%[2]d to
// $%[4]d follow the caller's own.
const claimedSQL = `WITH nolock_bound AS MATERIALIZED (
  SELECT set_config('lock_timeout', coalesce($%[2]d, current_setting('lock_timeout')), true) AS lock_timeout),
nolock_effect AS (%[1]s
),
nolock_record AS (
  UPDATE {{table}} SET result = convert_to(coalesce(r.rows, '[]'), 'UTF8'), terminal = r.rows IS NULL
  FROM nolock_bound b, LATERAL (SELECT json_agg(e)::text AS rows FROM nolock_effect e WHERE b.lock_timeout IS NOT NULL) r
  WHERE scope = $%[3]d AND key = $%[4]d
  RETURNING result, terminal)
SELECT (array_agg(result))[1], bool_or(terminal) FROM nolock_record HAVING 1 / count(*) = 1`
