package cas_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). Under go test, TestMain points DATABASE_URL at a
// fresh schema on the test services (see testenv.ExampleMain), so the
// examples run and their Output is checked.

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
)

type Counter struct{ Views int }

// Ten concurrent increments of one record: each Update re-reads and
// retries on a version conflict, so none is lost.
func ExampleStore_Update() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	backend, _ := pgcas.NewBackend(pool)
	if err := backend.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	store, _ := cas.NewStore(backend, cas.JSON[Counter]{})
	defer store.Close()
	if err := store.Create(ctx, "page/home", Counter{}); err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := store.Update(ctx, "page/home", func(c Counter) (Counter, error) { c.Views++; return c, nil })
			if err != nil {
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()
	got, _ := store.Get(ctx, "page/home")
	fmt.Println("views:", got.Value.Views)
	// Output:
	// views: 10
}

type Doc struct{ Lines []string }

// A typed store of versioned records: Create, Update (read, apply, write
// at the version read, retried on a conflict), Get and a Delete at a
// version.
func ExampleNewStore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	run := func(ctx context.Context) error {
		backend, err := pgcas.NewBackend(pool) // pgcas.WithTable(name) for another table; or dynamocas.NewBackend(client, table)
		if err != nil {
			return err
		}
		if err := backend.CreateSchema(ctx); err != nil {
			return err
		}
		docs, err := cas.NewStore[Doc](backend, nil) // nil codec: JSON
		if err != nil {
			return err
		}
		defer docs.Close()
		if err := docs.Create(ctx, "doc-1", Doc{}); err != nil { // ErrExists if taken
			return err
		}
		v, err := docs.Update(ctx, "doc-1", func(d Doc) (Doc, error) {
			d.Lines = append(d.Lines, "hello")
			return d, nil
		})
		if err != nil {
			return err
		}
		fmt.Println(v.Value.Lines, "at version", v.Version)
		cur, err := docs.Get(ctx, "doc-1")
		if err != nil {
			return err
		}
		return docs.Delete(ctx, "doc-1", cur.Version) // ErrConflict if it moved on
	}
	fmt.Println(run(ctx))
	// Output:
	// [hello] at version 2
	// <nil>
}
