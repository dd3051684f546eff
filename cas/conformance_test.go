package cas_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// backends returns a constructor per backend; every conformance test runs
// against each. A constructor gives a fresh table.
func backends() map[string]func(t *testing.T) cas.Backend {
	return map[string]func(t *testing.T) cas.Backend{
		"postgres": func(t *testing.T) cas.Backend {
			b, err := pgcas.NewBackend(testenv.Postgres(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := b.CreateSchema(context.Background()); err != nil {
				t.Fatal(err)
			}
			return b
		},
		"dynamodb": func(t *testing.T) cas.Backend {
			client := testenv.DynamoDB(t)
			b, err := dynamocas.NewBackend(client, testenv.Table(t, client, false))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"dynamodb-sort-key": func(t *testing.T) cas.Backend {
			client := testenv.DynamoDB(t)
			b, err := dynamocas.NewBackend(client, testenv.Table(t, client, true), dynamocas.WithKeyAttributes("pk", "sk"))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
	}
}

// conformance runs test against every backend.
func conformance(t *testing.T, test func(t *testing.T, b cas.Backend)) {
	t.Helper()
	t.Parallel()
	for name, newBackend := range backends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, newBackend(t))
		})
	}
}

type doc struct {
	Title string   `json:"title"`
	Edits []string `json:"edits"`
	N     int      `json:"n"`
}

func newStore(t *testing.T, b cas.Backend, opts ...cas.Option) *cas.Store[doc] {
	t.Helper()
	s, err := cas.NewStore[doc](b, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStoreCreateGetUpdateDelete(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		s := newStore(t, b)
		if _, err := s.Get(ctx, "d1"); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
		}
		if err := s.Create(ctx, "d1", doc{Title: "draft"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, "d1", doc{Title: "other"}); !errors.Is(err, cas.ErrExists) {
			t.Fatalf("second Create: %v, want ErrExists", err)
		}
		got, err := s.Get(ctx, "d1")
		if err != nil || got.Value.Title != "draft" || got.Version != 1 {
			t.Fatalf("Get = %+v, %v; want draft at version 1", got, err)
		}
		up, err := s.Update(ctx, "d1", func(d doc) (doc, error) { d.Title = "final"; d.N++; return d, nil })
		if err != nil || up.Value.Title != "final" || up.Version != 2 {
			t.Fatalf("Update = %+v, %v; want final at version 2", up, err)
		}
		refuse := errors.New("not allowed")
		if _, err := s.Update(ctx, "d1", func(doc) (doc, error) { return doc{}, refuse }); !errors.Is(err, refuse) {
			t.Fatalf("Update whose fn fails: %v, want its error", err)
		}
		if got, _ := s.Get(ctx, "d1"); got.Version != 2 || got.Value.Title != "final" {
			t.Fatalf("a failed fn changed the value: %+v", got)
		}
		if _, err := s.Update(ctx, "nope", func(d doc) (doc, error) { return d, nil }); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("Update of a missing key: %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, "d1", 1); !errors.Is(err, cas.ErrConflict) {
			t.Fatalf("Delete at a stale version: %v, want ErrConflict", err)
		}
		if err := s.Delete(ctx, "d1", 2); err != nil {
			t.Fatalf("Delete at the current version: %v", err)
		}
		if err := s.Delete(ctx, "d1", 2); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("Delete of a deleted key: %v, want ErrNotFound", err)
		}
		if err := b.Create(ctx, "raw", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Put(ctx, "raw", []byte(`{"n":1}`), 7); !errors.Is(err, cas.ErrConflict) {
			t.Fatalf("backend Put at a wrong version: %v, want ErrConflict", err)
		}
		if _, err := b.Put(ctx, "missing", []byte(`{}`), 1); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("backend Put of a missing key: %v, want ErrNotFound", err)
		}
	})
}

func TestStoreBadInput(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		s := newStore(t, b)
		if err := s.Create(ctx, "d", doc{Title: "kept"}); err != nil {
			t.Fatal(err)
		}
		huge := doc{Title: strings.Repeat("x", b.MaxValue())}
		for _, tc := range []struct {
			name string
			err  error
			want error
		}{
			{"empty key", s.Create(ctx, "", doc{}), cas.ErrInvalid},
			{"long key", s.Create(ctx, strings.Repeat("k", cas.MaxKeyLen+1), doc{}), cas.ErrInvalid},
			{"nil fn", func() error { _, err := s.Update(ctx, "d", nil); return err }(), cas.ErrInvalid},
			{"version 0", s.Delete(ctx, "d", 0), cas.ErrInvalid},
			{"negative version", s.Delete(ctx, "d", -1), cas.ErrInvalid},
			{"too large to create", s.Create(ctx, "big", huge), cas.ErrTooLarge},
			{"too large to update", func() error {
				_, err := s.Update(ctx, "d", func(doc) (doc, error) { return huge, nil })
				return err
			}(), cas.ErrTooLarge},
		} {
			if !errors.Is(tc.err, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
			}
		}
		if got, err := s.Get(ctx, "d"); err != nil || got.Version != 1 || got.Value.Title != "kept" {
			t.Fatalf("bad input changed the stored value: %+v, %v", got, err)
		}
		if _, err := s.Get(ctx, "big"); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("a too-large value was stored: %v", err)
		}
		if _, err := cas.NewStore[doc](nil, nil); !errors.Is(err, cas.ErrInvalid) {
			t.Errorf("NewStore(nil): %v", err)
		}
		for _, n := range []int{-1, 0} { // an explicit 0 is refused, not read as the default
			if _, err := cas.NewStore[doc](b, nil, cas.WithAttempts(n)); !errors.Is(err, cas.ErrInvalid) {
				t.Errorf("NewStore with %d attempts: %v", n, err)
			}
		}
	})
}

