package cas_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/dynamocas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// The histories below are checked against a register per key: Get returns
// the value, Add increments it and returns the new value, Set replaces it.
// An operation whose outcome is unknown (ErrAmbiguousCommit) may take
// effect at any point after its call, or never; one that failed definitely
// did not happen and is left out.

type regInput struct {
	key  string
	kind string // get, add, set
	arg  int
}

type regOutput struct {
	value   int
	unknown bool
}

var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(regInput).key
			byKey[k] = append(byKey[k], op)
		}
		var parts [][]porcupine.Operation
		for _, ops := range byKey {
			parts = append(parts, ops)
		}
		return parts
	},
	Init: func() any { return 0 },
	Step: func(state, input, output any) (bool, any) {
		st, in, out := state.(int), input.(regInput), output.(regOutput)
		next := st
		switch in.kind {
		case "add":
			next = st + 1
		case "set":
			next = in.arg
		}
		return out.unknown || out.value == next, next
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		return fmt.Sprintf("%s %s(%d) -> %d (unknown %v)", in.key, in.kind, in.arg, out.value, out.unknown)
	},
}

// history creates keys at 0, runs clients × ops random operations on them
// and records them for porcupine.
// createKeys creates keys at 0; keys that exist are left as they are.
func createKeys(t *testing.T, s *cas.Store[int], keys []string) {
	t.Helper()
	for _, k := range keys {
		if err := s.Create(context.Background(), k, 0); err != nil && !errors.Is(err, cas.ErrExists) {
			t.Fatal(err)
		}
	}
}

func history(t *testing.T, s *cas.Store[int], keys []string, clients, ops int, opts ...cas.UpdateOption) []porcupine.Operation {
	t.Helper()
	ctx := context.Background()
	createKeys(t, s, keys)
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var mu sync.Mutex
	var hist []porcupine.Operation
	var failed, unknown atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ops; i++ {
				in := regInput{key: keys[rand.IntN(len(keys))], kind: []string{"get", "add", "add", "set"}[rand.IntN(4)], arg: rand.IntN(1000)}
				call := now()
				var v cas.Versioned[int]
				var err error
				switch in.kind {
				case "get":
					v, err = s.Get(ctx, in.key)
				case "add":
					v, err = s.Update(ctx, in.key, func(n int) (int, error) { return n + 1, nil }, opts...)
				case "set":
					v, err = s.Update(ctx, in.key, func(int) (int, error) { return in.arg, nil }, opts...)
				}
				ret := now()
				out := regOutput{value: v.Value}
				switch {
				case errors.Is(err, cas.ErrAmbiguousCommit):
					out.unknown, ret = true, math.MaxInt64
					unknown.Add(1)
				case err != nil:
					failed.Add(1)
					continue // definitely did not happen
				}
				mu.Lock()
				hist = append(hist, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("%d operations recorded, %d failed (left out), %d with unknown outcome", len(hist), failed.Load(), unknown.Load())
	return hist
}

func checkLinearizable(t *testing.T, hist []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	res := porcupine.CheckOperationsTimeout(registerModel, hist, time.Minute)
	if res == porcupine.Unknown {
		t.Fatal("porcupine timed out")
	}
	return res
}

// Histories on both backends, combined and raw, are linearizable.
func TestStoreLinearizable(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		s, err := cas.NewStore[int](b, nil, cas.WithAttempts(1000))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		hist := history(t, s, []string{"a", "b", "c"}, 8, 40)
		hist = append(hist, history(t, s, []string{"raw-a", "raw-b"}, 6, 20, cas.NoCoalescing())...)
		if res := checkLinearizable(t, hist); res != porcupine.Ok {
			t.Fatalf("history of %d operations is not linearizable", len(hist))
		}
	})
}

