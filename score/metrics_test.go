package score

import (
	"math"
	"strings"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*max(1, math.Abs(b)) }

func TestRowError(t *testing.T) {
	cases := []struct {
		ref, got []float32
		want     float64
	}{
		{[]float32{1, -4, 2}, []float32{1, -4, 2}, 0},
		{[]float32{1, -4, 2}, []float32{1.5, -4, 2}, 0.5 / 4},
		{[]float32{1, -4, 2}, []float32{0, -3, 4}, 2.0 / 4},
		{[]float32{0, 0}, []float32{0, 0}, 0},
		{[]float32{0, 0}, []float32{0, 1}, math.Inf(1)},
	}
	for i, c := range cases {
		if got := RowError(c.ref, c.got); got != c.want {
			t.Errorf("case %d: %v, want %v", i, got, c.want)
		}
	}
}

func TestLogSoftmaxAndKL(t *testing.T) {
	// softmax(0, ln 3) = (1/4, 3/4).
	lp := LogSoftmax([]float32{0, float32(math.Log(3))}, nil)
	if !near(lp[0], math.Log(0.25), 1e-7) || !near(lp[1], math.Log(0.75), 1e-7) {
		t.Errorf("log-softmax %v", lp)
	}
	// Large logits must not overflow: shifting by 1e4 changes nothing.
	lp2 := LogSoftmax([]float32{1e4, 1e4 + float32(math.Log(3))}, nil)
	if !near(lp2[0], lp[0], 1e-3) || !near(lp2[1], lp[1], 1e-3) {
		t.Errorf("shifted log-softmax %v", lp2)
	}
	// KL((1/4,3/4) ‖ (1/2,1/2)) = 1/4 ln(1/2) + 3/4 ln(3/2).
	lq := LogSoftmax([]float32{5, 5}, nil)
	want := 0.25*math.Log(0.5) + 0.75*math.Log(1.5)
	if got := KL(lp, lq); !near(got, want, 1e-7) {
		t.Errorf("KL %v, want %v", got, want)
	}
	if got := KL(lp, lp); got != 0 {
		t.Errorf("KL(p‖p) = %v", got)
	}
	// A zero-probability reference entry contributes nothing, even when the
	// model gives it −inf.
	if got := KL([]float64{0, math.Inf(-1)}, []float64{0, math.Inf(-1)}); got != 0 {
		t.Errorf("KL with p = 0 entries: %v", got)
	}
}

func TestArgmaxQuantile(t *testing.T) {
	if got := Argmax([]float32{1, 3, 3, 2}); got != 1 {
		t.Errorf("argmax tie: %d", got)
	}
	s := []float64{1, 2, 3, 4}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.5, 2.5}, {0.95, 3.85}, {1, 4}} {
		if got := Quantile(s, c.q); !near(got, c.want, 1e-12) {
			t.Errorf("quantile %v: %v, want %v", c.q, got, c.want)
		}
	}
	if got := Quantile([]float64{7}, 0.95); got != 7 {
		t.Errorf("one value: %v", got)
	}
	if !math.IsNaN(Quantile(nil, 0.5)) {
		t.Error("no values: not NaN")
	}
}

