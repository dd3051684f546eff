package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// server is what one round trip tells about the PostgreSQL server.
type server struct {
	version                string
	versionNum, port       int
	syncCommit, syncNames  string
	isolation, fsync       string
	inRecovery             bool
	replicas, syncReplicas int
	schemas                []string
	tables                 []table
}

// table is one of nolock's tables and what its rows say about upkeep.
type table struct {
	name, size string   // "schema.name", "8192 bytes"
	columns    []string // the time columns the doctor reads
}

// checkPostgres connects as the services do and reports the server, the
// pooler in front of it with the pgx mode to use, durability, isolation
// and nolock's tables.
func checkPostgres(ctx context.Context, dsn string) []finding {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return []finding{{Area: "postgres", Status: fail, Detail: "the DSN does not parse: " + err.Error(),
			Fix: "give -postgres or $DATABASE_URL a postgres:// URL or key=value pairs"}}
	}
	userMode := cfg.DefaultQueryExecMode
	// The doctor's own statements use the simple protocol, which every
	// pooler mode passes.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return []finding{{Area: "postgres", Status: fail, Detail: fmt.Sprintf("cannot connect to %s:%d: %v", cfg.Host, cfg.Port, err),
			Fix: "check the DSN, the network and the role's password"}}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	s, err := readServer(ctx, conn)
	if err != nil {
		return []finding{{Area: "postgres", Status: fail, Detail: "cannot read the server's settings: " + err.Error()}}
	}
	fs := []finding{serverFinding(cfg, s)}
	fs = append(fs, poolerFinding(ctx, cfg, userMode, s))
	fs = append(fs, durabilityFindings(s)...)
	fs = append(fs, isolationFinding(s))
	return append(fs, tableFindings(ctx, conn, s)...)
}

