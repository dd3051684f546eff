package lease

import (
	"context"
	_ "embed"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed lease.sql
var schemaSQL string

// The statements, with {{table}} replaced by the quoted table name. Every
// instant is the database's clock_timestamp(); durations go as bigint
// microseconds, and remaining times come back the same way, so no client
// timestamp is ever stored or compared.
const (
	// takeSQL is an acquisition's first try, one statement: it creates
	// the row with token 1, or takes it over, adding 1 to its token, when
	// it is released or its lease (plus the lock-delay $6) has run out. It
	// returns the token, or no row if the lock is held. A takeover's lease
	// counts from after its WHERE judged the old one run out (SET runs
	// after it), not from the VALUES row, computed before the conflict
	// and any wait for the row's lock.
	takeSQL = `INSERT INTO {{table}} AS t (key, owner, nonce, token, expires_at, released, data)
VALUES ($1::text, $2::text, $3::text, 1, clock_timestamp() + $4::bigint * interval '1 microsecond', false, $5::bytea)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, nonce = excluded.nonce, token = t.token + 1,
  expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond', released = false, data = excluded.data
WHERE t.released OR t.expires_at + $6::bigint * interval '1 microsecond' <= clock_timestamp()
RETURNING t.token`

	// acquireSQL is takeSQL for the tries after the first, which also need
	// to know whom they wait for: a refused one returns the holder's row,
	// with the time left until it can be taken (as of the statement's
	// snapshot; no row if the row was created after it).
	acquireSQL = `WITH won AS (
` + takeSQL + `
)
SELECT true, token, ''::text, ''::text, NULL::bytea, 0::bigint FROM won
UNION ALL
SELECT false, token, owner, nonce, data,
  (extract(epoch FROM expires_at + $6::bigint * interval '1 microsecond' - clock_timestamp()) * 1000000)::bigint
FROM {{table}} WHERE key = $1::text AND NOT EXISTS (SELECT FROM won)`

	// renewSQL extends the leases of the locks of keys $1 with tokens
	// $2 (arrays of one length), each if its holder still has it and its
	// lease has not run out on the database's clock, in one statement. It
	// returns the keys and tokens it renewed.
	renewSQL = `WITH renewed AS (
UPDATE {{table}} AS t SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
FROM unnest($1::text[], $2::bigint[]) AS h(key, token)
WHERE t.key = h.key AND t.token = h.token AND NOT t.released AND t.expires_at > clock_timestamp()
RETURNING t.key, t.token)
SELECT coalesce(array_agg(key), '{}'), coalesce(array_agg(token), '{}') FROM renewed`

	// releaseSQL marks the row of token's holder released; the row and its
	// token stay. Its commit is asynchronous (synchronous_commit off for
	// this transaction only): it is visible at once but neither flushed
	// nor replicated before the answer. A release lost to a crash or
	// failover leaves the row as the holder's until its lease and
	// lock-delay run out, so no durability is needed, and the next
	// acquisition's commit flushes it anyway.
	releaseSQL = `UPDATE {{table}} SET released = true FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
WHERE key = $1::text AND token = $2::bigint AND NOT released`

	// cleanupSQL releases what acquiring statements with an unknown
	// outcome may have taken.
	cleanupSQL = `UPDATE {{table}} SET released = true WHERE key = $1::text AND nonce = ANY($2::text[]) AND NOT released`

	// readSQL reads a row and the time left of its lease.
	readSQL = `SELECT token, owner, released, (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint
FROM {{table}} WHERE key = $1::text`

	// readAllSQL reads the rows of keys $1 as readSQL does, as arrays.
	readAllSQL = `SELECT coalesce(array_agg(key), '{}'), coalesce(array_agg(token), '{}'), coalesce(array_agg(owner), '{}'),
  coalesce(array_agg(released), '{}'),
  coalesce(array_agg((extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint), '{}')
FROM {{table}} WHERE key = ANY($1::text[])`

	// fenceSQL is the condition of FenceSQL.
	fenceSQL = `EXISTS (SELECT FROM {{table}} WHERE key = $K::text AND token = $T::bigint AND NOT released
  AND expires_at > clock_timestamp() FOR SHARE)`
)

// statements are a Client's SQL texts for its table.
type statements struct {
	schema, take, acquire, renew, release, cleanup, read, readAll, fence string
}

func newStatements(table string) statements {
	r := strings.NewReplacer("{{table}}", pgx.Identifier{table}.Sanitize())
	return statements{
		schema: r.Replace(schemaSQL), take: r.Replace(takeSQL), acquire: r.Replace(acquireSQL), renew: r.Replace(renewSQL),
		release: r.Replace(releaseSQL), cleanup: r.Replace(cleanupSQL), read: r.Replace(readSQL), readAll: r.Replace(readAllSQL),
		fence: r.Replace(fenceSQL),
	}
}

// micros returns d in whole microseconds, the unit of the statements.
func micros(d time.Duration) int64 { return d.Microseconds() }

// row is a lock row as read.
type row struct {
	key      string
	exists   bool
	token    int64
	owner    string
	released bool
	left     time.Duration // of the lease, on the database's clock (negative: expired)
}

// read reads the row of key (not exists if there is none).
func (c *Client) read(ctx context.Context, key string) (row, error) {
	r := row{exists: true}
	var left int64
	err := c.over.QueryRow(ctx, c.db, c.sql.read, key).Scan(&r.token, &r.owner, &r.released, &left)
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, nil
	}
	if err != nil {
		return row{}, err
	}
	r.left = time.Duration(left) * time.Microsecond
	return r, nil
}

// readAll reads the rows of keys, by key (a key without a row is absent).
func (c *Client) readAll(ctx context.Context, keys []string) (map[string]row, error) {
	var ks, owners []string
	var tokens, lefts []int64
	var released []bool
	err := c.over.QueryRow(ctx, c.db, c.sql.readAll, keys).Scan(&ks, &tokens, &owners, &released, &lefts)
	if err != nil {
		return nil, err
	}
	rows := make(map[string]row, len(ks))
	for i, k := range ks {
		rows[k] = row{key: k, exists: true, token: tokens[i], owner: owners[i], released: released[i], left: time.Duration(lefts[i]) * time.Microsecond}
	}
	return rows, nil
}
