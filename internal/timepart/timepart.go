// Package timepart renders the time-partitioned layout of the idempotency
// records and inbox ids tables (timepart.sql says what it is and when to
// use it), which `nolock schema -partitioned` prints before the rest of the
// DDL: the rest's CREATE … IF NOT EXISTS then leaves the two tables as
// they are, and so does the packages' CreateSchema. Nothing creates it at
// run time.
package timepart

import (
	_ "embed"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/pgschema"
)

//go:embed timepart.sql
var ddl string

// Function is the name of the function that creates partitions.
const Function = "nolock_create_partitions"

// DDL returns the layout for the idempotency table idem and the inbox
// table inbox (their WithTable names, unquoted), with the index names the
// packages' own DDL gives them.
func DDL(idem, inbox string) string {
	q := func(name string) string { return pgx.Identifier{name}.Sanitize() }
	return strings.NewReplacer(
		"{{function}}", Function,
		"{{lock}}", strconv.FormatInt(pgschema.LockKey, 10),
		"{{idem_name}}", idem, "{{inbox_name}}", inbox,
		"{{idem}}", q(idem), "{{idem_default}}", q(idem+"_default"), "{{idem_expires}}", q(idem+"_expires_at"),
		"{{inbox}}", q(inbox), "{{inbox_default}}", q(inbox+"_default"), "{{inbox_processed_at}}", q(inbox+"_processed_at"),
	).Replace(ddl)
}
