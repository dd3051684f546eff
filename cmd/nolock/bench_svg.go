package main

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"strings"
)

// svgColors are distinguishable line colours (Tableau 10).
var svgColors = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// renderSVG draws throughput against clients, one line (one <path>) per
// scenario, both axes logarithmic, with gridlines, axis labels and a
// legend. Hand-written: no plotting dependency.
func renderSVG(res *benchResult) []byte {
	const (
		w, h                     = 900.0, 520.0
		left, right, top, bottom = 80.0, 300.0, 50.0, 60.0 // the legend sits in the right margin
		pw, ph                   = w - left - right, h - top - bottom
	)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, ms := range res.measures {
		for _, m := range ms {
			if m.run.Rate > 0 {
				lo, hi = math.Min(lo, m.run.Rate), math.Max(hi, m.run.Rate)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	yLo, yHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yHi <= yLo {
		yHi = yLo + 1
	}
	cLo, cHi := math.Log(float64(res.clients[0])), math.Log(float64(res.clients[0]))
	for _, c := range res.clients {
		cLo, cHi = math.Min(cLo, math.Log(float64(c))), math.Max(cHi, math.Log(float64(c)))
	}
	x := func(clients int) float64 {
		if cHi == cLo {
			return left + pw/2
		}
		return left + (math.Log(float64(clients))-cLo)/(cHi-cLo)*pw
	}
	y := func(rate float64) float64 {
		return top + ph - (math.Log10(math.Max(rate, math.Pow(10, yLo)))-yLo)/(yHi-yLo)*ph
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">
<rect width="100%%" height="100%%" fill="white"/>
<text x="%g" y="28" font-size="16" text-anchor="middle">%s</text>
`, w, h, w, h, left+pw/2, escape(cmp.Or(res.title, "nolock bench: one hot key, throughput vs clients")))
	// Gridlines and tick labels: decades on y, the measured counts on x.
	for e := yLo; e <= yHi; e++ {
		yy := y(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, left+pw, yy)
		fmt.Fprintf(&b, `<text x="%g" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-8, yy, decade(e))
	}
	for _, c := range res.clients {
		xx := x(c)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#ddd"/>`+"\n", xx, top, xx, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%d</text>`+"\n", xx, top+ph+18, c)
	}
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">clients (log scale)</text>`+"\n", left+pw/2, h-16)
	fmt.Fprintf(&b, `<text x="20" y="%g" text-anchor="middle" transform="rotate(-90 20 %g)">operations per second (log scale)</text>`+"\n", top+ph/2, top+ph/2)

	for i, name := range res.scenarios {
		color := svgColors[i%len(svgColors)]
		var d strings.Builder
		for j, m := range res.measures[name] {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x(m.clients), y(m.run.Rate))
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="2"><title>%s</title></path>`+"\n", strings.TrimSpace(d.String()), color, escape(name))
		for _, m := range res.measures[name] {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(m.clients), y(m.run.Rate), color)
		}
		ly := top + 10 + float64(i)*22
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"/>`+"\n", left+pw+20, ly, left+pw+48, ly, color)
		fmt.Fprintf(&b, `<text x="%g" y="%g" dominant-baseline="middle">%s</text>`+"\n", left+pw+56, ly, escape(name))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// decade labels 10^e: 1, 10, 100, 1k, 10k, 100k, 1M.
func decade(e float64) string {
	switch n := math.Pow(10, e); {
	case n >= 1e6:
		return fmt.Sprintf("%gM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%gk", n/1e3)
	default:
		return fmt.Sprintf("%g", n)
	}
}

func escape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

func writeSVG(path string, res *benchResult) error {
	return os.WriteFile(path, renderSVG(res), 0o644)
}
