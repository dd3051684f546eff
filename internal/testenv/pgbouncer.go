package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvPgBouncer names the DSN of the shared PgBouncer that scripts/services
// starts: Debian's 1.18 in transaction pooling in front of the shared
// PostgreSQL, every database name passed through, trust auth.
const EnvPgBouncer = "NOLOCK_TEST_PGBOUNCER"

// PgBouncerDSN returns the DSN of the shared PgBouncer (NOLOCK_TEST_PGBOUNCER),
// as user postgres, whose search_path is the server's default. A test that
// creates tables uses PgBouncerDSNFor instead.
func PgBouncerDSN(t testing.TB) string {
	t.Helper()
	return need(t, EnvPgBouncer)
}

// PgBouncerDSNFor returns a DSN through the shared PgBouncer whose sessions
// use schema (made by PostgresSchema on the shared server) as their
// search_path, and schema as their application_name, like PostgresDSNFor.
//
// PgBouncer 1.18 refuses a search_path (or options) startup parameter, and
// ignoring it would put the test's tables in public. So the DSN logs in as
// a role of the test's own, named like the schema, whose default
// search_path is the schema (ALTER ROLE … SET search_path): every server
// connection PgBouncer opens for that role starts in the schema, and the
// role has a PgBouncer pool of its own, which no other test's clients
// share. The role is a superuser, as postgres is, so tests may terminate
// backends and read every session's state. It is dropped, after its server
// connections are terminated and its objects handed to postgres, when the
// test ends.
func PgBouncerDSNFor(t testing.TB, schema string) string {
	t.Helper()
	dsn := PgBouncerDSN(t)
	admin := PostgresDSN(t)
	schemaRole(t, admin, schema, func() string { return admin })
	return roleDSN(t, dsn, schema)
}

// PoolMode opens a pool on dsn whose connections run queries in mode
// (maxConns 0 means pgxpool's default), and closes it when the test ends.
// Opening it pings the server with a simple-protocol query, which works in
// every mode.
func PoolMode(t testing.TB, dsn string, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: open pool: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("testenv: ping %s: %v", redact(dsn), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// QueryExecModes lists every pgx query mode, in pgx's order, for tests
// that run once per mode.
var QueryExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

// PGBouncerProc is a PgBouncer of the test's own, for fault tests that
// kill the pooler or move it to another server: doing that to the shared
// one would break every other test running. It has the shared one's
// settings (transaction pooling, every database passed through, trust
// auth, server_login_retry 1 s), listens on a free loopback port that
// stays the same across restarts, and is killed when the test ends.
type PGBouncerProc struct {
	t        testing.TB
	bin, dir string
	port     int
	upstream string // "host=… port=…" of the server

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	roles  map[string]bool // schemas whose role exists upstream
	admin  string          // DSN of the upstream server, for roles
}

// PgBouncerServer starts a PGBouncerProc in front of the server upstreamDSN
// names (one host: PgBouncer 1.18 cannot choose a primary among several;
// put it in front of PGPair.PrimaryDSN and Retarget it after a failover).
// Without the pgbouncer program the test fails under CI (and scripts/test)
// and skips otherwise, as for a missing service.
func PgBouncerServer(t testing.TB, upstreamDSN string) *PGBouncerProc {
	t.Helper()
	bin := pgbouncerBin()
	if bin == "" {
		msg := "pgbouncer is not installed: run `scripts/services up` (or scripts/test)"
		if Required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	p := &PGBouncerProc{t: t, bin: bin, roles: map[string]bool{}}
	p.upstream, p.admin = upstreamOf(t, upstreamDSN), upstreamDSN
	// Not t.TempDir: pgbouncer runs as the postgres user when the tests
	// run as root (it refuses root), and writes its log there.
	p.dir = ownedTempDir(t, "nolock-pgbouncer-")
	p.port = freePort(t)
	p.writeConfig()
	p.Start()
	t.Cleanup(p.Kill)
	return p
}

// DSN returns the pooler's DSN, as user postgres.
func (p *PGBouncerProc) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// DSNFor returns a DSN through this pooler whose sessions use schema as
// their search_path, by a role of the test's own, as PgBouncerDSNFor does;
// the schema must exist on the upstream server.
func (p *PGBouncerProc) DSNFor(schema string) string {
	p.t.Helper()
	p.mu.Lock()
	have := p.roles[schema]
	p.roles[schema] = true
	p.mu.Unlock()
	if !have {
		schemaRole(p.t, p.adminDSN(), schema, p.adminDSN)
	}
	return roleDSN(p.t, p.DSN(), schema)
}

// Kill ends the pooler with SIGKILL, as a crash would: its clients'
// connections break, and its server connections close, which ends the
// server's sessions (and rolls back their open transactions) when the
// server notices. It returns once the process is gone; killing a stopped
// pooler does nothing.
func (p *PGBouncerProc) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// Start starts the pooler on its port and waits until it accepts
// connections. Starting a running pooler fails the test.
func (p *PGBouncerProc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		p.t.Fatal("testenv: PgBouncer is already running")
	}
	// -q: it logs to its logfile only, printed if it fails to start.
	args := []string{"-q", filepath.Join(p.dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...) // it refuses root
	}
	unhold(p.port)
	cmd := exec.Command(p.bin, args...)
	cmd.Stderr = testWriter{p.t}
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("testenv: start pgbouncer: %v", err)
	}
	prioritise(cmd.Process.Pid)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	Until(p.t, "pgbouncer accepts connections", func() (bool, error) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(p.dir, "pgbouncer.log"))
			return false, fmt.Errorf("pgbouncer exited during start:\n%s", log)
		default:
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.port))
		if err != nil {
			return false, nil
		}
		c.Close()
		return true, nil
	})
}