// With connections killed at random while clients run, every recorded
// history is still linearizable: a write either happened or is reported
// as unknown, never lost or doubled.
func TestStoreLinearizableUnderConnectionKills(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t, 16)
	b, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err := cas.NewStore[int](b, nil, cas.WithAttempts(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keys := []string{"a", "b", "c"}
	createKeys(t, s, keys) // before the killer starts: setup is not under test
	killer := testenv.Pool(t, testenv.PostgresDSNFor(t, "public"), 1)
	stop := make(chan struct{})
	var kills atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(5+rand.IntN(20)) * time.Millisecond): // the next kill, at random
			}
			var n int64
			_ = killer.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND state = 'active' AND pid <> pg_backend_pid()`, schema).Scan(&n)
			kills.Add(n)
		}
	}()
	hist := history(t, s, keys, 8, 60)
	close(stop)
	t.Logf("%d backends killed", kills.Load())
	if kills.Load() == 0 {
		t.Fatal("no connection was killed: the fault was not injected")
	}
	if res := checkLinearizable(t, hist); res != porcupine.Ok {
		t.Fatalf("history of %d operations with connection kills is not linearizable", len(hist))
	}
}

// broken is a backend whose Put ignores the version: a last-writer-wins
// store. The checker must reject its histories, so the check can fail.
type broken struct{ cas.Backend }

func (b broken) Put(ctx context.Context, key string, v []byte, _ int64) (int64, error) {
	_, cur, err := b.Backend.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	time.Sleep(time.Millisecond) // widen the window a real race would find
	return b.Backend.Put(ctx, key, v, cur)
}

func TestCheckerRejectsABrokenStore(t *testing.T) {
	t.Parallel()
	b, err := pgcas.NewBackend(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	s, err := cas.NewStore[int](broken{b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hist := history(t, s, []string{"a", "b"}, 8, 30, cas.NoCoalescing())
	if res := checkLinearizable(t, hist); res != porcupine.Illegal {
		t.Fatalf("a last-writer-wins store passed the linearizability check (%v): the check cannot fail", res)
	}
}

// dropping passes every call to the real client, but for every fifth
// UpdateItem it throws the response away after the write has applied and
// returns a network error: the "response lost after commit" fault.
type dropping struct {
	dynamocas.DynamoDBAPI
	n atomic.Int64
}

func (d *dropping) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := d.DynamoDBAPI.UpdateItem(ctx, in, opts...)
	if err == nil && d.n.Add(1)%5 == 0 {
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: io.ErrUnexpectedEOF}
	}
	return out, err
}

// Writes whose response is lost are reported as unknown, never retried into
// a double apply: the history stays linearizable with them as unknowns, and
// a counter ends between the confirmed and the confirmed plus the unknown.
func TestStoreLostResponsesAreAmbiguousNotDoubled(t *testing.T) {
	t.Parallel()
	client := testenv.DynamoDB(t)
	table := testenv.Table(t, client, false)
	b, err := dynamocas.NewBackend(&dropping{DynamoDBAPI: client}, table)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cas.NewStore[int](b, nil, cas.WithAttempts(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hist := history(t, s, []string{"a", "b"}, 6, 30)
	unknown := 0
	for _, op := range hist {
		if op.Output.(regOutput).unknown {
			unknown++
		}
	}
	if unknown == 0 {
		t.Fatal("no operation had an unknown outcome: the fault was not injected")
	}
	if res := checkLinearizable(t, hist); res != porcupine.Ok {
		t.Fatalf("history with %d lost responses is not linearizable", unknown)
	}

	ctx := context.Background()
	if err := s.Create(ctx, "counter", 0); err != nil {
		t.Fatal(err)
	}
	confirmed, ambiguous := 0, 0
	for i := 0; i < 40; i++ {
		_, err := s.Update(ctx, "counter", func(n int) (int, error) { return n + 1, nil })
		switch {
		case err == nil:
			confirmed++
		case errors.Is(err, cas.ErrAmbiguousCommit):
			ambiguous++
		default:
			t.Fatal(err)
		}
	}
	got, err := s.Get(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if ambiguous == 0 || got.Value < confirmed || got.Value > confirmed+ambiguous {
		t.Fatalf("counter %d after %d confirmed and %d ambiguous increments", got.Value, confirmed, ambiguous)
	}
}
