package cas

import (
	"context"
	"errors"
	"runtime/debug"
	"strings"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/internal/combine"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/option"
)

// Backend stores (key, value, version) records for a Store. Versions start
// at 1 and grow by one per successful Put. Implementations:
// pgcas.Backend, dynamocas.Backend. Every method is one conditional operation; a failed write
// changes nothing, except that a write whose outcome is unknown must be
// reported wrapping ErrAmbiguousCommit. A write whose ctx has already ended
// is not sent: its error wraps ctx.Err(), not ErrAmbiguousCommit.
type Backend interface {
	// Get returns the value and version, or ErrNotFound.
	Get(ctx context.Context, key string) (value []byte, version int64, err error)
	// Create stores value at version 1, or returns ErrExists.
	Create(ctx context.Context, key string, value []byte) error
	// Put replaces the value if the stored version is version, and returns
	// the new version; otherwise ErrConflict (ErrNotFound if there is no
	// record).
	Put(ctx context.Context, key string, value []byte, version int64) (int64, error)
	// Delete removes the record if the stored version is version;
	// otherwise ErrConflict (ErrNotFound if there is no record).
	Delete(ctx context.Context, key string, version int64) error
	// MaxValue is the largest encoded value the backend accepts.
	MaxValue() int
}

// Versioned is a value with the version it was stored at.
type Versioned[T any] struct {
	Value   T
	Version int64
}

// Store is a typed versioned store with compare-and-set updates. It is
// safe for concurrent use; Close it to stop its goroutines.
type Store[T any] struct {
	b     Backend
	codec Codec[T]
	cfg   config
	comb  *combine.Combiner[string, request[T], Versioned[T]]
}

// MaxKeyLen bounds a key's length in bytes. A key must also be non-empty
// valid UTF-8 without NUL bytes; any other key is ErrInvalid, before I/O.
const MaxKeyLen = 512

