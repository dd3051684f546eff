package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/services"
)

// PGPair is a PostgreSQL primary with a synchronous standby, of the test's
// own, for failover tests: a COMMIT on the primary returns only once the
// standby has flushed its WAL (synchronous_commit = on, the standby named
// in synchronous_standby_names), so what a commit acknowledged survives
// the primary's death and the standby's promotion. The standby streams
// through a physical replication slot, was made by pg_basebackup -R, and
// never times out its primary (wal_receiver_timeout = 0), so a stall lasts
// as long as the test keeps it. Both servers are PGServers (Debian
// binaries, free loopback ports, removed when the test ends).
//
// Its methods are for the test's goroutine; DSN, PrimaryDSN, StandbyDSN
// and DSNFor may also be called from others.
type PGPair struct {
	t     testing.TB
	nodes [2]*PGServer

	mu      sync.Mutex
	primary int // index of the node that is the primary
	standby int // index of the synchronous standby, -1 when there is none
	dead    [2]bool
	stalled int // pid of the stopped walsender, 0 when none

	handedOut bool // DSN may be in use: ports are fixed
}

// PostgresPair starts a PGPair and returns once the standby is streaming
// and reported as synchronous by the primary (pg_stat_replication.sync_state
// = 'sync'). Without PostgreSQL's server binaries the test fails under CI
// (and scripts/test) and skips otherwise, as for a missing service.
func PostgresPair(t testing.TB) *PGPair {
	t.Helper()
	p := &PGPair{t: t, standby: -1}
	p.nodes[0] = PostgresServer(t)
	p.nodes[1] = &PGServer{t: t, bin: p.nodes[0].bin, dir: ownedTempDir(t, "nolock-pg-"), port: freePort(t)}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stalled != 0 {
			_ = syscall.Kill(p.stalled, syscall.SIGCONT)
			p.stalled = 0
		}
		for i, n := range p.nodes {
			if !p.dead[i] {
				_ = n.command("pg_ctl", "-D", n.data(), "stop", "-m", "immediate").Run()
			}
		}
	})
	p.addStandby(1)
	p.handedOut = true
	return p
}

// DSN returns a multi-host DSN naming both servers, primary first, with
// target_session_attrs=read-write: a client connects to whichever accepts
// writes, so after a failover a new connection reaches the promoted
// standby. The host order never changes.
func (p *PGPair) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		p.nodes[0].port, p.nodes[1].port)
}

// DSNFor returns DSN with search_path and application_name set to schema,
// like PostgresDSNFor.
func (p *PGPair) DSNFor(schema string) string {
	dsn, err := services.WithSearchPath(p.DSN(), schema)
	if err != nil {
		p.t.Errorf("testenv: %v", err)
	}
	return dsn
}

// CreateSchema creates a schema with a fresh name on the primary and
// returns its name, for DSNFor. It is not dropped: the pair is.
func (p *PGPair) CreateSchema() string {
	p.t.Helper()
	schema := Name("t")
	if err := p.exec(p.PrimaryDSN(), "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		p.t.Fatalf("testenv: create schema: %v", err)
	}
	return schema
}

// PrimaryDSN returns the DSN of the server that is primary now: the
// promoted standby after Promote.
func (p *PGPair) PrimaryDSN() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[p.primary].DSN()
}

// StandbyDSN returns the DSN of the standby, or "" when there is none
// (after Promote, until Rebuild).
func (p *PGPair) StandbyDSN() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.standby < 0 {
		return ""
	}
	return p.nodes[p.standby].DSN()
}

// StallStandby stops (SIGSTOP) the primary's walsender for the standby:
// from then on no WAL reaches the standby, so every COMMIT that writes
// waits for synchronous replication (pg_stat_activity shows wait_event
// SyncRep) while being already durable, and visible, on the primary alone.
// ResumeStandby lets the waits finish; KillPrimary instead loses those
// commits on the standby for good. Stopping the primary's side, not the
// standby's walreceiver, keeps the standby responsive, so it can be
// promoted while the stall lasts, and guarantees that nothing written
// during the stall was sent.
func (p *PGPair) StallStandby() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.standby < 0 || p.stalled != 0 {
		p.t.Fatal("testenv: StallStandby needs a streaming standby that is not stalled")
	}
	var pid int
	err := p.queryRow(p.nodes[p.primary].DSN(), "SELECT pid FROM pg_stat_replication WHERE application_name = $1",
		[]any{nodeName(p.standby)}, &pid)
	if err != nil {
		p.t.Fatalf("testenv: find the walsender: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		p.t.Fatalf("testenv: stop the walsender: %v", err)
	}
	p.stalled = pid
	Until(p.t, "the walsender is stopped", func() (bool, error) { return procState(pid) == 'T', nil })
}

