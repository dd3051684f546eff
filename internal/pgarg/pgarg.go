// Package pgarg checks the arguments nolock's PostgreSQL constructors take
// before any I/O: identifiers that PostgreSQL keeps apart exactly as given,
// and database handles that are not nil. Its errors name the parameter and
// say what is wrong; each package wraps them in its own invalid-argument
// error.
package pgarg

import (
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/errfmt"
)

// MaxIdentLen is PostgreSQL's limit on an identifier's length in bytes
// (NAMEDATALEN - 1). The server truncates a longer name, so two names equal
// in their first 63 bytes would address one object.
const MaxIdentLen = 63

// Ident checks name, passed as the parameter param, as an identifier to
// which the caller appends up to suffixLen bytes to name other objects (an
// index, a second table). It returns nil if name is non-empty valid UTF-8
// without NUL and len(name)+suffixLen <= MaxIdentLen: then the server
// stores every such name exactly as given, and two different names never
// address one object. pgx drops NUL bytes from quoted identifiers, and the
// server refuses invalid UTF-8 only when the name reaches it.
func Ident(param, name string, suffixLen int) error {
	switch max := MaxIdentLen - suffixLen; {
	case name == "":
		return errfmt.Errorf("%s is empty", param)
	case len(name) > max && suffixLen > 0:
		return errfmt.Errorf("%s is %d bytes, more than %d (PostgreSQL keeps %d, and names derived from it append up to %d)",
			param, len(name), max, MaxIdentLen, suffixLen)
	case len(name) > max:
		return errfmt.Errorf("%s is %d bytes, more than PostgreSQL's %d", param, len(name), max)
	case strings.IndexByte(name, 0) >= 0:
		return errfmt.Errorf("%s contains a NUL byte", param)
	case !utf8.ValidString(name):
		return errfmt.Errorf("%s is not valid UTF-8", param)
	}
	return nil
}

// NilDB reports whether db is nil or holds a nil pointer of a pgx type
// whose methods would panic: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn.
func NilDB(db any) bool {
	switch v := db.(type) {
	case nil:
		return true
	case *pgxpool.Pool:
		return v == nil
	case *pgxpool.Conn:
		return v == nil
	case *pgx.Conn:
		return v == nil
	}
	return false
}

// Single names the one-connection pgx handle db is, for a constructor
// whose type runs statements from goroutines of its own or beside its
// callers' (a *pgx.Conn and a pgx.Tx run one statement at a time), or ""
// for any other db: a pool, or a wrapper the caller made, which is taken
// as is.
func Single(db any) string {
	switch db.(type) {
	case *pgx.Conn:
		return "a *pgx.Conn"
	case pgx.Tx:
		return "a pgx.Tx"
	}
	return ""
}
