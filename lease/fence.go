package lease

import (
	"strconv"
	"strings"
)

// FenceSQL returns a condition to add to your own statement on the
// database that holds the lease table: true while the lock named by
// parameter $keyParam is held with the token in parameter $tokenParam
// (Key and Token of your Lock), its lease not run out on the database's
// clock and not released (a release lost to a crash or failover is no
// release: stop writing before Release). It locks the lease row FOR SHARE until your
// transaction ends, so no takeover (and no renewal) can commit between the
// check and your commit: the write commits only while the lease is held.
// It is etcd's IsOwner comparison for PostgreSQL:
//
//	UPDATE reports SET body = $3 WHERE day = $4 AND <FenceSQL(1, 2)>
//
// with $1 = lock.Key() and $2 = lock.Token(). Keep such transactions
// short: while one holds the row, the lock's renewals wait for it. For a
// resource in another table that remembers tokens itself, use
// conditional.Fenced with Token instead. keyParam and tokenParam must be
// distinct and positive; FenceSQL panics otherwise, as regexp.MustCompile
// does for a bad constant.
func (c *Client) FenceSQL(keyParam, tokenParam int) string {
	if keyParam <= 0 || tokenParam <= 0 || keyParam == tokenParam {
		panic("lease: FenceSQL: parameter numbers must be distinct and positive")
	}
	return strings.NewReplacer("$K", "$"+strconv.Itoa(keyParam), "$T", "$"+strconv.Itoa(tokenParam)).Replace(c.sql.fence)
}
