package nolock_test

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// notRun is the first line of a ```go block that the suite does not run,
// followed by the reason; the reader sees it too.
const notRun = "// Not run: "

// TestDocSnippets checks that every ```go block of README.md and
// docs/*.md is code the suite runs: after removing the block's common
// indentation, its lines must appear line for line (at any one
// indentation) inside the body of an Example function of a _test.go file
// of this repository (its own modules included) that runs under go test,
// because it has an Output comment or a Test function calls it. A block
// whose first line starts with notRun is exempt and must give a reason.
//
// So a snippet is copied from an Example, never written in the doc alone;
// a change to either that the other does not follow fails here, with the
// doc's line and the nearest Example's first differing line.
func TestDocSnippets(t *testing.T) {
	examples := runnableExamples(t, ".")
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var checked, exempt int
	for _, name := range append([]string{"README.md"}, docs...) {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range goBlocks(string(text)) {
			where := fmt.Sprintf("%s:%d", name, s.line)
			if reason, ok := strings.CutPrefix(s.lines[0], notRun); ok {
				if strings.TrimSpace(reason) == "" {
					t.Errorf("%s: %q needs a reason", where, notRun)
				}
				exempt++
				continue
			}
			checked++
			if ex, ok := find(examples, s.lines); !ok {
				t.Errorf("%s: this ```go block is in no runnable Example (copy it from one, or start it with %q and the reason); %s", where, notRun, ex.describe(name, s.line))
			} else if !ex.runs {
				t.Errorf("%s: the block is in %s, which go test compiles but does not run: give it an Output comment or call it from a test", where, ex.where)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no ```go block found: is the test running at the repository's root?")
	}
	t.Logf("%d snippets found in runnable Examples, %d marked not run", checked, exempt)
}

// TestDocSnippetsCatchChange proves TestDocSnippets can fail: a snippet
// whose one line differs from its Example matches nothing.
func TestDocSnippetsCatchChange(t *testing.T) {
	examples := runnableExamples(t, ".")
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(string(text))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go block")
	}
	s := blocks[0].lines
	if _, ok := find(examples, s); !ok {
		t.Fatal("README.md's first snippet matches no Example")
	}
	changed := slices.Clone(s)
	changed[len(changed)/2] += " // changed"
	if ex, ok := find(examples, changed); ok {
		t.Fatalf("a changed snippet still matches %s", ex.where)
	}
}

// snippet is a ```go block: its first line's number in the file and its
// lines without their common indentation.
type snippet struct {
	line  int
	lines []string
}

var fence = regexp.MustCompile("^([ \t]*)```(.*)$")

// goBlocks returns the ```go blocks of a Markdown text.
func goBlocks(text string) []snippet {
	var out []snippet
	var cur *snippet
	for i, l := range strings.Split(text, "\n") {
		m := fence.FindStringSubmatch(l)
		switch {
		case cur == nil && m != nil && strings.TrimSpace(m[2]) == "go":
			cur = &snippet{line: i + 2}
		case cur != nil && m != nil && strings.TrimSpace(m[2]) == "":
			out = append(out, snippet{cur.line, dedent(cur.lines)})
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	return out
}

// dedent removes the indentation common to the non-blank lines, blank
// lines' spaces, and the blank lines at both ends.
func dedent(lines []string) []string {
	prefix := ""
	first := true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		ind := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = ind, false
		}
		for !strings.HasPrefix(ind, prefix) {
			prefix = prefix[:len(prefix)-1]
		}
	}
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			l = ""
		}
		out = append(out, strings.TrimPrefix(l, prefix))
	}
	for len(out) > 0 && out[0] == "" {
		out = out[1:]
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	if len(out) == 0 {
		return []string{""}
	}
	return out
}

// example is the body of one Example function.
type example struct {
	where string   // file:line of the func
	first int      // the line number of body[0]
	file  string   // the file's path
	body  []string // the lines between the braces
	runs  bool     // go test runs it
}

// runnableExamples returns every Example function of the _test.go files
// under root, each marked with whether go test runs it.
func runnableExamples(t *testing.T, root string) []example {
	t.Helper()
	byDir := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			byDir[filepath.Dir(path)] = append(byDir[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []example
	for _, paths := range byDir {
		fset := token.NewFileSet()
		var files []*ast.File
		sources := map[string][]string{}
		for _, p := range paths {
			src, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(fset, p, src, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
			sources[p] = strings.Split(string(src), "\n")
		}
		called := calledByTests(files)
		for _, ex := range doc.Examples(files...) {
			body, ok := ex.Code.(*ast.BlockStmt)
			if !ok { // a whole-file example: its code is the file
				continue
			}
			lb, rb := fset.Position(body.Lbrace), fset.Position(body.Rbrace)
			lines := sources[lb.Filename]
			out = append(out, example{
				where: fmt.Sprintf("%s:%d (Example%s)", lb.Filename, lb.Line, ex.Name),
				first: lb.Line + 1,
				file:  lb.Filename,
				body:  lines[lb.Line : rb.Line-1],
				runs:  ex.Output != "" || ex.EmptyOutput || called["Example"+ex.Name],
			})
		}
	}
	return out
}

// calledByTests returns the names of the functions a Test function of
// files refers to.
func calledByTests(files []*ast.File) map[string]bool {
	called := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					called[id.Name] = true
				}
				return true
			})
		}
	}
	return called
}

// match is where a snippet was found or, for no match, the nearest
// Example and its first difference.
type match struct {
	example
	n    int    // for no match: how many of the snippet's lines matched (0: not even the first)
	line int    // the line of the file that differs
	got  string // that line, without the Example's indentation
	want string // the snippet's line
}

// describe says where the nearest Example differs from the snippet whose
// first line is doc:first.
func (m match) describe(doc string, first int) string {
	if m.n == 0 {
		return "no Example has its first line"
	}
	return fmt.Sprintf("nearest: %s, whose line %d is %s where %s:%d has %q",
		m.where, m.line, m.got, doc, first+m.n, m.want)
}

// find returns the Example whose body holds s, line for line at one
// indentation.
func find(examples []example, s []string) (match, bool) {
	var best match
	for _, ex := range examples {
		for i := range ex.body {
			prefix, ok := strings.CutSuffix(ex.body[i], s[0])
			if !ok || strings.TrimLeft(prefix, " \t") != "" {
				continue
			}
			n := 0
			for n < len(s) && i+n < len(ex.body) && sameLine(ex.body[i+n], prefix, s[n]) {
				n++
			}
			if n == len(s) {
				return match{example: ex}, true
			}
			if n > best.n {
				got := "(the end of the body)"
				if i+n < len(ex.body) {
					got = fmt.Sprintf("%q", strings.TrimPrefix(ex.body[i+n], prefix))
				}
				best = match{example: ex, n: n, line: ex.first + i + n, got: got, want: s[n]}
			}
		}
	}
	return best, false
}

// sameLine reports whether a line of an Example's body is the snippet's
// line at the Example's indentation.
func sameLine(body, prefix, line string) bool {
	if line == "" {
		return strings.TrimSpace(body) == ""
	}
	return body == prefix+line
}
