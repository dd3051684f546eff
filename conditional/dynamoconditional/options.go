package dynamoconditional

import (
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/observe"
)

// Option configures this package's constructors: NewStock, NewAccounts,
// NewHolds and NewFenced take it, as in package conditional. Each setter
// applies to some of them, and a constructor given one that does not
// apply to it returns ErrInvalid naming the setter, before any I/O:
//
//   - WithObserver: every constructor
//   - WithKeyAttributes: NewStock, NewAccounts and NewHolds
//   - WithLogger: NewStock and NewHolds
//   - WithBuckets, WithCoalescing, WithMaxBatch: NewStock
//   - WithClock: NewHolds
//
// A nil Option is ErrInvalid too.
type Option func(*config)

// The setters of Option, one bit each, and their names in bit order.
const (
	setObserver option.Used = 1 << iota
	setKeyAttributes
	setLogger
	setBuckets
	setCoalescing
	setMaxBatch
	setClock
)

var setterNames = []string{"WithObserver", "WithKeyAttributes", "WithLogger", "WithBuckets", "WithCoalescing", "WithMaxBatch", "WithClock"}

// The setters each constructor takes (see Option).
const (
	stockSetters    = setObserver | setKeyAttributes | setLogger | setBuckets | setCoalescing | setMaxBatch
	accountsSetters = setObserver | setKeyAttributes
	holdsSetters    = setObserver | setKeyAttributes | setLogger | setClock
	fencedSetters   = setObserver
)

// config is the settings Options make; each constructor reads its own.
type config struct {
	used     option.Used
	keys     keyAttrs
	log      *slog.Logger
	obs      observe.Observer
	buckets  int
	coalesce bool
	maxBatch int
	clock    func() time.Time
}

// apply applies opts to cfg, refusing a nil one or one that ctor, which
// takes allowed, does not take.
func apply(cfg *config, opts []Option, ctor string, allowed option.Used) error {
	return condcore.Options(option.ApplyTo(cfg, &cfg.used, opts, setterNames, ctor, allowed))
}
