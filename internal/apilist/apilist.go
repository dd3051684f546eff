// Package apilist lists the exported API of Go packages, one line per
// exported identifier, in the manner of Go's own api/*.txt files:
//
//	pkg github.com/nolock/nolock/cas, func NewStore[T any](b Backend, codec Codec[T], opts ...Option) (*Store[T], error)
//	pkg github.com/nolock/nolock/cas, method (*Store[T]) Get(ctx context.Context, key string) (Versioned[T], error)
//	pkg github.com/nolock/nolock/cas, type Versioned[T any] struct, Version int64
//
// Types of the listed package are written unqualified, others by their
// import path. Lines are sorted, so a change to the API is a diff of the
// listing.
package apilist

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// Listing returns the sorted API lines of the packages that patterns
// (go list patterns) match, run in dir. Packages whose import path has an
// element "internal", "cmd" or "examples" are left out, and so are main
// packages. It builds export data with `go list -export`.
func Listing(dir string, patterns ...string) ([]string, error) {
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Name,Export,DepOnly,Standard"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w\n%s", err, stderr.String())
	}
	type pkg struct {
		ImportPath, Name, Export string
		DepOnly, Standard        bool
	}
	exports := map[string]string{}
	var targets []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly && !p.Standard && p.Name != "main" && public(p.ImportPath) {
			targets = append(targets, p)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	var lines []string
	for _, p := range targets {
		tp, err := imp.Import(p.ImportPath)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", p.ImportPath, err)
		}
		lines = append(lines, Package(tp)...)
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

// public reports whether path names a package users import.
func public(path string) bool {
	for _, elem := range strings.Split(path, "/") {
		if elem == "internal" || elem == "cmd" || elem == "examples" {
			return false
		}
	}
	return true
}

// Package returns the API lines of p, unsorted.
func Package(p *types.Package) []string {
	qual := func(other *types.Package) string {
		if other == p {
			return ""
		}
		return other.Path()
	}
	prefix := "pkg " + p.Path() + ", "
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, prefix+fmt.Sprintf(format, args...)) }
	scope := p.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			add("%s = %s", types.ObjectString(obj, qual), obj.Val().ExactString())
		case *types.Var, *types.Func:
			add("%s", types.ObjectString(obj, qual))
		case *types.TypeName:
			typeLines(obj, qual, add)
		}
	}
	return lines
}

// typeLines adds the lines of the type named obj: its declaration, then
// its exported fields or interface methods, then its exported methods
// (promoted ones included).
func typeLines(obj *types.TypeName, qual types.Qualifier, add func(string, ...any)) {
	head := "type " + obj.Name()
	named, isNamed := obj.Type().(*types.Named)
	if isNamed && named.TypeParams().Len() > 0 {
		var params []string
		for tp := range named.TypeParams().TypeParams() {
			params = append(params, tp.Obj().Name()+" "+types.TypeString(tp.Constraint(), qual))
		}
		head += "[" + strings.Join(params, ", ") + "]"
	}
	if obj.IsAlias() {
		add("%s = %s", head, types.TypeString(types.Unalias(obj.Type()), qual))
		return
	}
	switch u := obj.Type().Underlying().(type) {
	case *types.Struct:
		add("%s struct", head)
		for f := range u.Fields() {
			if f.Exported() {
				name := f.Name()
				if f.Embedded() {
					name = "embedded"
				}
				add("%s struct, %s %s", head, name, types.TypeString(f.Type(), qual))
			}
		}
	case *types.Interface:
		add("%s interface", head)
		for m := range u.Methods() {
			if m.Exported() {
				add("%s interface, %s%s", head, m.Name(), strings.TrimPrefix(types.TypeString(m.Type(), qual), "func"))
			}
		}
		for e := range u.EmbeddedTypes() {
			add("%s interface, embedded %s", head, types.TypeString(e, qual))
		}
	default:
		add("%s %s", head, types.TypeString(u, qual))
	}
	if !isNamed {
		return
	}
	if _, isIface := obj.Type().Underlying().(*types.Interface); isIface {
		return
	}
	recv := obj.Name()
	if named.TypeParams().Len() > 0 {
		var names []string
		for tp := range named.TypeParams().TypeParams() {
			names = append(names, tp.Obj().Name())
		}
		recv += "[" + strings.Join(names, ", ") + "]"
	}
	values := types.NewMethodSet(obj.Type())
	for sel := range types.NewMethodSet(types.NewPointer(obj.Type())).Methods() {
		m := sel.Obj().(*types.Func)
		if !m.Exported() {
			continue
		}
		r := "*" + recv
		if values.Lookup(m.Pkg(), m.Name()) != nil {
			r = recv
		}
		add("method (%s) %s%s", r, m.Name(), strings.TrimPrefix(types.TypeString(m.Type(), qual), "func"))
	}
}
