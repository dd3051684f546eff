package nolock_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var fmtErrorf = regexp.MustCompile(`(^|[^\w.])fmt\.Errorf\(`)

// TestErrorsOnePrefix holds the library to one package prefix per error
// message: its wrapped errors are built with internal/errfmt.Errorf, which
// drops a repeated prefix, never with fmt.Errorf.
func TestErrorsOnePrefix(t *testing.T) {
	skip := map[string]bool{"cmd": true, "examples": true, "internal/testenv": true,
		"internal/services": true, "internal/apilist": true, "internal/errfmt": true}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skip[path] || strings.HasPrefix(d.Name(), ".") && path != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if fmtErrorf.MatchString(line) {
				t.Errorf("%s:%d: fmt.Errorf; use errfmt.Errorf so the message names its package once", path, i+1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
