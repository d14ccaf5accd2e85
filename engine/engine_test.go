package engine

import (
	"math"
	"testing"

	"ds4go/model"
)

func TestGreedy(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		logits []float32
		want   int32
	}{
		{[]float32{1, 3, 2}, 1},
		{[]float32{5, 5, 1}, 0},
		{[]float32{nan, 1, nan, 2}, 3},
		{[]float32{float32(math.Inf(-1)), -1e30}, 1},
	}
	for _, c := range cases {
		if got := Greedy(c.logits); got != c.want {
			t.Errorf("Greedy(%v) = %d, want %d", c.logits, got, c.want)
		}
		if got := NewSampler(SamplerOptions{}).Sample(c.logits); got != c.want {
			t.Errorf("zero sampler on %v = %d, want %d", c.logits, got, c.want)
		}
	}
}

func TestSamplerFilters(t *testing.T) {
	logits := []float32{0, 1, 2, 3, 4, 5, 6, 7} // probabilities rise with the id
	draw := func(o SamplerOptions, n int) map[int32]int {
		s := NewSampler(o)
		seen := map[int32]int{}
		for i := 0; i < n; i++ {
			seen[s.Sample(logits)]++
		}
		return seen
	}
	// top-k 1 is greedy.
	if seen := draw(SamplerOptions{Temperature: 1, TopK: 1, Seed: 3}, 200); len(seen) != 1 || seen[7] != 200 {
		t.Errorf("top-k 1: %v", seen)
	}
	// top-k 3 keeps 5, 6, 7.
	for id := range draw(SamplerOptions{Temperature: 1, TopK: 3, Seed: 3}, 2000) {
		if id < 5 {
			t.Errorf("top-k 3 drew %d", id)
		}
	}
	// min-p 0.3: p_i / p_max = e^(i−7) ≥ 0.3 keeps 6 and 7 only.
	for id := range draw(SamplerOptions{Temperature: 1, MinP: 0.3, Seed: 3}, 2000) {
		if id < 6 {
			t.Errorf("min-p 0.3 drew %d", id)
		}
	}
	// top-p 0.5: p7 ≈ 0.63 alone reaches it.
	if seen := draw(SamplerOptions{Temperature: 1, TopP: 0.5, Seed: 3}, 500); len(seen) != 1 || seen[7] != 500 {
		t.Errorf("top-p 0.5: %v", seen)
	}
	// Plain sampling at temperature 1 follows the softmax.
	seen := draw(SamplerOptions{Temperature: 1, Seed: 9}, 20000)
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	for id, l := range logits {
		p := math.Exp(float64(l)) / z
		got := float64(seen[int32(id)]) / 20000
		if math.Abs(got-p) > 4*math.Sqrt(p*(1-p)/20000)+1e-3 {
			t.Errorf("token %d drawn with frequency %.4f, want %.4f", id, got, p)
		}
	}
	// A high temperature flattens, a low one sharpens.
	hot := draw(SamplerOptions{Temperature: 100, Seed: 1}, 4000)
	cold := draw(SamplerOptions{Temperature: 0.05, Seed: 1}, 4000)
	if hot[0] < 300 || cold[7] != 4000 {
		t.Errorf("temperature: hot %v cold %v", hot, cold)
	}
}

func TestSamplerDeterministic(t *testing.T) {
	logits := make([]float32, 1000)
	for i := range logits {
		logits[i] = float32(math.Sin(float64(i)) * 4)
	}
	o := SamplerOptions{Temperature: 0.9, TopK: 50, TopP: 0.9, MinP: 0.01, Seed: 42}
	a, b := NewSampler(o), NewSampler(o)
	c := NewSampler(SamplerOptions{Temperature: 0.9, TopK: 50, TopP: 0.9, MinP: 0.01, Seed: 43})
	diff := 0
	for i := 0; i < 200; i++ {
		x, y, z := a.Sample(logits), b.Sample(logits), c.Sample(logits)
		if x != y {
			t.Fatalf("draw %d: %d vs %d with the same seed", i, x, y)
		}
		if x != z {
			diff++
		}
	}
	if diff == 0 {
		t.Error("different seeds drew the same 200 tokens")
	}
}

func testConfig() *model.Config {
	c := model.Flash()
	c.Layers = 4
	c.CompressRatios = model.FlashRatios(4) // 0, 0, 4, 128
	c.SwigluClamp = c.SwigluClamp[:4]
	return &c
}

