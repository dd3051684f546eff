// Package nightlycron is the background article's first case, the story
// `nolock demo` tells (-run 'nightly cron') and cmd/nightlycron runs:
// replicas of a service all fire the nightly report at 02:00, and a dynamolock lock makes one of
// them run it. Each replica calls TryAcquire on a key that names the
// date; the winner runs the job while its lock heartbeats, the others
// skip.
//
// The second night, the winner crashes mid-job (its process stops talking
// to DynamoDB). The other replicas keep trying every few hundred
// milliseconds until the report exists; one of them takes the lock over
// once it has seen the crashed holder's record version unchanged for a
// full lease of its own clock, and runs the report. Nothing compares the
// replicas' clocks.
//
// This is an efficiency lock: if two replicas ever ran, the report would
// overwrite a file named by the date, so a duplicate is harmless. The
// story counts the runs anyway: one per night.
package nightlycron

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/examples/localdynamo"
	"github.com/nolock/nolock/observe"
)

// Config is where and how the story runs.
type Config struct {
	DynamoDB *dynamodb.Client // the lock's table is made on it and deleted
	Replicas int              // replicas firing the job, at least 2
	Nights   int              // nights to run; on the second, the winner crashes
	Lease    time.Duration    // the lock's lease
	Job      time.Duration    // how long the report takes
	Out      io.Writer        // the transcript
	Observer observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured.
type Report struct {
	Nights  []Night
	Crashed string // the replica that crashed mid-job on the second night
}

// Night is one night's outcome.
type Night struct {
	Date      string
	WrittenBy string // the replica that wrote the report
	Runs      int    // reports written: the store creates one per night, so 1, or 0 if no replica ran the job
	Skipped   int    // attempts that found the lock held
}

// Run tells the story and returns its report, or an error if some
// night's report was not written exactly once.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.DynamoDB == nil || cfg.Replicas < 2 || cfg.Nights < 1 || cfg.Lease <= 0 || cfg.Job <= 0 || cfg.Out == nil {
		return Report{}, errors.New("nightlycron: need a DynamoDB client, 2 or more replicas, 1 or more nights, a lease, a job's duration and an Out")
	}
	db := cfg.DynamoDB
	table := fmt.Sprintf("nolock_cron_%d", time.Now().UnixNano())
	drop, err := localdynamo.CreateTable(ctx, db, table, "key") // dynamolock's default key name
	if err != nil {
		return Report{}, err
	}
	defer drop()

	// Each replica has its own client, as each would in its own process,
	// on a link to DynamoDB that is cut when it crashes.
	s := &story{cfg: cfg}
	clients := make([]*dynamolock.Client, cfg.Replicas)
	links := make([]*localdynamo.Link, cfg.Replicas)
	crashed := make([]atomic.Bool, cfg.Replicas)
	for i := range clients {
		links[i] = localdynamo.NewLink(db)
		c, err := dynamolock.New(links[i], table,
			dynamolock.WithLease(cfg.Lease), dynamolock.WithOwner(fmt.Sprintf("replica-%d", i+1)),
			dynamolock.WithObserver(cfg.Observer))
		if err != nil {
			return Report{}, err
		}
		defer c.Close()
		clients[i] = c
	}

	for night := 1; night <= cfg.Nights; night++ {
		n := &Night{Date: fmt.Sprintf("2026-10-%02d", 26+night)}
		crashNext := new(atomic.Bool) // on night 2, the first winner crashes
		crashNext.Store(night == 2)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, len(clients))
		for i, c := range clients {
			if crashed[i].Load() {
				continue // a crashed replica is gone for good
			}
			wg.Go(func() { errs <- s.replica(ctx, c, i, n, crashNext, &crashed[i], links[i], start) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return s.report, err
			}
		}
		fmt.Fprintf(cfg.Out, "   night %s: report written by %s, job ran %d time(s), %d attempts skipped (lock held)\n",
			n.Date, n.WrittenBy, n.Runs, n.Skipped)
		s.report.Nights = append(s.report.Nights, *n)
	}
	for _, n := range s.report.Nights {
		if n.Runs != 1 {
			return s.report, fmt.Errorf("nightlycron: night %s: report written %d times, want 1", n.Date, n.Runs)
		}
	}
	return s.report, nil
}

// story is one run of the nights among the replicas.
type story struct {
	cfg    Config
	mu     sync.Mutex // guards report, the current Night and writes to cfg.Out
	report Report
}

// replica is one replica's 02:00 timer: try the lock named by the date;
// retry while no report exists, so a crashed winner is replaced.
func (s *story) replica(ctx context.Context, c *dynamolock.Client, i int, n *Night, crashNext, crashed *atomic.Bool, link *localdynamo.Link, start time.Time) error {
	name := fmt.Sprintf("replica-%d", i+1)
	for time.Since(start) < 3*s.cfg.Lease && !s.written(n) {
		l, err := c.TryAcquire(ctx, "nightly-report/"+n.Date, dynamolock.WithMaxHold(time.Minute))
		var held *dynamolock.HeldError
		switch {
		case errors.As(err, &held):
			s.mu.Lock()
			n.Skipped++
			s.mu.Unlock()
			time.Sleep(300 * time.Millisecond)
			continue
		case err != nil:
			return fmt.Errorf("%s: %w", name, err)
		}
		if s.written(n) {
			// A replica that fired late takes the lock after the writer
			// released it: the report, checked under the lock, is done.
			s.say("     %s took the lock (token %d) after %v; the report exists: nothing to do\n", name, l.Token(), time.Since(start).Round(10*time.Millisecond))
			return l.Release(ctx)
		}
		s.say("     %s took the lock (token %d) after %v; running the report\n", name, l.Token(), time.Since(start).Round(10*time.Millisecond))
		if crashNext.CompareAndSwap(true, false) {
			crashed.Store(true) // dies mid-job: no report, no release, no more heartbeats
			link.Cut(true)
			s.mu.Lock()
			s.report.Crashed = name
			s.mu.Unlock()
			s.say("     %s crashed mid-job\n", name)
			<-l.Lost() // its heartbeat goroutine notices, one lease later
			return nil
		}
		select {
		case <-time.After(s.cfg.Job):
			// The report store creates a night's report once (a
			// conditional create): a holder that lost the lock mid-job
			// without noticing yet cannot write a second one.
			s.mu.Lock()
			first := n.WrittenBy == ""
			if first {
				n.WrittenBy = name
				n.Runs++
			}
			s.mu.Unlock()
			if first {
				s.say("     %s wrote report-%s.csv\n", name, n.Date)
			} else {
				s.say("     %s finished late: report-%s.csv exists, its write refused\n", name, n.Date)
			}
			return l.Release(ctx)
		case <-l.Lost():
			s.say("     %s lost the lock mid-job: %v\n", name, l.Err())
			_ = l.Release(ctx) // says it was lost
			return nil
		}
	}
	return nil
}

// say writes a line of the transcript, one replica at a time.
func (s *story) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.cfg.Out, format, args...)
}

// written reports whether night n's report exists.
func (s *story) written(n *Night) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return n.Runs > 0
}