// ResumeStandby continues (SIGCONT) the walsender StallStandby stopped:
// it sends the WAL written meanwhile, and the commits waiting for it
// return once the standby has flushed it.
func (p *PGPair) ResumeStandby() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled == 0 {
		p.t.Fatal("testenv: ResumeStandby without StallStandby")
	}
	if err := syscall.Kill(p.stalled, syscall.SIGCONT); err != nil {
		p.t.Fatalf("testenv: continue the walsender: %v", err)
	}
	p.stalled = 0
}

// KillPrimary kills every process of the primary with SIGKILL, as a
// machine's crash would: no shutdown checkpoint, no
// WAL sent after the kill (a stalled walsender dies stopped), clients'
// connections break. It returns once they are all gone. The old primary
// stays down for the rest of the test unless Rebuild makes it a standby.
func (p *PGPair) KillPrimary() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.nodes[p.primary]
	pm, lines, err := postmaster(n.data())
	if err != nil {
		p.t.Fatalf("testenv: the primary: %v", err)
	}
	// Stopped first, the postmaster starts no child while they are listed.
	stopAll(p.t, []int{pm})
	procs := append([]int{pm}, children(pm)...)
	for _, pid := range procs {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.stalled = 0
	p.dead[p.primary] = true
	Until(p.t, "the primary's processes are gone", func() (bool, error) {
		for _, pid := range procs {
			if s := procState(pid); s != 0 && s != 'Z' {
				return false, nil
			}
		}
		return true, nil
	})
	// A stale pid file would let pg_ctl (the cleanup's stop) signal
	// whatever process reuses the pid.
	_ = os.Remove(filepath.Join(n.data(), "postmaster.pid"))
	// A killed postmaster stays a zombie until reaped, and the socket's lock
	// file names it: a server started on the same port and socket directory
	// (Rebuild) would take it for a live postmaster and refuse to start.
	// Lines 4 and 5 of the pid file: port and socket directory.
	if len(lines) > 4 {
		_ = os.Remove(filepath.Join(strings.TrimSpace(lines[4]), ".s.PGSQL."+strings.TrimSpace(lines[3])+".lock"))
	}
	// The postmaster's small System V segment outlives a SIGKILL; remove
	// it (line 7: key and id) so repeated crashes leak nothing.
	if len(lines) > 6 {
		if f := strings.Fields(lines[6]); len(f) == 2 {
			if id, err := strconv.Atoi(f[1]); err == nil {
				_, _, _ = syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), 0 /* IPC_RMID */, 0)
			}
		}
	}
}

// Promote promotes the standby (pg_ctl promote) and returns once it
// accepts writes (pg_is_in_recovery() is false); from then on it is the
// primary, without a standby (commits wait for no one), and PrimaryDSN
// names it. Promoting while the old primary still runs makes two
// primaries: call KillPrimary first to model a failover.
func (p *PGPair) Promote() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.standby < 0 {
		p.t.Fatal("testenv: Promote without a standby")
	}
	n := p.nodes[p.standby]
	n.pgctl("promote", "-w", "-t", "60")
	Until(p.t, "the promoted standby accepts writes", func() (bool, error) {
		var recovering bool
		err := p.queryRow(n.DSN(), "SELECT pg_is_in_recovery()", nil, &recovering)
		return err == nil && !recovering, nil
	})
	p.primary, p.standby = p.standby, -1
}

// Rebuild makes the killed old primary a new synchronous standby of the
// current primary: its data is replaced by a fresh pg_basebackup (no
// rewind), and Rebuild returns once it is in sync, as PostgresPair does.
func (p *PGPair) Rebuild() {
	p.t.Helper()
	p.mu.Lock()
	old := 1 - p.primary
	ok := p.standby < 0 && p.dead[old]
	p.mu.Unlock()
	if !ok {
		p.t.Fatal("testenv: Rebuild needs a killed old primary and a promoted standby")
	}
	if err := os.RemoveAll(p.nodes[old].data()); err != nil {
		p.t.Fatalf("testenv: remove the old primary's data: %v", err)
	}
	p.addStandby(old)
}

