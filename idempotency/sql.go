package idempotency

import _ "embed"

//go:embed store.sql
var storeSQL string

// The statements, with {{table}} replaced by the quoted table name.
const (
	// claimSQL is the first statement of a claim, sent with BEGIN: it tries
	// the key's lock (keyHash). readSQL follows it in the same round trip:
	// a statement of its own, so that its snapshot, taken after the lock
	// was granted, sees the record of any request that held the lock
	// before (a transaction is visible before it releases its locks). A key
	// whose lock this transaction holds and whose record readSQL finds
	// absent or expired is this transaction's to write: no other call of
	// this package writes it until the lock is released, at the
	// transaction's end. A key whose lock another transaction holds is a
	// request in flight (or a replay of the key, for one round trip): no
	// statement ever waits for it.
	// It also returns now(), the transaction's start: the record's
	// created_at (its default, in the same transaction), from which its
	// expires_at follows, so the record's insert need not read them back.
	claimSQL = `SELECT pg_try_advisory_xact_lock(` + keyHash + `), now()`
	// claimBoundSQL is claimSQL for Exec: it also sets lock_timeout to $3
	// (milliseconds as text; NULL keeps the connection's) for the rest of
	// the transaction, so that every lock wait of Exec's statement, sent
	// next with COMMIT, is bounded by the call's wait. The claim and the
	// read wait for no lock.
	claimBoundSQL = claimSQL + `, set_config('lock_timeout', coalesce($3, current_setting('lock_timeout')), true)`
	// readSQL reads a key's record, whether it has expired and whether the
	// server has a synchronous standby (see found): in a claim (see
	// claimSQL), and for Get and a call that reads first. "+ interval '0 s'"
	// keeps the planner on the primary key rather than the expiry index.
	readSQL = `SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now(),
       current_setting('synchronous_standby_names') <> ''
FROM {{table}} WHERE scope = $1 AND key = $2`
	// recordSQL stores a claimed key's record, with fn's result, in the
	// transaction that ran fn, sent with COMMIT: the key had no record when
	// it was claimed. Its times are the claim's now() (see claimSQL) and
	// that plus $6 microseconds.
	recordSQL = `INSERT INTO {{table}} (scope, key, fingerprint, terminal, result, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + $6::bigint * interval '1 microsecond')`
	// takeoverSQL is recordSQL for a key whose record had expired when it
	// was claimed: it replaces that record (or inserts, if Reap deleted it
	// meanwhile). A live record in its place (written without the key's
	// lock) makes it fail (1 / 0), and the COMMIT behind it never runs.
	takeoverSQL = `WITH r AS (INSERT INTO {{table}} AS nolock_t (scope, key, fingerprint, terminal, result, expires_at)
  VALUES ($1, $2, $3, $4, $5, now() + $6::bigint * interval '1 microsecond')
  ` + takeover + `
  RETURNING created_at, expires_at)
SELECT min(created_at), min(expires_at) FROM r HAVING 1 / count(*) = 1`
	reapSQL = `DELETE FROM {{table}} t USING (
  SELECT scope, key FROM {{table}} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) e WHERE t.scope = e.scope AND t.key = e.key AND t.expires_at <= now()`
)

// takeover is the conflict clause of a record's insert that replaces an
// expired record of the key (the table is aliased nolock_t).
const takeover = `ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, terminal = excluded.terminal,
    result = excluded.result, created_at = now(), expires_at = excluded.expires_at
  WHERE nolock_t.expires_at + interval '0 s' <= now()`

// probeSQL says whether a key has a live record or its lock is free (and
// then takes it until the statement's implicit transaction ends, at
// once): whether a waiting call should make an attempt. A key whose live
// record the statement's snapshot sees is not locked.
const probeSQL = `SELECT CASE WHEN EXISTS (SELECT FROM {{table}} WHERE scope = $1 AND key = $2 AND expires_at + interval '0 s' > now()) THEN true
  ELSE pg_try_advisory_xact_lock(` + keyHash + `) END`

// keyHash names a key's transaction-level advisory lock: a hash of scope
// and key seeded with the table's OID. Two keys share a lock only on a
// 64-bit collision, which costs a wait, nothing else.
const keyHash = `hashtextextended(length($1) || ':' || $1 || $2, {{table_literal}}::regclass::oid::bigint)`

// syncMarkSQL writes a WAL record in its transaction (a transactional
// logical message, ignored by logical decoding unless asked for) when the
// server has a synchronous standby: PostgreSQL makes a COMMIT wait for the
// standby only when its transaction wrote WAL, so the transaction's COMMIT
// then waits until the standby holds the WAL up to it.
const syncMarkSQL = `SELECT pg_logical_emit_message(true, 'nolock', '') WHERE current_setting('synchronous_standby_names') <> ''`

// claimedSQL wraps the caller's statement (%[1]s) for Exec, in the
// transaction that claimed the key (claimBoundSQL set its lock_timeout):
// it runs the effect and inserts the key's record holding its RETURNING
// rows (json_agg of them; none is a terminal outcome, stored as "[]"), in
// one statement sent with COMMIT. The key had no record when it was
// claimed, and no other call writes one while this transaction holds its
// lock. Parameters $%[2]d to $%[5]d follow the caller's own: scope, key,
// fingerprint and retention in microseconds. It returns the stored result
// alone: terminal is a result of "[]", and the times are the claim's (see
// claimSQL).
const claimedSQL = `WITH nolock_effect AS (%[1]s
)
INSERT INTO {{table}} (scope, key, fingerprint, terminal, result, expires_at)
SELECT $%[2]d, $%[3]d, $%[4]d, r.rows IS NULL, convert_to(coalesce(r.rows, '[]'), 'UTF8'), now() + $%[5]d::bigint * interval '1 microsecond'
FROM (SELECT json_agg(e)::text AS rows FROM nolock_effect e) r
RETURNING result`

// claimedTakeoverSQL is claimedSQL for a key whose record had expired
// when it was claimed: it replaces that record (or inserts, if Reap
// deleted it meanwhile). A live record in its place (written without the
// key's lock) makes it fail (1 / 0), and the COMMIT behind it never runs.
const claimedTakeoverSQL = `WITH nolock_effect AS (%[1]s
),
nolock_record AS (
  INSERT INTO {{table}} AS nolock_t (scope, key, fingerprint, terminal, result, expires_at)
  SELECT $%[2]d, $%[3]d, $%[4]d, r.rows IS NULL, convert_to(coalesce(r.rows, '[]'), 'UTF8'), now() + $%[5]d::bigint * interval '1 microsecond'
  FROM (SELECT json_agg(e)::text AS rows FROM nolock_effect e) r
  ` + takeover + `
  RETURNING result)
SELECT (array_agg(result))[1] FROM nolock_record HAVING 1 / count(*) = 1`
