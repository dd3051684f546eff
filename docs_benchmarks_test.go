package nolock_test

import (
	"os"
	"strings"
	"testing"
)

// TestBenchmarksSummary keeps docs/benchmarks.md's summary one screen of
// short cells: every row of the table under "## Summary" has cells under
// 30 words and a last cell that gives the command that measured it (a
// `code span`) or says it was not re-measured.
func TestBenchmarksSummary(t *testing.T) {
	text, err := os.ReadFile("docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := summaryRows(string(text))
	if len(rows) < 2 {
		t.Fatalf("docs/benchmarks.md: %d rows under ## Summary, want its table", len(rows))
	}
	for _, r := range rows[1:] { // rows[0] is the header
		for _, c := range r.cells {
			if n := len(strings.Fields(c)); n >= 30 {
				t.Errorf("docs/benchmarks.md:%d: a summary cell of %d words (keep it under 30; the prose goes below): %.60s…", r.line, n, c)
			}
		}
		last := r.cells[len(r.cells)-1]
		if !strings.Contains(last, "`") && !strings.Contains(last, "not re-measured") {
			t.Errorf("docs/benchmarks.md:%d: the row names no command (a `code span`) and does not say \"not re-measured\"", r.line)
		}
	}
}

// TestBenchmarksSummaryCatches proves the check can fail.
func TestBenchmarksSummaryCatches(t *testing.T) {
	long := strings.Repeat("word ", 30)
	rows := summaryRows("# B\n\n## Summary\n\n| a | b |\n| --- | --- |\n| " + long + "| `go test` |\n| x | y |\n\n## Next\n| c | d |\n")
	if len(rows) != 3 || len(strings.Fields(rows[1].cells[0])) != 30 || rows[2].cells[1] != "y" {
		t.Fatalf("rows %+v: want the header and two rows of the summary's table only", rows)
	}
}

type tableRow struct {
	line  int
	cells []string
}

// summaryRows returns the rows of the table under "## Summary", without
// the |---| line.
func summaryRows(text string) []tableRow {
	var out []tableRow
	in := false
	for i, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## Summary"
		case in && strings.HasPrefix(l, "|") && !strings.HasPrefix(l, "| ---"):
			var cells []string
			for _, c := range strings.Split(strings.ReplaceAll(strings.Trim(l, "| "), `\|`, "\x00"), " | ") {
				cells = append(cells, strings.ReplaceAll(strings.TrimSpace(c), "\x00", `\|`))
			}
			out = append(out, tableRow{i + 1, cells})
		}
	}
	return out
}