func readServer(ctx context.Context, conn *pgx.Conn) (server, error) {
	var s server
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')::int,
		current_setting('port')::int, current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		current_setting('default_transaction_isolation'), current_setting('fsync'), pg_is_in_recovery(),
		(SELECT count(*) FROM pg_stat_replication), (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
		current_schemas(false)`).Scan(&s.version, &s.versionNum, &s.port, &s.syncCommit, &s.syncNames,
		&s.isolation, &s.fsync, &s.inRecovery, &s.replicas, &s.syncReplicas, &s.schemas)
	if err != nil {
		return s, err
	}
	rows, err := conn.Query(ctx, `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), pg_size_pretty(pg_total_relation_size(c.oid)),
		array(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
			AND a.attname IN ('expires_at', 'token', 'processed_at', 'parked_at') ORDER BY a.attname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'nolock%' AND n.nspname = ANY (current_schemas(false))
		ORDER BY 1`)
	if err != nil {
		return s, err
	}
	s.tables, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var t table
		err := r.Scan(&t.name, &t.size, &t.columns)
		return t, err
	})
	return s, err
}

func serverFinding(cfg *pgx.ConnConfig, s server) finding {
	f := finding{Area: "postgres", Status: pass, Detail: fmt.Sprintf("PostgreSQL %s via %s:%d", s.version, cfg.Host, cfg.Port)}
	switch {
	case s.inRecovery:
		f.Status, f.Detail = fail, f.Detail+": a standby, which refuses writes"
		f.Fix = "point the DSN at the primary; with several hosts add target_session_attrs=read-write"
	case s.versionNum < 140000:
		f.Status, f.Detail = warn, f.Detail+": past its community support"
		f.Fix = "nolock is tested on PostgreSQL 15; upgrade to a supported release"
	}
	return f
}

// pgbouncer is what PgBouncer's admin console says, when it answers.
type pgbouncer struct {
	version     [3]int
	poolMode    string
	maxPrepared int
}

// readPgBouncer asks the admin console (database "pgbouncer") at the DSN's
// address; PostgreSQL itself has no such database.
func readPgBouncer(ctx context.Context, cfg *pgx.ConnConfig) (pgbouncer, error) {
	var b pgbouncer
	admin := cfg.Copy()
	admin.Database = "pgbouncer"
	admin.RuntimeParams = map[string]string{}
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return b, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v string
	if err := conn.QueryRow(ctx, "SHOW VERSION").Scan(&v); err != nil {
		return b, err
	}
	if _, err := fmt.Sscanf(strings.TrimPrefix(v, "PgBouncer "), "%d.%d.%d", &b.version[0], &b.version[1], &b.version[2]); err != nil {
		return b, fmt.Errorf("version %q: %w", v, err)
	}
	rows, err := conn.Query(ctx, "SHOW CONFIG")
	if err != nil {
		return b, err
	}
	defer rows.Close()
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) < 2 {
			continue
		}
		switch string(vals[0]) {
		case "pool_mode":
			b.poolMode = string(vals[1])
		case "max_prepared_statements":
			b.maxPrepared, _ = strconv.Atoi(string(vals[1]))
		}
	}
	return b, rows.Err()
}

func poolerFinding(ctx context.Context, cfg *pgx.ConnConfig, mode pgx.QueryExecMode, s server) finding {
	f := finding{Area: "pooler"}
	b, err := readPgBouncer(ctx, cfg)
	switch {
	case err == nil:
		f.Detail = fmt.Sprintf("PgBouncer %d.%d.%d, pool_mode %s, max_prepared_statements %d; pgx mode %s",
			b.version[0], b.version[1], b.version[2], b.poolMode, b.maxPrepared, modeName(mode))
	case int(cfg.Port) != s.port:
		b.poolMode = "transaction" // unknown: judge the strictest
		f.Detail = fmt.Sprintf("something listens on port %d before PostgreSQL's %d (its admin console did not answer: %v); pgx mode %s",
			cfg.Port, s.port, err, modeName(mode))
	default:
		f.Status, f.Detail = pass, fmt.Sprintf("none: the DSN reaches PostgreSQL directly; pgx mode %s", modeName(mode))
		return f
	}
	f.Status, f.Fix = modeAdvice(mode, b)
	return f
}

// modeAdvice judges pgx's mode behind b, as docs/deploying.md's table does.
func modeAdvice(mode pgx.QueryExecMode, b pgbouncer) (status, fix string) {
	if b.poolMode == "session" {
		return pass, ""
	}
	keepsNames := b.version[0] > 1 || b.version[0] == 1 && b.version[1] >= 21 && b.maxPrepared > 0
	switch mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheDescribe:
		return pass, ""
	case pgx.QueryExecModeDescribeExec:
		return warn, "your own statements outside a transaction may bind to another client's: add default_query_exec_mode=exec to the DSN"
	case pgx.QueryExecModeCacheStatement:
		if keepsNames {
			return pass, ""
		}
		return warn, "your own statements fail at random with 26000 or 42P05 (nolock's fall back after one failure): add default_query_exec_mode=exec to the DSN, or from PgBouncer 1.21 set max_prepared_statements"
	}
	return warn, "unknown pgx mode: use default_query_exec_mode=exec"
}

// modeName is mode as the DSN's default_query_exec_mode spells it.
func modeName(mode pgx.QueryExecMode) string {
	return strings.ReplaceAll(mode.String(), " ", "_")
}

func durabilityFindings(s server) []finding {
	f := finding{Area: "durability", Status: pass}
	switch {
	case s.fsync != "on":
		f.Status, f.Detail = fail, "fsync is off: a crash can lose or corrupt commits nolock reported"
		f.Fix = "set fsync = on"
	case s.syncCommit == "off":
		f.Status, f.Detail = fail, "synchronous_commit is off: a crash loses commits that nolock reported as applied (records, tokens, epochs)"
		f.Fix = "set synchronous_commit = on (at least for the roles nolock's statements run as)"
	case s.replicas > 0 && s.syncNames == "":
		f.Status, f.Detail = warn, fmt.Sprintf("%d replica(s), none synchronous: a failover can lose acknowledged commits", s.replicas)
		f.Fix = "set synchronous_standby_names, or never promote an asynchronous replica without fencing old holders"
	case s.syncNames != "" && s.syncCommit != "on" && s.syncCommit != "remote_apply":
		f.Status, f.Detail = warn, fmt.Sprintf("synchronous_commit is %s with standbys %q: a commit may return before its standby holds it", s.syncCommit, s.syncNames)
		f.Fix = "set synchronous_commit = on"
	case s.syncNames != "":
		f.Detail = fmt.Sprintf("synchronous_commit %s, synchronous standbys %q (%d of %d replicas synchronous)", s.syncCommit, s.syncNames, s.syncReplicas, s.replicas)
	default:
		f.Detail = fmt.Sprintf("synchronous_commit %s, no replicas", s.syncCommit)
	}
	return []finding{f}
}

func isolationFinding(s server) finding {
	f := finding{Area: "isolation", Status: pass, Detail: "default_transaction_isolation " + s.isolation}
	if s.isolation != "read committed" {
		f.Status = warn
		f.Detail += ": contended conditional updates fail with 40001 and are retried instead of re-checking the row"
		f.Fix = "keep the default read committed for the roles nolock uses"
	}
	return f
}

// tableFindings reports each nolock table's size and upkeep: expired
// records not yet reaped (idempotency), the oldest message id kept
// (inbox), parked messages waiting for an operator. Each read uses the
// column's index or a small table.
func tableFindings(ctx context.Context, conn *pgx.Conn, s server) []finding {
	if len(s.tables) == 0 {
		return []finding{{Area: "tables", Status: warn,
			Detail: fmt.Sprintf("no table named nolock* in the search_path (%s); tables named otherwise are not checked", strings.Join(s.schemas, ", ")),
			Fix:    "create them with `nolock schema postgres | psql` or the packages' CreateSchema"}}
	}
	var fs []finding
	for _, t := range s.tables {
		f := finding{Area: "tables", Status: pass, Detail: fmt.Sprintf("%s (%s)", t.name, t.size)}
		var n int64
		var secs *float64 // an age, in seconds
		var err error
		age := func() time.Duration { return time.Duration(*secs * float64(time.Second)).Round(time.Second) }
		has := func(c string) bool { return slices.Contains(t.columns, c) }
		switch {
		case has("expires_at") && !has("token"): // records that expire (a lease row keeps its token: never reaped)
			err = conn.QueryRow(ctx, "SELECT extract(epoch FROM now() - min(expires_at))::float8 FROM "+t.name+" WHERE expires_at < now()").Scan(&secs)
			if err == nil && secs != nil {
				f.Detail += fmt.Sprintf(": expired records kept, the oldest expired %v ago", age())
				if age() > time.Hour {
					f.Status, f.Fix = warn, "reaping is behind or not scheduled: call the Store's Reap on a timer (see its docs)"
				}
			}
		case has("parked_at"):
			err = conn.QueryRow(ctx, "SELECT count(*), extract(epoch FROM now() - min(parked_at))::float8 FROM "+t.name).Scan(&n, &secs)
			if err == nil && n > 0 {
				f.Status = warn
				f.Detail += fmt.Sprintf(": %d parked message(s), the oldest parked %v ago", n, age())
				f.Fix = "look at them (ListParked, or nolock parked list), fix the cause, replay or purge them"
			}
		case has("processed_at"):
			err = conn.QueryRow(ctx, "SELECT extract(epoch FROM now() - min(processed_at))::float8 FROM "+t.name).Scan(&secs)
			if err == nil && secs != nil {
				f.Detail += fmt.Sprintf(": the oldest message id kept is %v old (Reap's retention bounds it)", age())
			}
		}
		if err != nil {
			f.Status, f.Detail = warn, f.Detail+": cannot read it: "+err.Error()
		}
		fs = append(fs, f)
	}
	return fs
}
