package nolockotel_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/idempotency/dynamoidempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/partition"
	"github.com/nolock/nolock/pgoutcome"
)

// libSentinels are the library's exported Err* variables, by qualified
// name; TestErrorTypeSentinels checks the list against the source.
var libSentinels = map[string]error{
	"cas.ErrConflict": cas.ErrConflict, "cas.ErrNotFound": cas.ErrNotFound, "cas.ErrExists": cas.ErrExists,
	"cas.ErrInvalid": cas.ErrInvalid, "cas.ErrTooLarge": cas.ErrTooLarge, "cas.ErrAmbiguousCommit": cas.ErrAmbiguousCommit,
	"cas.ErrClosed": cas.ErrClosed,

	"conditional.ErrSoldOut": conditional.ErrSoldOut, "conditional.ErrInsufficient": conditional.ErrInsufficient,
	"conditional.ErrNotFound": conditional.ErrNotFound, "conditional.ErrInvalid": conditional.ErrInvalid,
	"conditional.ErrAmbiguousCommit": conditional.ErrAmbiguousCommit, "conditional.ErrHeld": conditional.ErrHeld,
	"conditional.ErrConfirmed": conditional.ErrConfirmed, "conditional.ErrNotHolder": conditional.ErrNotHolder,
	"conditional.ErrFenced": conditional.ErrFenced, "conditional.ErrClosed": conditional.ErrClosed,

	"dynamoconditional.ErrSoldOut": dynamoconditional.ErrSoldOut, "dynamoconditional.ErrInsufficient": dynamoconditional.ErrInsufficient,
	"dynamoconditional.ErrNotFound": dynamoconditional.ErrNotFound, "dynamoconditional.ErrInvalid": dynamoconditional.ErrInvalid,
	"dynamoconditional.ErrAmbiguousCommit": dynamoconditional.ErrAmbiguousCommit, "dynamoconditional.ErrHeld": dynamoconditional.ErrHeld,
	"dynamoconditional.ErrConfirmed": dynamoconditional.ErrConfirmed, "dynamoconditional.ErrNotHolder": dynamoconditional.ErrNotHolder,
	"dynamoconditional.ErrFenced": dynamoconditional.ErrFenced, "dynamoconditional.ErrClosed": dynamoconditional.ErrClosed,
	"dynamoconditional.ErrConflict": dynamoconditional.ErrConflict,

	"dynamolock.ErrNotAcquired": dynamolock.ErrNotAcquired, "dynamolock.ErrLockLost": dynamolock.ErrLockLost,
	"dynamolock.ErrReleased": dynamolock.ErrReleased, "dynamolock.ErrFenced": dynamolock.ErrFenced,
	"dynamolock.ErrInvalid": dynamolock.ErrInvalid, "dynamolock.ErrClosed": dynamolock.ErrClosed,

	"idempotency.ErrMismatch": idempotency.ErrMismatch, "idempotency.ErrInProgress": idempotency.ErrInProgress,
	"idempotency.ErrAmbiguousCommit": idempotency.ErrAmbiguousCommit, "idempotency.ErrInvalid": idempotency.ErrInvalid,
	"idempotency.ErrNotFound": idempotency.ErrNotFound,

	"dynamoidempotency.ErrMismatch": dynamoidempotency.ErrMismatch, "dynamoidempotency.ErrInProgress": dynamoidempotency.ErrInProgress,
	"dynamoidempotency.ErrAmbiguousCommit": dynamoidempotency.ErrAmbiguousCommit, "dynamoidempotency.ErrInvalid": dynamoidempotency.ErrInvalid,
	"dynamoidempotency.ErrNotFound": dynamoidempotency.ErrNotFound,

	"inbox.ErrInvalid": inbox.ErrInvalid, "inbox.ErrNoID": inbox.ErrNoID, "inbox.ErrAmbiguousCommit": inbox.ErrAmbiguousCommit,
	"inbox.ErrNotParked": inbox.ErrNotParked,

	"lease.ErrNotAcquired": lease.ErrNotAcquired, "lease.ErrLockLost": lease.ErrLockLost, "lease.ErrReleased": lease.ErrReleased,
	"lease.ErrInvalid": lease.ErrInvalid, "lease.ErrClosed": lease.ErrClosed,

	"partition.ErrFenced": partition.ErrFenced, "partition.ErrOffsetLost": partition.ErrOffsetLost,
	"partition.ErrRunTwice": partition.ErrRunTwice, "partition.ErrInvalid": partition.ErrInvalid,
	"partition.ErrNotParked": partition.ErrNotParked, "partition.ErrAmbiguousCommit": partition.ErrAmbiguousCommit,

	"pgoutcome.ErrStoppedWaiting": pgoutcome.ErrStoppedWaiting, "pgoutcome.ErrInvalid": pgoutcome.ErrInvalid,

	"nolockotel.ErrInvalid": nolockotel.ErrInvalid,
}

// twins names, for a DynamoDB package, the PostgreSQL package whose
// sentinels it re-exports.
var twins = map[string]string{"dynamoconditional": "conditional", "dynamoidempotency": "idempotency"}

// Every exported Err* of the library's packages (read from their source,
// so a new one fails here until it is named) has error.type by its
// qualified Go name, or its PostgreSQL twin's for a shared value; so
// does every typed error of the library that wraps one, and a wrapped one.
func TestErrorTypeSentinels(t *testing.T) {
	t.Parallel()
	declared := exportedErrs(t, "..")
	var listed []string
	for name := range libSentinels {
		listed = append(listed, name)
	}
	slices.Sort(listed)
	if !slices.Equal(declared, listed) {
		t.Errorf("the library declares\n%v\nthe test lists\n%v", declared, listed)
	}
	for name, err := range libSentinels {
		pkg, errName, _ := strings.Cut(name, ".")
		want := []string{name}
		if twin, ok := twins[pkg]; ok {
			want = append(want, twin+"."+errName)
		}
		for _, e := range []error{err, fmt.Errorf("%s: call: %w", pkg, err)} {
			if got := nolockotel.ErrorType(e); !slices.Contains(want, got) {
				t.Errorf("ErrorType(%v) = %q, want one of %q", e, got, want)
			}
		}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&lease.HeldError{Key: "k"}, "lease.ErrNotAcquired"},
		{&dynamolock.HeldError{Key: "k"}, "dynamolock.ErrNotAcquired"},
		{&conditional.HoldError{Err: conditional.ErrConfirmed}, "conditional.ErrConfirmed"},
		{&idempotency.MismatchError{}, "idempotency.ErrMismatch"},
		{&inbox.HandlerError{Err: fmt.Errorf("handler: %w", conditional.ErrSoldOut)}, "conditional.ErrSoldOut"},
		{&inbox.HandlerError{Err: fmt.Errorf("handler")}, "*inbox.HandlerError"},
	} {
		if got := nolockotel.ErrorType(tc.err); got != tc.want {
			t.Errorf("ErrorType(%#v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// exportedErrs returns the package-level exported variables named Err…
// of the library's public packages under root (not internal/, cmd/,
// examples/ or testdata), as pkg.ErrX, sorted.
func exportedErrs(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "internal", "cmd", "examples", "testdata", "tools", "scripts":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, spec := range g.Specs {
				for _, n := range spec.(*ast.ValueSpec).Names {
					if strings.HasPrefix(n.Name, "Err") && n.IsExported() {
						out = append(out, f.Name.Name+"."+n.Name)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
