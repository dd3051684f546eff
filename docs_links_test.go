package nolock_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocLinks checks that every relative link of README.md and
// docs/*.md names a file of the repository and, when it has an #anchor
// into a Markdown file (or into its own page), a heading of that file, by
// GitHub's rule for heading anchors. Links in code (fenced blocks and
// `spans`) are not links and are skipped.
func TestDocLinks(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // by cleaned path
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchors[path] = headingAnchors(string(text))
		return anchors[path], nil
	}
	var checked int
	for _, name := range append([]string{"README.md"}, docs...) {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range docLinks(string(text)) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			checked++
			where := fmt.Sprintf("%s:%d", name, l.line)
			file, anchor, _ := strings.Cut(l.target, "#")
			path := name
			if file != "" {
				path = filepath.Clean(filepath.Join(filepath.Dir(name), file))
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: no file %s", where, l.target, path)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			a, err := anchorsOf(path)
			if err != nil {
				t.Fatal(err)
			}
			if !a[anchor] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", where, l.target, path, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: is the test running at the repository's root?")
	}
	t.Logf("%d relative links resolve", checked)
}

// TestDocLinksCatchBreak proves TestDocLinks' parts can fail: a link to a
// missing heading is not among a page's anchors, and a link in code is
// not a link.
func TestDocLinksCatchBreak(t *testing.T) {
	text := "# A page\n\n## What it does (not): `Do`, 2 × 3…\n\nSee [x](#what-it-does-not-do-2--3) and `[y](#in-code)`.\n\n```go\nf[z](#in-block)\n```\n## A page\n"
	a := headingAnchors(text)
	for _, want := range []string{"a-page", "what-it-does-not-do-2--3", "a-page-1"} {
		if !a[want] {
			t.Errorf("no anchor %q among %v", want, a)
		}
	}
	if a["what-it-does"] {
		t.Error("a prefix of a heading's anchor counts as an anchor")
	}
	links := docLinks(text)
	if len(links) != 1 || links[0].target != "#what-it-does-not-do-2--3" || links[0].line != 5 {
		t.Errorf("links %v, want the one outside code, on line 5", links)
	}
}

// link is a Markdown link's target and its line.
type link struct {
	line   int
	target string
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan  = regexp.MustCompile("`[^`]*`")
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	notAnchor = regexp.MustCompile(`[^\p{L}\p{M}\p{N}\p{Pc} -]`)
)

// docLinks returns the links of a Markdown text outside code.
func docLinks(text string) []link {
	var out []link
	inBlock := false
	for i, l := range strings.Split(text, "\n") {
		if fence.MatchString(l) {
			inBlock = !inBlock
			continue
		}
		if inBlock {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
			out = append(out, link{i + 1, m[1]})
		}
	}
	return out
}

// headingAnchors returns the anchors GitHub gives a Markdown text's
// headings: lower case, code marks and punctuation dropped, spaces made
// hyphens, and -1, -2 … after a repeated one.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	inBlock := false
	for _, l := range strings.Split(text, "\n") {
		if fence.MatchString(l) {
			inBlock = !inBlock
			continue
		}
		m := headingRE.FindStringSubmatch(l)
		if inBlock || m == nil {
			continue
		}
		base := strings.ReplaceAll(notAnchor.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		a := base
		for n := 1; out[a]; n++ {
			a = fmt.Sprintf("%s-%d", base, n)
		}
		out[a] = true
	}
	return out
}
