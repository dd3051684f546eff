// Command editors has many editors append to one shared document at once,
// first with a naive read-then-write (last writer wins), then with
// cas.Store. The naive way loses edits; compare-and-set loses none.
//
//	go run ./examples/editors -postgres postgres://… [-editors 16] [-edits 25]
//
// The DSN defaults to $DATABASE_URL.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/observe"
)

// Doc is the shared document.
type Doc struct {
	Lines []string `json:"lines"`
}

func main() {
	dsn := flag.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
	editors := flag.Int("editors", 16, "concurrent editors")
	edits := flag.Int("edits", 25, "lines each editor appends")
	flag.Parse()
	if err := run(context.Background(), *dsn, *editors, *edits); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string, editors, edits int) error {
	if dsn == "" {
		return errors.New("no -postgres and no DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	backend, err := pgcas.NewBackend(pool)
	if err != nil {
		return err
	}
	if err := backend.CreateSchema(ctx); err != nil {
		return err
	}
	var conflicts atomic.Int64
	store, err := cas.NewStore[Doc](backend, nil, cas.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
		if e.Name == cas.EventConflict {
			conflicts.Add(1)
		}
	})))
	if err != nil {
		return err
	}
	defer store.Close()
	want := editors * edits

	// Naive: read the document, append, write it back whatever happened
	// in between. Concurrent editors overwrite each other's lines.
	naive := fmt.Sprintf("naive-%d", time.Now().UnixNano())
	if err := store.Create(ctx, naive, Doc{}); err != nil {
		return err
	}
	if err := each(editors, edits, func(e, i int) error {
		cur, err := store.Get(ctx, naive)
		if err != nil {
			return err
		}
		cur.Value.Lines = append(cur.Value.Lines, fmt.Sprintf("editor %d line %d", e, i))
		b, _ := cas.JSON[Doc]{}.Encode(cur.Value)
		_, v, err := backend.Get(ctx, naive) // last writer wins: write at whatever version is there now
		if err != nil {
			return err
		}
		_, err = backend.Put(ctx, naive, b, v)
		if errors.Is(err, cas.ErrConflict) {
			return nil // lost the race by a hair; a naive writer would not even notice
		}
		return err
	}); err != nil {
		return err
	}
	got, err := store.Get(ctx, naive)
	if err != nil {
		return err
	}
	fmt.Printf("read-then-write: %d of %d lines survived (%d lost)\n", len(got.Value.Lines), want, want-len(got.Value.Lines))

	// Compare-and-set: the write applies only at the version read; a
	// conflict re-runs the edit on a fresh read. Concurrent edits of the
	// document in this process are combined into one write.
	doc := fmt.Sprintf("cas-%d", time.Now().UnixNano())
	if err := store.Create(ctx, doc, Doc{}); err != nil {
		return err
	}
	start := time.Now()
	if err := each(editors, edits, func(e, i int) error {
		_, err := store.Update(ctx, doc, func(d Doc) (Doc, error) {
			d.Lines = append(d.Lines, fmt.Sprintf("editor %d line %d", e, i))
			return d, nil
		})
		return err
	}); err != nil {
		return err
	}
	got, err = store.Get(ctx, doc)
	if err != nil {
		return err
	}
	store.Close() // the observer has had every event
	fmt.Printf("compare-and-set: %d of %d lines survived in %v (%d writes, %d conflicts)\n",
		len(got.Value.Lines), want, time.Since(start).Round(time.Millisecond), got.Version-1, conflicts.Load())
	if len(got.Value.Lines) != want {
		return fmt.Errorf("compare-and-set lost %d lines", want-len(got.Value.Lines))
	}
	return nil
}

// each runs f for every (editor, edit) with one goroutine per editor and
// returns the first error.
func each(editors, edits int, f func(e, i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, editors)
	for e := 0; e < editors; e++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < edits && errs[e] == nil; i++ {
				errs[e] = f(e, i)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