// WaitSync returns once the primary reports the standby as streaming and
// synchronous (pg_stat_replication.sync_state = 'sync').
func (p *PGPair) WaitSync() {
	p.t.Helper()
	p.mu.Lock()
	primary, standby := p.nodes[p.primary].DSN(), p.standby
	p.mu.Unlock()
	if standby < 0 {
		p.t.Fatal("testenv: WaitSync without a standby")
	}
	Until(p.t, nodeName(standby)+" is a streaming synchronous standby", func() (bool, error) {
		var state string
		err := p.queryRow(primary, "SELECT state || '/' || sync_state FROM pg_stat_replication WHERE application_name = $1",
			[]any{nodeName(standby)}, &state)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return state == "streaming/sync", err
	})
}

// addStandby makes node i a standby of the primary, starts it, names it in
// the primary's synchronous_standby_names and waits until it is in sync.
// The name is set on the primary only after the base backup, so a
// standby's configuration never names one: once promoted, its commits
// wait for no standby.
func (p *PGPair) addStandby(i int) {
	p.t.Helper()
	p.mu.Lock()
	from := p.nodes[p.primary]
	p.mu.Unlock()
	n, name := p.nodes[i], nodeName(i)
	if err := p.exec(from.DSN(), "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"+name+"'"); err != nil {
		p.t.Fatalf("testenv: drop an old slot: %v", err)
	}
	n.run("pg_basebackup", "-D", n.data(), "-h", "127.0.0.1", "-p", strconv.Itoa(from.port), "-U", "postgres",
		"-R", "-C", "-S", name, "-X", "stream", "-c", "fast", "--no-sync")
	// Later lines win: these replace the copied primary's port and socket.
	conf := fmt.Sprintf(`
port = %d
unix_socket_directories = '%s'
cluster_name = '%s'
hot_standby = on
wal_receiver_timeout = 0
`, n.port, n.dir, name)
	p.appendConf(i, conf)
	p.start(i)
	p.mu.Lock()
	p.standby, p.dead[i] = i, false
	p.mu.Unlock()
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '" + name + "'", "SELECT pg_reload_conf()"} {
		if err := p.exec(from.DSN(), q); err != nil {
			p.t.Fatalf("testenv: %s: %v", q, err)
		}
	}
	p.WaitSync()
}

// start starts node i and waits until it accepts connections. Its port
// was free when chosen but may have been taken since (a client's outgoing
// connection, another test's server): before the pair is handed out, the
// standby then moves to another port; later, the test fails, with the
// server's log.
func (p *PGPair) start(i int) {
	p.t.Helper()
	n := p.nodes[i]
	log := filepath.Join(n.dir, "log")
	for attempt := 0; ; attempt++ {
		unhold(n.port)
		out, err := n.command("pg_ctl", "-D", n.data(), "start", "-w", "-t", "60", "-l", log).CombinedOutput()
		if err == nil {
			prioritisePostgres(n.data())
			return
		}
		text, _ := os.ReadFile(log)
		if p.handedOut || attempt == 3 || !strings.Contains(string(text), "could not bind") {
			p.t.Fatalf("testenv: start %s: %v\n%s\n%s", nodeName(i), err, out, text)
		}
		n.port = freePort(p.t)
		p.appendConf(i, fmt.Sprintf("port = %d\n", n.port))
	}
}

// appendConf appends text to node i's postgresql.conf: later lines win.
func (p *PGPair) appendConf(i int, text string) {
	p.t.Helper()
	f, err := os.OpenFile(filepath.Join(p.nodes[i].data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(text)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		p.t.Fatalf("testenv: configure %s: %v", nodeName(i), err)
	}
}

// nodeName is node i's cluster_name, which its walreceiver reports as its
// application_name to the primary.
func nodeName(i int) string { return "node" + strconv.Itoa(i) }

func (p *PGPair) exec(dsn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func (p *PGPair) queryRow(dsn, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// procState returns the state letter of process pid (R, S, T, Z, ...), or
// 0 when there is no such process.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2]
	}
	return 0
}

// children returns the pids of pid's child processes.
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		// After ")": state, then ppid.
		if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}