func TestLayout(t *testing.T) {
	c := testConfig()
	l, err := NewStateLayout(c, 1<<20, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(l.Parts(0)); got != 1 {
		t.Errorf("ratio-0 layer has %d parts", got)
	}
	if got := len(l.Parts(2)); got != 7 {
		t.Errorf("ratio-4 layer has %d parts", got)
	}
	if got := len(l.Parts(3)); got != 4 {
		t.Errorf("ratio-128 layer has %d parts", got)
	}
	checks := []struct {
		layer int
		part  StatePart
		width int
		cap   int
	}{
		{0, PartWindow, 512, 138},
		{2, PartCompKV, 1024, 18},
		{2, PartIndexScore, 256, 18},
		{2, PartIndex, 128, 1 << 18},
		{3, PartCompScore, 512, 138},
		{3, PartComp, 512, 1 << 13},
	}
	for _, ck := range checks {
		if w, cp := l.Width(ck.layer, ck.part), l.Capacity(ck.layer, ck.part); w != ck.width || cp != ck.cap {
			t.Errorf("layer %d %s: width %d cap %d, want %d %d", ck.layer, ck.part, w, cp, ck.width, ck.cap)
		}
	}
	// What position p needs.
	needs := []struct {
		layer int
		part  StatePart
		pos   int
		want  int
	}{
		{0, PartWindow, 5, 0},
		{0, PartWindow, 300, 173},
		{2, PartCompKV, 9, 4}, // block 2 started at 8; overlap needs block 1
		{2, PartCompKV, 8, 4}, // a fresh block still pools with block 1
		{2, PartCompKV, 3, 0}, //
		{3, PartCompKV, 300, 256},
		{3, PartCompKV, 256, 256}, // nothing: the block starts now
	}
	for _, n := range needs {
		if got := l.Need(n.layer, n.part, n.pos); got != n.want {
			t.Errorf("layer %d %s at %d needs from %d, want %d", n.layer, n.part, n.pos, got, n.want)
		}
	}
}

func TestRetention(t *testing.T) {
	c := testConfig()
	l, _ := NewStateLayout(c, 1<<20, 10) // window ring 138, ratio-4 ring 18, ratio-128 ring 138
	r := newRetention(l)
	// Prefill 300 tokens in chunks of 100.
	for p := 0; p < 300; p += 100 {
		if !r.continuable(p) {
			t.Fatalf("not continuable at %d", p)
		}
		r.written(p, 100)
	}
	if got := r.first(0, PartWindow, 300); got != 162 {
		t.Errorf("window retains from %d, want 162", got)
	}
	if got := r.first(2, PartCompKV, 300); got != 282 {
		t.Errorf("ratio-4 frontier retains from %d, want 282", got)
	}
	// Rewinding 10 positions is fine; 20 is too far for the ratio-4 ring
	// (position 280 needs block 69 = 276…279 for the overlap).
	if !r.continuable(290) || r.continuable(280) {
		t.Errorf("continuable(290) = %v, continuable(280) = %v", r.continuable(290), r.continuable(280))
	}
	// After a rewind to 295, re-writing positions 295… keeps 285… retained.
	r.written(295, 1)
	if got := r.first(2, PartCompKV, 296); got != 282 {
		t.Errorf("after rewind: ratio-4 frontier retains from %d, want 282", got)
	}
	// Rewinding to 0 and writing position 0 makes position 1 continuable.
	r.written(0, 1)
	if !r.continuable(1) {
		t.Error("position 1 after rewriting position 0 is not continuable")
	}
	// A cancelled chunk of 200 at 1 overwrote everything the window needs.
	r.written(1, 200)
	if r.continuable(1) {
		t.Error("continuable after a cancelled long chunk")
	}
}

func TestRopeFrequencies(t *testing.T) {
	c := testConfig()
	// Ratio-0 layer: plain 10000^(−2i/64).
	f0 := RopeFrequencies(c, 0)
	if len(f0) != 32 {
		t.Fatalf("%d frequencies", len(f0))
	}
	for i, f := range f0 {
		want := math.Pow(10000, -float64(2*i)/64)
		if math.Abs(float64(f)-want) > 1e-6*want {
			t.Errorf("pair %d: %g, want %g", i, f, want)
		}
	}
	// Compressed layer: base 160000 with YaRN factor 16 between the
	// correction dims low = floor(64·ln(65536/(32·2π))/(2·ln 160000)) = 15 and
	// high = ceil(64·ln(65536/(2π))/(2·ln 160000)) = 25.
	f2 := RopeFrequencies(c, 2)
	for i, f := range f2 {
		base := math.Pow(160000, -float64(2*i)/64)
		ramp := math.Min(math.Max((float64(i)-15)/(25-15), 0), 1)
		want := base/16*ramp + base*(1-ramp)
		if math.Abs(float64(f)-want) > 1e-6*want {
			t.Errorf("yarn pair %d: %g, want %g", i, f, want)
		}
	}
	if f2[0] != 1 || math.Abs(float64(f2[31])-math.Pow(160000, -62.0/64)/16) > 1e-12 {
		t.Errorf("yarn ends: %g %g", f2[0], f2[31])
	}
}