// Keys that are not valid UTF-8, or hold a NUL byte, are refused before
// any I/O: DynamoDB would store "user-\xff" and "user-\xfe" as one item
// (both become "user-\uFFFD"), and PostgreSQL would fail them only after
// sending.
func TestStoreRefusesKeysNotUTF8(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		s := newStore(t, b)
		for _, key := range []string{"user-\xff", "user-\xfe", "a\x00b"} {
			inc := func(d doc) (doc, error) { d.N++; return d, nil }
			for op, err := range map[string]error{
				"Create": s.Create(ctx, key, doc{}),
				"Get":    func() error { _, err := s.Get(ctx, key); return err }(),
				"Update": func() error { _, err := s.Update(ctx, key, inc); return err }(),
				"Delete": s.Delete(ctx, key, 1),
			} {
				if !errors.Is(err, cas.ErrInvalid) {
					t.Errorf("%s(%q): %v, want ErrInvalid", op, key, err)
				}
			}
			for _, k := range []string{key, strings.ToValidUTF8(key, "\uFFFD")} {
				if _, _, err := b.Get(ctx, k); err == nil {
					t.Errorf("a record was written under %q", k)
				}
			}
		}
	})
}

// A write whose context has already ended is not sent, and says so: the
// context's error, not ErrAmbiguousCommit.
func TestStoreWriteWithEndedCtxIsNotAmbiguous(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		s := newStore(t, b)
		if err := s.Create(context.Background(), "k", doc{Title: "kept"}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		inc := func(d doc) (doc, error) { d.N++; return d, nil }
		for op, err := range map[string]error{
			"Store.Create":               s.Create(ctx, "new", doc{}),
			"Store.Delete":               s.Delete(ctx, "k", 1),
			"Store.Update(NoCoalescing)": func() error { _, err := s.Update(ctx, "k", inc, cas.NoCoalescing()); return err }(),
			"Backend.Create":             b.Create(ctx, "new", []byte(`{}`)),
			"Backend.Put":                func() error { _, err := b.Put(ctx, "k", []byte(`{"n":7}`), 1); return err }(),
			"Backend.Delete":             b.Delete(ctx, "k", 1),
		} {
			if !errors.Is(err, context.Canceled) || errors.Is(err, cas.ErrAmbiguousCommit) {
				t.Errorf("%s: %v, want context.Canceled and not ErrAmbiguousCommit", op, err)
			}
		}
		if got, err := s.Get(context.Background(), "k"); err != nil || got.Version != 1 || got.Value.Title != "kept" {
			t.Fatalf("stored %+v (%v), want the original at version 1", got, err)
		}
		if _, err := s.Get(context.Background(), "new"); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("Get(new): %v, want ErrNotFound", err)
		}
	})
}

// Concurrent increments of one key never lose an update, combined or not;
// fns that fail leave the value alone and do not disturb the others.
func TestStoreConcurrentUpdatesLoseNothing(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		for _, mode := range []string{"combined", "admission", "raw"} {
			t.Run(mode, func(t *testing.T) {
				ctx := context.Background()
				var ev events
				s := newStore(t, b, cas.WithCoalescing(mode == "combined"), ev.observer(), cas.WithAttempts(200))
				var perCall []cas.UpdateOption
				if mode == "raw" {
					perCall = append(perCall, cas.NoCoalescing()) // every caller on its own: real conflicts
				}
				key := "counter-" + mode
				if err := s.Create(ctx, key, doc{}); err != nil {
					t.Fatal(err)
				}
				workers, each := 16, 15
				if mode == "raw" {
					workers, each = 8, 8 // every conflict costs a round trip and a backoff
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				applied, refused := 0, 0
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < each; i++ {
							fail := (w+i)%5 == 0
							_, err := s.Update(ctx, key, func(d doc) (doc, error) {
								if fail {
									return d, errors.New("refused by the fn")
								}
								d.N++
								return d, nil
							}, perCall...)
							mu.Lock()
							if err == nil {
								applied++
							} else if fail {
								refused++
							} else {
								t.Errorf("update: %v", err)
							}
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				got, err := s.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if got.Value.N != applied || applied+refused != workers*each {
					t.Fatalf("N = %d after %d applied and %d refused updates of %d", got.Value.N, applied, refused, workers*each)
				}
				s.Close() // the observer has every event
				commits, conflicts := ev.count(cas.EventCommitted), ev.count(cas.EventConflict)
				if commits != int(got.Version-1) {
					t.Errorf("%d commits reported, but the version rose by %d", commits, got.Version-1)
				}
				if mode == "combined" && commits >= applied {
					t.Errorf("%d commits for %d updates: nothing was combined", commits, applied)
				}
				if mode == "raw" && conflicts == 0 {
					t.Errorf("no conflict among %d concurrent raw updates: the retry path did not run", applied)
				}
				t.Logf("%d updates: %d conflicts, %d commits, version %d", applied, conflicts, commits, got.Version)
			})
		}
	})
}

// Two Stores on one backend (two processes) stay exact: the version decides.
func TestStoreTwoStoresOneKey(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		stores := []*cas.Store[doc]{newStore(t, b, cas.WithAttempts(500)), newStore(t, b, cas.WithAttempts(500))}
		if err := stores[0].Create(ctx, "shared", doc{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					if _, err := stores[w%2].Update(ctx, "shared", func(d doc) (doc, error) { d.N++; return d, nil }); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if got, err := stores[1].Get(ctx, "shared"); err != nil || got.Value.N != 160 {
			t.Fatalf("N = %d (%v), want 160", got.Value.N, err)
		}
	})
}
