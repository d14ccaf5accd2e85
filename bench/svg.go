package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

// WriteSVG draws two line charts from rows: prefill tok/s and generation
// tok/s against the frontier (log₂ axis). title goes above them.
func WriteSVG(w io.Writer, rows []Row, title string) error {
	const (
		cw, ch         = 460, 300 // one chart
		ml, mr, mt, mb = 70, 20, 40, 50
		width          = 2 * (cw + ml + mr)
		height         = ch + mt + mb + 30
	)
	bw := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="20" font-size="15" text-anchor="middle">%s</text>`+"\n", width/2, html.EscapeString(title))
	charts := []struct {
		name  string
		color string
		y     func(Row) float64
	}{
		{"prefill tok/s (new interval)", "#1f77b4", func(r Row) float64 { return r.PrefillTPS }},
		{"generation tok/s at frontier", "#d62728", func(r Row) float64 { return r.GenTPS }},
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		x := math.Log2(float64(r.Frontier))
		lo, hi = min(lo, x), max(hi, x)
	}
	if len(rows) == 0 {
		lo, hi = 0, 1
	}
	if hi-lo < 1 {
		lo, hi = lo-0.5, hi+0.5
	}
	for ci, c := range charts {
		ox, oy := ci*(cw+ml+mr)+ml, mt+10 // chart's top-left
		ymax := 0.0
		for _, r := range rows {
			ymax = max(ymax, c.y(r))
		}
		ymax = niceCeil(ymax)
		px := func(f int) float64 { return float64(ox) + (math.Log2(float64(f))-lo)/(hi-lo)*cw }
		py := func(v float64) float64 { return float64(oy+ch) - v/ymax*ch }
		p(`<text x="%d" y="%d" text-anchor="middle" font-size="13">%s</text>`+"\n", ox+cw/2, oy-8, c.name)
		p(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", ox, oy, cw, ch)
		for i := 0; i <= 5; i++ { // y grid
			v := ymax * float64(i) / 5
			y := py(v)
			p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", ox, y, ox+cw, y)
			p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", ox-6, y+4, fmtNum(v))
		}
		for _, r := range rows { // x ticks at the frontiers
			x := px(r.Frontier)
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, oy, x, oy+ch)
			p(`<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x, oy+ch+16, r.Frontier)
		}
		p(`<text x="%d" y="%d" text-anchor="middle">context frontier (tokens)</text>`+"\n", ox+cw/2, oy+ch+36)
		if len(rows) > 0 {
			p(`<polyline fill="none" stroke="%s" stroke-width="2" points="`, c.color)
			for _, r := range rows {
				p("%.1f,%.1f ", px(r.Frontier), py(c.y(r)))
			}
			p("\"/>\n")
			for _, r := range rows {
				p(`<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%d: %.2f</title></circle>`+"\n",
					px(r.Frontier), py(c.y(r)), c.color, r.Frontier, c.y(r))
				p(`<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="%s">%s</text>`+"\n",
					px(r.Frontier), py(c.y(r))-7, c.color, fmtNum(c.y(r)))
			}
		}
	}
	p("</svg>\n")
	return bw.Flush()
}

// niceCeil rounds v up to 1, 2 or 5 × a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func fmtNum(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