func (p *PGBouncerProc) adminDSN() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.admin
}

// Retarget points the pooler at the server upstreamDSN names (one host),
// as an operator moves a pooler to a promoted standby: it rewrites the
// configuration and reloads it (SIGHUP) when the pooler runs. New server
// connections go to the new server; PgBouncer closes those to the old
// server as their clients release them. A killed pooler starts with the
// new server. Roles DSNFor made stay known: physical replication has
// copied them to a promoted standby.
func (p *PGBouncerProc) Retarget(upstreamDSN string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upstream, p.admin = upstreamOf(p.t, upstreamDSN), upstreamDSN
	p.writeConfig()
	if p.cmd != nil {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			p.t.Fatalf("testenv: reload pgbouncer: %v", err)
		}
	}
}

func (p *PGBouncerProc) writeConfig() {
	conf := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
auth_user = postgres
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = $1
admin_users = postgres
stats_users = postgres
pool_mode = transaction
max_client_conn = 200
default_pool_size = 20
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = %s
`, p.upstream, p.port, filepath.Join(p.dir, "userlist.txt"), filepath.Join(p.dir, "pgbouncer.log"))
	for name, text := range map[string]string{"pgbouncer.ini": conf, "userlist.txt": "\"postgres\" \"\"\n"} {
		if err := os.WriteFile(filepath.Join(p.dir, name), []byte(text), 0o644); err != nil {
			p.t.Fatalf("testenv: configure pgbouncer: %v", err)
		}
	}
}

// pgbouncerBin returns the pgbouncer program's path, or "": on PATH, else
// where Debian installs it (/usr/sbin, which a non-root PATH may lack), as
// scripts/services.d/pgbouncer.sh looks for it.
func pgbouncerBin() string {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if fi, err := os.Stat("/usr/sbin/pgbouncer"); err == nil && fi.Mode()&0o111 != 0 {
		return "/usr/sbin/pgbouncer"
	}
	return ""
}

// upstreamOf returns the "host=… port=…" connect string of the one server
// dsn names.
func upstreamOf(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse upstream dsn: %v", err)
	}
	if len(cfg.Fallbacks) > 0 {
		t.Fatalf("testenv: PgBouncer 1.18 cannot pick a primary among several hosts (%s): give it one server", redact(dsn))
	}
	return fmt.Sprintf("host=%s port=%d", cfg.Host, cfg.Port)
}

// schemaRole creates, on the server adminDSN names, a login superuser
// named like schema whose sessions start with schema as their search_path,
// and drops it, on the server dropDSN names then, when the test ends.
func schemaRole(t testing.TB, adminDSN, schema string, dropDSN func() string) {
	t.Helper()
	makeRole(t, adminDSN, schema, schema, dropDSN, "ALTER ROLE %[1]s SUPERUSER")
}

// AppRoleDSN returns dsn (a postgres:// URL to the test server, directly
// or through a pooler or proxy in front of it) as a login role of the
// test's own that may read and write the tables schema holds now but may
// not create objects in it (no superuser, no CREATE on the schema), as an
// application's role in production often is. Its sessions start with
// schema as their search_path. Call it once per schema; the role is
// dropped when the test ends.
func AppRoleDSN(t testing.TB, dsn, schema string) string {
	t.Helper()
	role := schema + "_app"
	admin := PostgresDSN(t)
	makeRole(t, admin, role, schema, func() string { return admin },
		"GRANT USAGE ON SCHEMA %[2]s TO %[1]s",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %[2]s TO %[1]s")
	return roleDSN(t, dsn, role)
}

// makeRole creates, on the server adminDSN names, a login role whose
// sessions start with schema as their search_path, then runs each of stmts
// (formatted with the role and the schema, quoted). Once created, the role
// is dropped when the test ends, on the server dropDSN names then, even if
// a later statement fails.
func makeRole(t testing.TB, adminDSN, role, schema string, dropDSN func() string, stmts ...string) {
	t.Helper()
	if len(role) > 63 {
		t.Fatalf("testenv: role name %q is longer than PostgreSQL's 63 bytes", role)
	}
	r, sc := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
	defer cancel()
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("testenv: connect to create role %s: %v", role, err)
	}
	defer conn.Close(ctx)
	run := func(q string) {
		q = fmt.Sprintf(q, r, sc)
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("testenv: %s: %v", q, err)
		}
	}
	run("CREATE ROLE %[1]s LOGIN")
	t.Cleanup(func() { dropRole(t, dropDSN(), role) })
	run("ALTER ROLE %[1]s SET search_path = %[2]s")
	for _, q := range stmts {
		run(q)
	}
}

// dropRole ends the role's sessions (a pooler's idle server connections),
// gives what it owns to the current user, and drops it.
func dropRole(t testing.TB, adminDSN, name string) {
	role := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
	defer cancel()
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Logf("testenv: drop role %s: %v (the server may be gone)", name, err)
		return
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		"ALTER ROLE " + role + " NOLOGIN",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1",
		"REASSIGN OWNED BY " + role + " TO CURRENT_USER",
		"DROP OWNED BY " + role,
		"DROP ROLE " + role,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, name)
		}
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Errorf("testenv: %s: %v", q, err)
			return
		}
	}
}

// roleDSN returns dsn with user and application_name set to role.
func roleDSN(t testing.TB, dsn, role string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("testenv: want a postgres:// URL, got %q (%v)", redact(dsn), err)
	}
	u.User = url.User(role)
	q := u.Query()
	q.Set("application_name", role)
	u.RawQuery = q.Encode()
	return u.String()
}

// redact returns dsn without its password, for messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return dsn
}

// privatePorts is the first port of the range (up to 32767) that the
// servers of the tests' own listen on: above every test bed's services
// (scripts/services keeps them below it) and below Linux's ephemeral
// range (32768 and up), from which outgoing connections take their local
// ports.
const privatePorts = 30000

// freePort returns a loopback port of the private range nothing listens
// on, and holds it (listening) until unhold, called just before the
// server that is to listen on it starts, so that no other test, in this
// process or another, picks it meanwhile. Outside the ephemeral range, a
// server that restarts on its port (after a crash, in a failover) finds
// it free: an ephemeral one may meanwhile be some connection's.
func freePort(t testing.TB) int {
	t.Helper()
	for range 200 {
		port := privatePorts + rand.IntN(32768-privatePorts)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // another test's server
		}
		held.Store(port, ln)
		t.Cleanup(func() { unhold(port) })
		return port
	}
	t.Fatalf("testenv: no free port from %d to 32767", privatePorts)
	return 0
}

// held maps the ports freePort holds to their listeners.
var held sync.Map

// unhold lets go of port, if freePort holds it, for the server that is to
// listen on it.
func unhold(port int) {
	if ln, ok := held.LoadAndDelete(port); ok {
		ln.(net.Listener).Close()
	}
}

// ownedTempDir makes a directory, removed when the test ends, that the
// postgres user owns when the tests run as root, for servers that run as
// that user.
func ownedTempDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: running as root, and no postgres user to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// RefusedEndpoint returns an http://127.0.0.1 endpoint whose dials are
// refused until the test ends: a request that was never sent. Its port is
// bound by a socket that never listens, so no server of this or another
// process can take it meanwhile.
func RefusedEndpoint(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("testenv: refused endpoint: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("testenv: refused endpoint: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("testenv: refused endpoint: %v", err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// PostgresVia is Postgres reached by dep: "direct", or "pgbouncer" for
// PgBouncer in transaction pooling with pgx in its exec mode (the mode a
// pooler needs without prepared-statement support). Its pool has maxConns
// connections (0 means pgxpool's default) on a fresh schema.
func PostgresVia(t testing.TB, dep string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool, schema := PostgresSchema(t, maxConns)
	switch dep {
	case "direct":
		return pool
	case "pgbouncer":
		return PoolMode(t, PgBouncerDSNFor(t, schema), pgx.QueryExecModeExec, maxConns)
	}
	t.Fatalf("testenv: PostgresVia: unknown deployment %q", dep)
	return nil
}