func TestComparer(t *testing.T) {
	var c Comparer
	ref := [][]float32{{0, 1, 2}, {2, 0, 0}, {0, 0, 4}}
	got := [][]float32{{0, 1, 2}, {1, 2, 0}, {0, 0, 3}}
	for i := range ref {
		if err := c.Add(10+i, ref[i], got[i]); err != nil {
			t.Fatal(err)
		}
	}
	s := c.Summary()
	// Row errors 0, 1, 0.25: median 0.25, p95 = 0.25 + 0.9·0.75, max 1 at 11.
	if s.Rows != 3 || s.RelErrP50 != 0.25 || !near(s.RelErrP95, 0.925, 1e-12) || s.RelErrMax != 1 || s.RelErrMaxPos != 11 {
		t.Errorf("errors: %+v", s)
	}
	// Top-1: rows 0 and 2 agree, row 1 does not.
	if !near(s.Top1, 2.0/3, 1e-12) {
		t.Errorf("top1 %v", s.Top1)
	}
	kl1 := KL(LogSoftmax(ref[1], nil), LogSoftmax(got[1], nil))
	kl2 := KL(LogSoftmax(ref[2], nil), LogSoftmax(got[2], nil))
	if !near(s.KLMean, (kl1+kl2)/3, 1e-12) || s.KLMax != max(kl1, kl2) || kl1 <= 0 || kl2 <= 0 {
		t.Errorf("KL: %+v (rows %v %v)", s, kl1, kl2)
	}
	if err := c.Add(0, []float32{1}, []float32{1, 2}); err == nil {
		t.Error("rows of different lengths accepted")
	}
	if err := c.Add(0, []float32{float32(math.NaN())}, []float32{1}); err == nil {
		t.Error("NaN reference accepted")
	}
	if err := c.Add(0, []float32{1}, []float32{float32(math.Inf(1))}); err == nil {
		t.Error("infinite model logit accepted")
	}

	b := Bounds{MaxP50: 0.1, MaxKL: 1, MinTop1: 0.9}
	fails := b.Check(s)
	if len(fails) != 2 || !strings.Contains(fails[0], "median") || !strings.Contains(fails[1], "top-1") {
		t.Errorf("bounds: %q", fails)
	}
	if f := (Bounds{MaxP50: 0.25, MinTop1: 0.5}).Check(s); len(f) != 0 {
		t.Errorf("bounds at the limit: %q", f)
	}
	if f := b.Check(Summary{}); len(f) != 3 {
		t.Errorf("no rows: %q", f)
	}
}

func TestPerplexity(t *testing.T) {
	var p Perplexity
	ppl, e := p.Result()
	if !math.IsNaN(ppl) || !math.IsNaN(e) {
		t.Error("empty: not NaN")
	}
	// NLLs 1 and 3: mean 2, mean of squares 5, var 1, stderr sqrt(1/1).
	p.Add(1)
	p.Add(3)
	ppl, e = p.Result()
	if !near(ppl, math.Exp(2), 1e-12) || !near(e, math.Exp(2), 1e-12) {
		t.Errorf("ppl %v ± %v", ppl, e)
	}
	// A uniform model over 4 tokens has perplexity 4.
	var u Perplexity
	var scratch []float64
	for _, next := range []int32{0, 3, 1} {
		var nll float64
		nll, scratch = NLL([]float32{2, 2, 2, 2}, next, scratch)
		u.Add(nll)
	}
	if ppl, e := u.Result(); !near(ppl, 4, 1e-12) || e > 1e-12 {
		t.Errorf("uniform: %v ± %v", ppl, e)
	}
}

func TestPlanText(t *testing.T) {
	toks := make([]int32, 21)
	for i := range toks {
		toks[i] = int32(i + 100)
	}
	p, err := PlanText(toks, 1, 8, 0)
	if err != nil {
		t.Fatal(err)
	}
	// 21/8 = 2 windows; First 4; rows at offsets 4, 5, 6 of each.
	if p.Windows != 2 || p.PerWindow() != 3 || p.Scored() != 6 || p.Evaluated() != 16 {
		t.Errorf("plan %+v", p)
	}
	want := []int32{4, 5, 6, 12, 13, 14}
	for i, v := range p.Positions() {
		if v != want[i] {
			t.Errorf("positions %v, want %v", p.Positions(), want)
			break
		}
	}
	if w := p.window(1); w[0] != 1 || w[1] != 109 || len(w) != 8 || toks[8] != 108 {
		t.Errorf("window 1: %v (source changed: %v)", w, toks[8])
	}
	if p, _ := PlanText(toks, 1, 8, 1); p.Windows != 1 {
		t.Errorf("max windows: %d", p.Windows)
	}
	for _, c := range []struct{ n, ctx int }{{21, 3}, {7, 8}, {0, 8}} {
		if _, err := PlanText(toks[:c.n], 1, c.ctx, 0); err == nil {
			t.Errorf("%d tokens, ctx %d accepted", c.n, c.ctx)
		}
	}
}