// validKey admits the keys both backends store as themselves: non-empty,
// at most MaxKeyLen bytes, valid UTF-8 without NUL. PostgreSQL's text
// refuses the others after they are sent; DynamoDB would replace invalid
// bytes with U+FFFD, so two such keys would share one record.
func validKey(key string) error {
	switch {
	case key == "":
		return casstore.Invalid("key is empty")
	case len(key) > MaxKeyLen:
		return casstore.Invalid("key is %d bytes, more than %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return casstore.Invalid("key %q is not valid UTF-8", key)
	case strings.IndexByte(key, 0) >= 0:
		return casstore.Invalid("key %q contains a NUL byte", key)
	}
	return nil
}

// NewStore returns a Store of T values on b, encoded with codec (nil means
// JSON).
func NewStore[T any](b Backend, codec Codec[T], opts ...Option) (*Store[T], error) {
	if b == nil {
		return nil, casstore.Invalid("backend is nil")
	}
	cfg, err := newStoreConfig(opts)
	if err != nil {
		return nil, err
	}
	if codec == nil {
		codec = JSON[T]{}
	}
	s := &Store[T]{b: b, codec: codec, cfg: cfg}
	// A key's writes run on its drainer, which an observer must never
	// hold up: their events go through a queue of the Store's own.
	s.cfg.events = notify.New(cfg.obs, 1024)
	max := cfg.max
	if !cfg.combine {
		max = 1
	}
	s.comb = combine.New(max, ErrClosed, s.update)
	return s, nil
}

// Get returns the value stored under key with its version, or ErrNotFound.
func (s *Store[T]) Get(ctx context.Context, key string) (Versioned[T], error) {
	if err := casstore.CheckCtx(ctx); err != nil {
		return Versioned[T]{}, err
	}
	if err := validKey(key); err != nil {
		return Versioned[T]{}, err
	}
	b, ver, err := s.b.Get(ctx, key)
	if err != nil {
		return Versioned[T]{}, err
	}
	v, err := s.codec.Decode(b)
	if err != nil {
		return Versioned[T]{}, errfmt.Errorf("cas: decode %q: %w", key, err)
	}
	return Versioned[T]{v, ver}, nil
}

// Create stores v under key at version 1, or returns ErrExists.
func (s *Store[T]) Create(ctx context.Context, key string, v T) error {
	if err := casstore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := validKey(key); err != nil {
		return err
	}
	b, err := s.encode(v)
	if err != nil {
		return err
	}
	return s.b.Create(ctx, key, b)
}

// Delete removes key's value if it is still at version; otherwise
// ErrConflict (or ErrNotFound).
func (s *Store[T]) Delete(ctx context.Context, key string, version int64) error {
	if err := casstore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := validKey(key); err != nil {
		return err
	}
	if version < 1 {
		return casstore.Invalid("version %d is below 1", version)
	}
	return s.b.Delete(ctx, key, version)
}

// UpdateOption configures one Update call: NoCoalescing.
type UpdateOption func(*updateConfig)

type updateConfig struct{ alone bool }

// NoCoalescing runs this Update on its own read-modify-write, neither combined
// with nor queued behind others of the same key: plain optimistic
// concurrency, retrying its own conflicts.
func NoCoalescing() UpdateOption { return func(c *updateConfig) { c.alone = true } }

// Update reads key's value, applies fn, and writes the result only if the
// version is unchanged; on a conflict it runs again on a fresh read after a
// backoff, within the Store's attempts and ctx. It returns the value fn
// produced and the version it was stored at.
//
// Concurrent Updates of one key in this process are combined: one write
// applies each caller's fn in turn to the result of the previous one, and
// each caller gets its own result. Every fn gets its own copy of the value
// (a fresh decode), so an fn that fails leaves nothing behind, even what it
// changed in place, and does not affect the others: if it returns an error,
// or its result cannot be encoded or is too large (ErrTooLarge), its caller
// gets that error and the zero Versioned. A panic in fn, which may run on
// another goroutine, is recovered there and raised again in the goroutine
// that called Update. fn may run several times (once per attempt): it must
// only compute.
//
// ErrNotFound if key has no value (use Create); ErrAmbiguousCommit if the
// write's outcome is unknown. When ctx ends before the write carrying fn's
// result is sent (while the Update waits its turn, or between attempts),
// Update returns an error wrapping ctx.Err() and nothing of fn's is
// written. Combined, a write already sent is waited for, so Update never
// gives up on a write that then succeeds; the write is cut only once every
// caller of its batch has given up, and they get ErrAmbiguousCommit. Under
// NoCoalescing ctx also bounds the round trips, and ending it mid-write
// gives ErrAmbiguousCommit.
func (s *Store[T]) Update(ctx context.Context, key string, fn func(cur T) (T, error), opts ...UpdateOption) (Versioned[T], error) {
	ctx, cl := s.cfg.begin(ctx, CallUpdate, key)
	v, err := s.updateCall(ctx, key, fn, opts)
	cl.endUpdate(err)
	if p, ok := err.(*panicError); ok {
		panic(p.value)
	}
	return v, err
}

func (s *Store[T]) updateCall(ctx context.Context, key string, fn func(cur T) (T, error), opts []UpdateOption) (Versioned[T], error) {
	if err := casstore.CheckCtx(ctx); err != nil {
		return Versioned[T]{}, err
	}
	if err := validKey(key); err != nil {
		return Versioned[T]{}, err
	}
	if fn == nil {
		return Versioned[T]{}, casstore.Invalid("fn is nil")
	}
	var uc updateConfig
	if err := option.Apply(opts, func(o UpdateOption) { o(&uc) }); err != nil {
		return Versioned[T]{}, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var v Versioned[T]
	var err error
	if uc.alone {
		var res []Versioned[T]
		var errs []error
		if res, errs, err = s.update(ctx, key, []request[T]{{ctx, fn}}); err == nil {
			v, err = res[0], errs[0]
		}
	} else {
		// A batch that stopped for a caller who left sent nothing for the
		// others: send again. Each stop followed a conflict (or came
		// before any attempt), so resends count against the Store's
		// attempts: a stream of leavers cannot keep a caller going.
		for sends := 1; ; sends++ {
			if v, err = s.comb.Do(ctx, key, request[T]{ctx, fn}); err != errResend {
				break
			}
			if sends >= s.cfg.policy.Attempts {
				err = errfmt.Errorf("cas: update %q: gave up after %d batches stopped by callers that left: %w", key, sends, ErrConflict)
				s.cfg.gaveUp(ctx, key, sends, err, false)
				break
			}
		}
	}
	return v, err
}

// request is one Update's fn and its caller's context.
type request[T any] struct {
	ctx context.Context
	fn  func(T) (T, error)
}

// errResend answers the callers of a batch that stopped retrying because
// another of its callers left: nothing was written for them.
var errResend = errors.New("cas: batch stopped for a caller that left; send again")

// update is one combined read-modify-write of key for reqs, retried on
// conflict. It returns one result and one error per request, or an error
// for all.
//
// A request whose caller leaves (its ctx ends) stops the retries at the
// next attempt or backoff: that caller gets its ctx's error, and the others
// get errResend, so that Update sends them again instead of keeping the
// leaver waiting on their retries. The attempt in flight runs on under
// ctx, which ends only when every caller has left: a write is never cut
// off because one caller left.
func (s *Store[T]) update(ctx context.Context, key string, reqs []request[T]) ([]Versioned[T], []error, error) {
	retryCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, r := range reqs {
		unwatch := context.AfterFunc(r.ctx, stop)
		defer unwatch()
	}
	var res []Versioned[T]
	var errs []error
	err := s.cfg.retry(retryCtx, key, func(context.Context) (err error) {
		res, errs, err = s.attempt(ctx, key, reqs)
		return err
	}, false)
	switch {
	case err == nil:
		return res, errs, nil
	case retryCtx.Err() == nil || errors.Is(err, ErrAmbiguousCommit) ||
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		// The write failed for all. A fn that failed on its own in the last
		// attempt keeps its own answer (its error, or its panic): nothing
		// of it could have been written.
		own := make([]error, len(reqs))
		for i := range own {
			own[i] = err
			if errs != nil && errs[i] != nil {
				own[i] = errs[i]
			}
		}
		return make([]Versioned[T], len(reqs)), own, nil
	}
	// The retries stopped, before the next write was sent, because a
	// caller left (or all did).
	errs = make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = errResend
		if err := r.ctx.Err(); err != nil {
			errs[i] = errfmt.Errorf("cas: update %q: ctx ended before the write was sent, nothing written: %w", key, err)
		}
	}
	return make([]Versioned[T], len(reqs)), errs, nil
}

// attempt reads key once, applies each fn in turn and writes the last
// value a fn produced, conditioned on the version read. Each fn gets its
// own decode of the last value that succeeded, and its result is encoded
// before the next fn runs, so a fn that fails (returns an error, panics, or
// produces a value that cannot be encoded or is too large) fails alone and
// leaves nothing behind, even if it changed its argument in place.
func (s *Store[T]) attempt(ctx context.Context, key string, reqs []request[T]) ([]Versioned[T], []error, error) {
	last, ver, err := s.b.Get(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	res := make([]Versioned[T], len(reqs))
	errs := make([]error, len(reqs))
	changed := false
	for i, r := range reqs {
		v, b, err := s.apply(key, r.fn, last)
		if errs[i] = err; err == nil {
			res[i].Value, last, changed = v, b, true
		}
	}
	if !changed {
		return res, errs, nil
	}
	ver, err = s.b.Put(ctx, key, last, ver)
	if err != nil {
		return nil, errs, err // errs: the fns that failed on their own
	}
	s.cfg.committed(ctx, key, len(reqs)-countErrs(errs))
	for i := range res {
		if errs[i] == nil {
			res[i].Version = ver
		}
	}
	return res, errs, nil
}

// apply runs fn on a fresh decode of cur and returns its result with the
// result's encoding. A panic in fn (or the codec) is returned as a
// *panicError, which Update raises again in its caller's goroutine.
func (s *Store[T]) apply(key string, fn func(T) (T, error), cur []byte) (v T, b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{value: p, stack: debug.Stack()}
		}
	}()
	in, err := s.codec.Decode(cur)
	if err != nil {
		return v, nil, errfmt.Errorf("cas: decode %q: %w", key, err)
	}
	if v, err = fn(in); err != nil {
		return v, nil, err
	}
	b, err = s.encode(v)
	return v, b, err
}

func (s *Store[T]) encode(v T) ([]byte, error) {
	b, err := s.codec.Encode(v)
	if err != nil {
		return nil, errfmt.Errorf("cas: encode: %w", err)
	}
	if max := s.b.MaxValue(); len(b) > max {
		return nil, errfmt.Errorf("%w: %d bytes encoded, the backend takes %d", ErrTooLarge, len(b), max)
	}
	return b, nil
}

// Close fails Updates not yet sent with ErrClosed, waits for those in
// flight (each ends, at the latest, when its callers have all given up)
// and, when the backend has a Close method (pgcas.Backend), for
// it (its commits in flight), then for the observer to have had every
// event. It is idempotent; the backend's connections are the caller's.
func (s *Store[T]) Close() error {
	s.comb.Close()
	if c, ok := s.b.(interface{ Close() error }); ok {
		_ = c.Close() // waits for commits whose callers stopped waiting
	}
	s.cfg.events.Close() // after the writes in flight: the observer gets every event
	return nil
}

// countErrs counts the non-nil errors.
func countErrs(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}
