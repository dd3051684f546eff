// Package leaderjob is a leader-only job on PostgreSQL with package lease,
// the story `nolock demo` tells (-run 'leader-only job');
// examples/leaderservice is the service to copy.
//
// Replicas of an invoicing service each try to become the leader of the
// "invoicing" job. The leader reads the job's cursor once, then sends one
// page of invoices after another from its own count, as real jobs do, each
// page a statement fenced by its lock (lease.Client.FenceSQL): the page is
// recorded only while the lock is held with the leader's token.
//
// The first leader's connection to the database freezes mid-job (a stopped
// VM, a long GC pause, a network that holds its packets: here a proxy in
// front of its pool stops forwarding) for longer than its lease. Its lease
// runs out on the database's clock, another replica takes the lock with a
// higher token, reads the cursor and carries on. When the freeze ends, the
// first leader's page statement, sent before the freeze with its old
// token, reaches the database: the fence refuses it, the leader learns it
// lost the lock (Lost, LostError) and stops. Every page is recorded once,
// in order. Without the fence the late statement would record a page the
// new leader has already sent: an invoice sent twice.
package leaderjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/observe"
)

// Config is where and how the story runs.
type Config struct {
	DSN      string           // PostgreSQL; the story's tables are made and dropped in its search_path
	Replicas int              // replicas competing for the job, at least 2
	Pages    int              // pages of invoices to send
	Lease    time.Duration    // the lock's lease
	Out      io.Writer        // the transcript
	Observer observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured.
type Report struct {
	Pages      int     // pages recorded
	Duplicates int     // pages recorded more than once (0 unless the fence failed)
	Leaders    []int64 // the token of every leadership, in order
	Refused    int     // late page statements the fence refused
}

const key = "invoicing"

// Run tells the story and returns its report, or an error if the job was
// not done exactly once.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Replicas < 2 || cfg.Pages < 1 || cfg.Lease <= 0 || cfg.Out == nil {
		return Report{}, errors.New("leaderjob: need 2 or more replicas, 1 or more pages, a lease and an Out")
	}
	admin, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return Report{}, err
	}
	defer admin.Close()
	table := fmt.Sprintf("leaderjob_locks_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s_pages (page int NOT NULL, sent_by text NOT NULL, token bigint NOT NULL);
CREATE TABLE %[1]s_cursor (job text PRIMARY KEY, next_page int NOT NULL);
INSERT INTO %[1]s_cursor VALUES ('invoicing', 0)`, table)); err != nil {
		return Report{}, err
	}
	defer admin.Exec(context.WithoutCancel(ctx), fmt.Sprintf(`DROP TABLE %[1]s, %[1]s_pages, %[1]s_cursor`, table))

	cc := admin.Config().ConnConfig
	proxy, err := newFreezer(fmt.Sprintf("%s:%d", cc.Host, cc.Port))
	if err != nil {
		return Report{}, err
	}
	defer proxy.Close()
	s := &story{cfg: cfg, table: table, admin: admin, proxy: proxy}
	return s.run(ctx)
}

// story is one run of the job among the replicas.
type story struct {
	cfg   Config
	table string
	admin *pgxpool.Pool
	proxy *freezer

	mu     sync.Mutex // guards report and writes to cfg.Out
	report Report
}

// say writes a line of the transcript; replicas narrate from their own
// goroutines, one line at a time.
func (s *story) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.cfg.Out, format, args...)
}

// replica is one replica's lock client and its own pool.
type replica struct {
	n     int
	locks *lease.Client
	pool  *pgxpool.Pool
}

func (s *story) run(ctx context.Context) (Report, error) {
	replicas := make([]replica, s.cfg.Replicas)
	for i := range replicas {
		cfg, err := pgxpool.ParseConfig(s.cfg.DSN)
		if err != nil {
			return Report{}, err
		}
		if i == 0 { // the first leader reaches the database through the proxy
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = s.proxy.Host(), s.proxy.Port()
			cfg.ConnConfig.Fallbacks = nil
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return Report{}, err
		}
		defer pool.Close()
		c, err := lease.New(pool, lease.WithTable(s.table), lease.WithLease(s.cfg.Lease), lease.WithOwner(fmt.Sprint("replica-", i+1)),
			lease.WithObserver(s.cfg.Observer))
		if err != nil {
			return Report{}, err
		}
		defer c.Close()
		if i == 0 {
			if err := c.CreateSchema(ctx); err != nil {
				return Report{}, err
			}
		}
		replicas[i] = replica{i + 1, c, pool}
	}
	// replica-1 leads first: the others start once it holds the lock.
	first, err := replicas[0].locks.Acquire(ctx, key)
	if err != nil {
		return Report{}, err
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(replicas))
	wg.Go(func() { errs <- s.lead(ctx, replicas[0], first) })
	for _, r := range replicas[1:] {
		wg.Go(func() { errs <- s.compete(ctx, r) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return s.report, err
		}
	}
	return s.check(ctx)
}

// compete tries for the lock until the job is done, and leads when it
// gets it.
func (s *story) compete(ctx context.Context, r replica) error {
	for !s.done(ctx) {
		l, err := r.locks.Acquire(ctx, key, lease.WithWait(s.cfg.Lease))
		if errors.Is(err, lease.ErrNotAcquired) {
			continue
		}
		if err != nil {
			return err
		}
		if err := s.lead(ctx, r, l); err != nil {
			return err
		}
	}
	return nil
}

// lead runs the job as leader from the stored cursor, one fenced page
// statement at a time, until the job is done or the lock is lost.
func (s *story) lead(ctx context.Context, r replica, l *lease.Lock) error {
	defer l.Close()
	s.mu.Lock()
	s.report.Leaders = append(s.report.Leaders, l.Token())
	s.mu.Unlock()
	var next int
	if err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT next_page FROM %s_cursor`, s.table)).Scan(&next); err != nil {
		return err
	}
	if next >= s.cfg.Pages {
		return nil // the job is done
	}
	s.say("   replica-%d leads with token %d from page %d\n", r.n, l.Token(), next)
	// One statement: the page and the cursor are recorded only while the
	// lock is held with this token (the fence row is locked until commit).
	send := fmt.Sprintf(`WITH fence AS (SELECT WHERE %[2]s),
page AS (INSERT INTO %[1]s_pages SELECT $3, $4, $2 FROM fence RETURNING page)
UPDATE %[1]s_cursor SET next_page = $3 + 1 FROM page`, s.table, r.locks.FenceSQL(1, 2))
	sendPage := func(page int) (pgconn.CommandTag, error) {
		return r.pool.Exec(ctx, send, key, l.Token(), page, fmt.Sprint("replica-", r.n))
	}
	for page := next; page < s.cfg.Pages; page++ {
		if r.n == 1 && page == s.cfg.Pages/3 {
			return s.freeze(ctx, l, page, sendPage)
		}
		tag, err := sendPage(page)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			s.say("   replica-%d: page %d refused by the fence: the lock was lost (%v)\n", r.n, page, l.Err())
			return nil
		}
	}
	return nil
}

