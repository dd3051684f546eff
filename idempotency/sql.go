package idempotency

import _ "embed"

//go:embed store.sql
var storeSQL string

// The statements, with {{table}} replaced by the quoted table name.
const (
	// claimSQL claims a key, unless another transaction holds it: its
	// source row (claimBound) tries the key's advisory lock (see keyLock),
	// and the insert runs only if it was not refused. A committed row
	// (live or expired) makes the insert do nothing at once, without
	// writing anything. It returns one row: the claimed record's times
	// (NULL if the key was not claimed) and whether the key was free (false:
	// a request in flight holds it; the caller ends the transaction and
	// tries again later, holding no connection meanwhile).
	//
	// The insert could still wait for an uncommitted row of the key whose
	// writer took no lock (none of this package's statements): that wait
	// is bounded by lock_timeout ($5; NULL keeps the connection's own) for
	// this statement only, restored by the last column, so fn runs with
	// the connection's setting. All in one statement: each statement in a
	// pipeline costs as much as a small query.
	claimSQL = claimBound + `,
w AS (INSERT INTO {{table}} (scope, key, fingerprint, expires_at)
  SELECT $1, $2, $3, now() + $4::bigint * interval '1 microsecond' FROM bound WHERE free IS NOT FALSE
  ON CONFLICT (scope, key) DO NOTHING
  RETURNING created_at, expires_at)
` + claimResult
	// readSQL reads a key's record, whether it has expired and whether the
	// server has a synchronous standby (see found): the row a failed claim
	// met (with a snapshot taken after the claim's wait), or the one Get
	// and a call that reads first look up. "+ interval '0 s'" keeps the planner
	// on the primary key rather than the expiry index.
	readSQL = `SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now(),
       current_setting('synchronous_standby_names') <> ''
FROM {{table}} WHERE scope = $1 AND key = $2`
	// takeoverSQL claims a key whose record has expired, in place, as
	// claimSQL claims a new one, with the same result row. Of two takers,
	// the second finds the key's lock taken, and tries again later.
	takeoverSQL = claimBound + `,
w AS (UPDATE {{table}} SET fingerprint = $3, terminal = false, result = NULL, created_at = now(),
    expires_at = now() + $4::bigint * interval '1 microsecond'
  FROM bound WHERE free IS NOT FALSE AND scope = $1 AND key = $2 AND expires_at + interval '0 s' <= now()
  RETURNING created_at, expires_at)
` + claimResult
	// recordSQL stores fn's result in the claimed row. It is pipelined with
	// COMMIT, so it must fail rather than update nothing if the row is gone
	// (fn deleted it): 1/0 raises, and the COMMIT behind it never runs.
	recordSQL = `WITH r AS (UPDATE {{table}} SET result = $3, terminal = $4 WHERE scope = $1 AND key = $2 RETURNING 1)
SELECT 1 / count(*) FROM r`
	reapSQL = `DELETE FROM {{table}} t USING (
  SELECT scope, key FROM {{table}} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) e WHERE t.scope = e.scope AND t.key = e.key AND t.expires_at <= now()`
)

// claimBound is the source row of a claim (claimSQL, takeoverSQL): it
// saves the connection's lock_timeout, sets the claim's ($5), and tries
// the key's lock (keyLock) in column free, in that order, once.
const claimBound = `WITH bound AS MATERIALIZED (
  SELECT set_config('nolock.lock_timeout', current_setting('lock_timeout'), true) AS saved,
         set_config('lock_timeout', coalesce($5, current_setting('lock_timeout')), true) AS bounded,
         ` + keyLock + ` AS free)`

// claimResult is a claim's one result row: the claimed record's times
// (NULL: not claimed), whether the key was free, and the restore of the
// connection's lock_timeout.
const claimResult = `SELECT w.created_at, w.expires_at, b.free IS NOT FALSE,
  set_config('lock_timeout', current_setting('nolock.lock_timeout'), true)
FROM bound b LEFT JOIN w ON true`

// probeSQL says whether a key has a live record or its lock is free (and
// then takes it until the statement's implicit transaction ends, at
// once): whether a waiting call should make an attempt.
const probeSQL = `SELECT coalesce(` + keyLock + `, true)`

// keyLock, in a claim's source row, tries the key's transaction-level
// advisory lock (a hash of scope and key seeded with the table's OID):
// true if this transaction now holds it, false if another one does (a
// request for the key in flight: no statement ever waits for it). A key
// whose live record the statement's snapshot sees is not locked (NULL):
// the claim then meets the record without waiting, and the replay that
// follows (its read, its commit, on a server with a synchronous standby
// its wait for the standby) holds nothing that other calls of the key
// wait for. Two keys share a lock only on a 64-bit collision, which costs
// a wait, nothing else.
const keyLock = `CASE WHEN EXISTS (SELECT FROM {{table}} WHERE scope = $1 AND key = $2 AND expires_at + interval '0 s' > now()) THEN NULL
  ELSE pg_try_advisory_xact_lock(hashtextextended(length($1) || ':' || $1 || $2, {{table_literal}}::regclass::oid::bigint)) END`

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
