package deploytest

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/testenv"
)

// wire is one group's way to the database: a testenv.Proxy in front of
// PostgreSQL whose server-to-client stream passes through the current
// cell's testenv.ReplyDroppers, in series; for the PgBouncer deployment, a
// PgBouncer of the group's own in front of that proxy (so a dropped reply
// is lost between PgBouncer and the server, and PgBouncer answers the
// client itself); and a breaker on the client's own connections. A
// connection through the proxy keeps the droppers current when it opened;
// each cell opens its own (see cell), so a group's cells run one after
// another.
type wire struct {
	admin   *pgxpool.Pool // straight to the server, no fault
	schema  string        // the group's
	dsn     string        // what clients dial
	bouncer *pgx.Conn     // the PgBouncer's admin console, or nil
	drops   atomic.Pointer[map[string]*testenv.ReplyDropper]
	trig    atomic.Pointer[trigger]
	brk     breaker
}

// trigger arms a dropper when the client sends a piece of text.
type trigger struct {
	text []byte
	drop *testenv.ReplyDropper
}

// newWire makes a fresh schema and the way to it for deployment dep
// ("direct" or "pgbouncer").
func newWire(t *testing.T, dep string) *wire {
	t.Helper()
	admin, schema := testenv.PostgresSchema(t, 4)
	w := &wire{admin: admin, schema: schema}
	w.drops.Store(&map[string]*testenv.ReplyDropper{})
	switch dep {
	case "direct":
		w.dsn = testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), w.send, w.relay)
	case "pgbouncer":
		testenv.PgBouncerDSN(t) // skips or fails, naming scripts/services, without the service
		pgb := testenv.PgBouncerServer(t, testenv.Proxy(t, testenv.PostgresDSN(t), w.send, w.relay))
		w.dsn = pgb.DSNFor(schema)
		u, err := url.Parse(pgb.DSN())
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/pgbouncer"
		u.RawQuery = "sslmode=disable&default_query_exec_mode=simple_protocol"
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
		defer cancel()
		if w.bouncer, err = pgx.Connect(ctx, u.String()); err != nil {
			t.Fatalf("PgBouncer's admin console: %v", err)
		}
		t.Cleanup(func() { w.bouncer.Close(context.Background()) })
	default:
		t.Fatalf("unknown deployment %q", dep)
	}
	return w
}

// cell gives the next cell fresh droppers for tags, and makes sure no
// connection through the proxy carries an earlier cell's: the earlier
// cells' client pools have closed, and PgBouncer is told to close its
// server connections (RECONNECT closes each once released; between cells
// none is in use), so every connection the cell uses opens after this.
func (w *wire) cell(t *testing.T, tags ...string) map[string]*testenv.ReplyDropper {
	t.Helper()
	drops := map[string]*testenv.ReplyDropper{}
	for _, tag := range tags {
		drops[tag] = testenv.DropReply(tag)
	}
	w.drops.Store(&drops)
	if w.bouncer != nil {
		if _, err := w.bouncer.Exec(context.Background(), "RECONNECT"); err != nil {
			t.Fatalf("PgBouncer RECONNECT: %v", err)
		}
	}
	return drops
}

// armOn arms d when the client next sends text (in one chunk, as pgx
// writes a message): d then drops the reply to the statement that text
// belongs to, not to one sent before it.
func (w *wire) armOn(text string, d *testenv.ReplyDropper) {
	w.trig.Store(&trigger{[]byte(text), d})
}

// send passes what the client sends to the server, and fires the trigger.
func (w *wire) send(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if tr := w.trig.Load(); tr != nil && bytes.Contains(buf[:n], tr.text) && w.trig.CompareAndSwap(tr, nil) {
				tr.drop.Arm()
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// relay passes the server's messages through the droppers current when
// the connection opened, in turn.
func (w *wire) relay(dst io.Writer, src io.Reader) {
	drops := *w.drops.Load()
	tags := make([]string, 0, len(drops))
	for tag := range drops {
		tags = append(tags, tag)
	}
	slices.Sort(tags)
	if len(tags) == 0 {
		_, _ = io.Copy(dst, src)
		return
	}
	var wg sync.WaitGroup
	var pipes []*io.PipeReader
	r := src
	for _, tag := range tags[:len(tags)-1] {
		pr, pw := io.Pipe()
		pipes = append(pipes, pr)
		wg.Add(1)
		go func(d *testenv.ReplyDropper, from io.Reader) {
			defer wg.Done()
			d.Relay(pw, from)
			pw.Close()
		}(drops[tag], r)
		r = pr
	}
	drops[tags[len(tags)-1]].Relay(dst, r)
	// The last dropper has ended (it dropped, or a side closed): end the
	// others, which may wait on the server.
	for _, pr := range pipes {
		pr.Close()
	}
	if c, ok := src.(io.Closer); ok {
		c.Close()
	}
	wg.Wait()
}

// pool opens a pool of one connection in mode on the group's DSN, closed
// when the test ends. Its connections go through the breaker.
func (w *wire) pool(t *testing.T, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = 1
	cfg.ConnConfig.DialFunc = w.brk.dial
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// breaker breaks a client connection as the client writes to it: once
// armed with a piece of text, the next write that carries it fails having
// written nothing, as a write to a connection the kernel knows is reset
// does (EPIPE), and the connection closes. Nothing of that write reaches
// the server or pooler.
type breaker struct {
	marker atomic.Pointer[[]byte]
	broken atomic.Int64
}

// arm makes the next write carrying text fail.
func (b *breaker) arm(text string) {
	m := []byte(text)
	b.marker.Store(&m)
}

// disarm forgets an armed text that was never written.
func (b *breaker) disarm() { b.marker.Store(nil) }

func (b *breaker) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &breakingConn{Conn: c, b: b}, nil
}

type breakingConn struct {
	net.Conn
	b *breaker
}

func (c *breakingConn) Write(p []byte) (int, error) {
	if m := c.b.marker.Load(); m != nil && bytes.Contains(p, *m) && c.b.marker.CompareAndSwap(m, nil) {
		c.b.broken.Add(1)
		c.Conn.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Addr: c.RemoteAddr(), Err: syscall.EPIPE}
	}
	return c.Conn.Write(p)
}
