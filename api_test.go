package nolock_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/nolock/nolock/internal/apilist"
)

var updateAPI = flag.Bool("update-api", false, "rewrite api/*.txt from the code")

// TestAPI fails when the exported API of the public packages differs from
// their listing under api/: api/nolock.txt for this module, and a file per
// module of its own (nolockotel), so every change to the public face is a
// visible diff. After a change made on purpose:
//
//	go test -run TestAPI -update-api .
func TestAPI(t *testing.T) {
	for _, m := range []struct{ dir, file string }{
		{".", "api/nolock.txt"},
		{"nolockotel", "api/nolockotel.txt"},
	} {
		t.Run(m.file, func(t *testing.T) { checkAPI(t, m.dir, m.file) })
	}
}

// checkAPI compares the listing of the module in dir with apiFile.
func checkAPI(t *testing.T, dir, apiFile string) {
	lines, err := apilist.Listing(dir, "./...")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(lines, "\n") + "\n"
	if *updateAPI {
		if err := os.WriteFile(apiFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(apiFile)
	if err != nil {
		t.Fatalf("%v (write it with: go test -run TestAPI -update-api .)", err)
	}
	added, removed := diffLines(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), lines)
	for _, l := range removed {
		t.Errorf("- %s", l)
	}
	for _, l := range added {
		t.Errorf("+ %s", l)
	}
	if len(added)+len(removed) > 0 {
		t.Errorf("the API differs from %s (- listed, not in the code; + in the code, not listed); if on purpose: go test -run TestAPI -update-api .", apiFile)
	}
}

// diffLines returns the lines of got not in want, and of want not in got.
func diffLines(want, got []string) (added, removed []string) {
	in := func(lines []string) map[string]bool {
		m := make(map[string]bool, len(lines))
		for _, l := range lines {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	for _, l := range got {
		if !w[l] {
			added = append(added, l)
		}
	}
	for _, l := range want {
		if !g[l] {
			removed = append(removed, l)
		}
	}
	return added, removed
}