// freeze sends page's statement while the leader's connection is frozen,
// and thaws it once another replica has taken over and recorded that page:
// the late statement then reaches the database with the old token.
func (s *story) freeze(ctx context.Context, l *lease.Lock, page int, sendPage func(int) (pgconn.CommandTag, error)) error {
	s.say("   replica-1 freezes as it sends page %d (lease %v)\n", page, s.cfg.Lease)
	s.proxy.Freeze()
	type answer struct {
		tag pgconn.CommandTag
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		tag, err := sendPage(page)
		answered <- answer{tag, err}
	}()
	err := s.waitRecorded(ctx, page)
	s.proxy.Thaw()
	a := <-answered
	switch {
	case err != nil:
		return err
	case a.err != nil:
		return a.err
	case a.tag.RowsAffected() != 0:
		return fmt.Errorf("leaderjob: the frozen leader's late page %d was recorded", page)
	}
	<-l.Lost()
	s.say("   replica-1 thaws: its late page %d (token %d) is refused by the fence; it has lost the lock (%v)\n", page, l.Token(), l.Err())
	s.mu.Lock()
	s.report.Refused++
	s.mu.Unlock()
	return nil
}

// waitRecorded returns once page is recorded (by a newer leader).
func (s *story) waitRecorded(ctx context.Context, page int) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := s.admin.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s_pages WHERE page = $1`, s.table), page).Scan(&n); err != nil || n > 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// done reports whether every page is recorded.
func (s *story) done(ctx context.Context) bool {
	var next int
	err := s.admin.QueryRow(ctx, fmt.Sprintf(`SELECT next_page FROM %s_cursor`, s.table)).Scan(&next)
	return err != nil || next >= s.cfg.Pages
}

// check counts the recorded pages: each exactly once.
func (s *story) check(ctx context.Context) (Report, error) {
	err := s.admin.QueryRow(ctx, fmt.Sprintf(`SELECT count(DISTINCT page), count(*) - count(DISTINCT page) FROM %s_pages`, s.table)).
		Scan(&s.report.Pages, &s.report.Duplicates)
	if err != nil {
		return s.report, err
	}
	if s.report.Pages != s.cfg.Pages || s.report.Duplicates != 0 || s.report.Refused != 1 {
		return s.report, fmt.Errorf("leaderjob: %d of %d pages recorded, %d twice, %d late pages refused; want all once and 1 refused",
			s.report.Pages, s.cfg.Pages, s.report.Duplicates, s.report.Refused)
	}
	return s.report, nil
}
