package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"ds4go/engine"
	"ds4go/model"
	"ds4go/quant"
)

// Unit tests of the individual ops on small hand-computed cases.

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b)) }

func TestRMSNorm(t *testing.T) {
	x := []float32{3, 4}
	out := make([]float32, 2)
	rmsNorm(out, x, []float32{1, 2}, 0)
	r := 1 / math.Sqrt(12.5)
	if !near(float64(out[0]), 3*r, 1e-7) || !near(float64(out[1]), 8*r, 1e-7) {
		t.Errorf("rmsNorm = %v", out)
	}
	y := []float32{1, 1, 1, 1}
	rmsNormPlain(y, 3) // mean 1 + eps 3 → ×1/2
	if !slices.Equal(y, []float32{0.5, 0.5, 0.5, 0.5}) {
		t.Errorf("rmsNormPlain = %v", y)
	}
}

func TestRope(t *testing.T) {
	cs := make([]float32, 4)
	rotation(cs, []float32{1, 0.5}, 2) // angles 2 and 1
	want := []float64{math.Cos(2), math.Sin(2), math.Cos(1), math.Sin(1)}
	for i := range cs {
		if !near(float64(cs[i]), want[i], 1e-7) {
			t.Fatalf("rotation = %v, want %v", cs, want)
		}
	}
	// (1, 0) rotates to (cos, sin); (0, 1) to (−sin, cos).
	x := []float32{1, 0, 0, 1}
	rotate(x, cs)
	if !near(float64(x[0]), math.Cos(2), 1e-7) || !near(float64(x[1]), math.Sin(2), 1e-7) ||
		!near(float64(x[2]), -math.Sin(1), 1e-7) || !near(float64(x[3]), math.Cos(1), 1e-7) {
		t.Errorf("rotate = %v", x)
	}
	rotateInv(x, cs)
	for i, v := range []float32{1, 0, 0, 1} {
		if !near(float64(x[i]), float64(v), 1e-6) {
			t.Errorf("inverse rotation = %v", x)
		}
	}
	// The angle is f32(p)·freq rounded to f32 before cos/sin.
	rotation(cs[:2], []float32{0.1}, 3000)
	a := float64(float32(3000) * float32(0.1))
	if cs[0] != float32(math.Cos(a)) {
		t.Errorf("angle not rounded to f32: %v vs %v", cs[0], math.Cos(a))
	}
}

func TestSinkhorn(t *testing.T) {
	// HC 2, one iteration (only the initial column normalisation), eps 0.
	ln3 := float32(math.Log(3))
	m := make([]float32, 8)
	scale := []float32{1, 1, 1}
	base := []float32{0, ln3, 0, 0, 0, 0, ln3, 0}
	pre, post, comb := make([]float32, 2), make([]float32, 2), make([]float32, 4)
	sinkhorn(pre, post, comb, m, scale, base, 2, 1, 0)
	if !near(float64(pre[0]), 0.5, 1e-7) || !near(float64(pre[1]), 0.75, 1e-7) {
		t.Errorf("pre = %v", pre)
	}
	if post[0] != 1 || post[1] != 1 {
		t.Errorf("post = %v", post)
	}
	// Row softmax: [.5 .5; .75 .25]; column sums 1.25, .75.
	want := []float64{0.4, 2.0 / 3, 0.6, 1.0 / 3}
	for i := range comb {
		if !near(float64(comb[i]), want[i], 1e-6) {
			t.Fatalf("comb = %v, want %v", comb, want)
		}
	}
	// The mixing logits are scaled (scale[0] for pre, scale[2] for comb) and
	// eps is added after the sigmoid and the softmax.
	m = []float32{1, 0, 0, 0, 2, 0, 0, 0}
	sinkhorn(pre, post, comb, m, []float32{3, 1, 0.5}, make([]float32, 8), 2, 1, 0.25)
	if !near(float64(pre[0]), 1/(1+math.Exp(-3))+0.25, 1e-6) {
		t.Errorf("pre with scale/eps = %v", pre)
	}
	r0 := math.Exp(1) / (math.Exp(1) + 1) // row 0 softmax of (1, 0)
	c00 := (r0 + 0.25) / ((r0 + 0.25) + (0.5 + 0.25) + 0.25)
	if !near(float64(comb[0]), c00, 1e-6) {
		t.Errorf("comb[0] = %v, want %v", comb[0], c00)
	}
	// Many iterations converge to a doubly stochastic matrix.
	rng := rand.New(rand.NewPCG(1, 2))
	m = make([]float32, 24)
	for i := range m {
		m[i] = float32(rng.NormFloat64())
	}
	pre, post, comb = make([]float32, 4), make([]float32, 4), make([]float32, 16)
	sinkhorn(pre, post, comb, m, []float32{1, 1, 1}, make([]float32, 24), 4, 200, 1e-6)
	for j := 0; j < 4; j++ {
		var rs, cs float64
		for k := 0; k < 4; k++ {
			rs += float64(comb[j*4+k])
			cs += float64(comb[k*4+j])
		}
		if !near(rs, 1, 1e-4) || !near(cs, 1, 1e-4) {
			t.Errorf("row %d sum %g, column sum %g", j, rs, cs)
		}
	}
}

func TestAttendHeadSink(t *testing.T) {
	q := []float32{1, 0}
	keys := [][]float32{{1, 0}, {0, 1}}
	out := make([]float32, 2)
	scores := make([]float32, 2)
	e := math.E
	for _, sink := range []float64{-1e30, 0, 2} {
		AttendHead(out, q, keys, scores, float32(sink), 1, 0)
		z := e + 1 + math.Exp(sink)
		if !near(float64(out[0]), e/z, 1e-6) || !near(float64(out[1]), 1/z, 1e-6) {
			t.Errorf("sink %g: out = %v, want %v", sink, out, []float64{e / z, 1 / z})
		}
	}
	// The scale multiplies q·k.
	AttendHead(out, q, keys, scores, -1e30, 2, 0)
	z := e*e + 1
	if !near(float64(out[0]), e*e/z, 1e-6) {
		t.Errorf("scaled: %v", out)
	}
}

func TestTopK(t *testing.T) {
	scores := []float32{3, 1, 3, 2, 5}
	out := make([]int32, 3)
	topK(scores, 3, out, make([]int32, 3))
	if !slices.Equal(out, []int32{0, 2, 4}) {
		t.Errorf("topK = %v", out)
	}
	topK(scores, 2, out[:2], make([]int32, 2)) // the tie at 3: the lower row
	if !slices.Equal(out[:2], []int32{0, 4}) {
		t.Errorf("topK of 2 = %v", out[:2])
	}
	out = make([]int32, 5)
	topK(scores, 5, out, make([]int32, 5))
	if !slices.Equal(out, []int32{0, 1, 2, 3, 4}) {
		t.Errorf("topK all = %v", out)
	}
	// Random cross-check against a full sort: the first 37, in row order.
	rng := rand.New(rand.NewPCG(3, 4))
	s := make([]float32, 1000)
	for i := range s {
		s[i] = float32(rng.IntN(50)) // many ties
	}
	idx := make([]int32, len(s))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		switch {
		case s[a] > s[b]:
			return -1
		case s[a] < s[b]:
			return 1
		}
		return 0
	})
	got := make([]int32, 37)
	topK(s, 37, got, make([]int32, 37))
	want := slices.Clone(idx[:37])
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("topK differs from a stable sort's first 37: %v, want %v", got, want)
	}
}

func TestFP8(t *testing.T) {
	cases := []struct{ in, want float32 }{
		{1, 1}, {1.0625, 1}, {1.1875, 1.25}, {1.2, 1.25}, {-3.3, -3.25}, {448, 448}, {447, 448},
		{240, 240}, {232, 224}, {248, 256}, // step 16 in [128, 256): ties to even
		{0.0029296875, 0.00390625}, // 1.5·2^−9 between subnormals 2^−9 and 2^−8
		{0.0009765625, 0},          // 2^−10: half the smallest subnormal, ties to 0
		{0.015625, 0.015625},       // 2^−6, the smallest normal
		{0, 0},
	}
	for _, c := range cases {
		if got := roundE4M3(c.in); got != c.want {
			t.Errorf("roundE4M3(%g) = %g, want %g", c.in, got, c.want)
		}
	}
	// Block scaling: amax 10 → scale 2^ceil(log2(10/448)) = 2^−5.
	x := make([]float32, 64)
	x[0], x[1], x[2] = 10, 1.03, -0.001
	fp8Simulate(x)
	s := float32(1.0 / 32)
	if x[0] != roundE4M3(10/s)*s || x[1] != roundE4M3(1.03/s)*s || x[2] != roundE4M3(-0.001/s)*s {
		t.Errorf("fp8Simulate: %v", x[:3])
	}
	if x[0] != 10 || x[1] != 1 || x[2] != -0x1p-10 { // 32.96 → 32 (step 4), −0.032 → −2^−5
		t.Errorf("fp8Simulate values: %v", x[:3])
	}
	// All-zero blocks use amax 1e-4 and stay zero.
	z := make([]float32, 64)
	fp8Simulate(z)
	for _, v := range z {
		if v != 0 {
			t.Fatal("zero block changed")
		}
	}
	if pow2Ceil(1) != 1 || pow2Ceil(1.5) != 2 || pow2Ceil(0.3) != 0.5 || pow2Ceil(0x1p-10) != 0x1p-10 {
		t.Error("pow2Ceil")
	}
}

func TestFP4(t *testing.T) {
	cases := []struct{ in, want float32 }{
		{0.25, 0}, {0.26, 0.5}, {0.75, 1}, {1.25, 1}, {1.75, 2}, {2.5, 2}, {3.5, 4}, {5, 4}, {5.5, 6}, {-6, -6}, {-0.7, -0.5},
	}
	for _, c := range cases {
		if got := roundE2M1(c.in); got != c.want {
			t.Errorf("roundE2M1(%g) = %g, want %g", c.in, got, c.want)
		}
	}
	x := make([]float32, 32)
	x[0], x[1] = 3, 0.7 // amax 3 → scale 2^ceil(log2(0.5)) = 0.5: 6·0.5, 1.4→1.5·0.5
	fp4Simulate(x)
	if x[0] != 3 || x[1] != 0.75 {
		t.Errorf("fp4Simulate: %v", x[:2])
	}
}

func TestHadamard(t *testing.T) {
	x := []float32{1, 2, 3, 4}
	hadamard(x)
	if !slices.Equal(x, []float32{5, -1, -2, 0}) {
		t.Errorf("hadamard = %v", x)
	}
	// Orthonormal: applying it twice is the identity.
	rng := rand.New(rand.NewPCG(5, 6))
	y := make([]float32, 128)
	for i := range y {
		y[i] = float32(rng.NormFloat64())
	}
	z := slices.Clone(y)
	hadamard(z)
	hadamard(z)
	for i := range y {
		if !near(float64(z[i]), float64(y[i]), 1e-5) {
			t.Fatalf("H·H·y ≠ y at %d: %g vs %g", i, z[i], y[i])
		}
	}
}

// testBackend is a Backend with just a config and a pool, for op tests.
func testBackend(c model.Config) *Backend {
	return &Backend{cfg: c, pool: newPool(2)}
}

func TestCompressorPooling(t *testing.T) {
	c := model.Config{RopeDim: 2, NormEps: 0}
	be := testBackend(c)
	defer be.pool.close()
	const w = 2
	run := func(ratio, coff int, kv, sc []float32, n int) *table {
		cp := &compressor{ratio: ratio, coff: coff, width: w, ape: make([]float32, ratio*coff*w), norm: []float32{1, 1}}
		b := &batch{be: be, n: n, pos: 0}
		kvT := &table{width: coff * w, cap: 2 * coff * ratio, ring: true, data: make([]float32, 2*coff*ratio*coff*w)}
		scT := &table{width: coff * w, cap: 2 * coff * ratio, ring: true, data: make([]float32, 2*coff*ratio*coff*w)}
		rows := &table{width: w, cap: 100}
		be.compress(b, cp, []float32{0}, kv, sc, kvT, scT, rows, func([]float32) {})
		return rows
	}
	// Overlapping ratio 4, equal scores: row 0 averages the second-half
	// features of block 0; row 1 the first half of block 0 and the second
	// half of block 1; then RMS normalisation.
	n := 8
	kv := make([]float32, n*2*w)
	for p := 0; p < n; p++ {
		kv[p*2*w+0] = float32(p)      // first half, channel 0
		kv[p*2*w+1] = 1               // first half, channel 1
		kv[p*2*w+2] = float32(10 * p) // second half, channel 0
		kv[p*2*w+3] = -1              // second half, channel 1
	}
	rows := run(4, 2, kv, make([]float32, n*2*w), n)
	norm := func(a, b float64) [2]float64 {
		r := 1 / math.Sqrt((a*a+b*b)/2)
		return [2]float64{a * r, b * r}
	}
	want0 := norm(15, -1)                       // mean of 0,10,20,30 and of −1s
	want1 := norm((0+1+2+3+40+50+60+70)/8.0, 0) // channel 1: (4·1 + 4·(−1))/8
	got0, got1 := rows.entry(0), rows.entry(1)
	for i := 0; i < 2; i++ {
		if !near(float64(got0[i]), want0[i], 1e-6) || !near(float64(got1[i]), want1[i], 1e-5) {
			t.Fatalf("overlap rows %v %v, want %v %v", got0, got1, want0, want1)
		}
	}
	// Plain pooling (coff 1, ratio 2) with a dominant score: the row takes
	// the high-score entry.
	kv = []float32{1, 2, 3, 4}
	sc := []float32{0, 100, 100, 0} // channel 0 → entry 1 (3), channel 1 → entry 0 (2)
	rows = run(2, 1, kv, sc, 2)
	want := norm(3, 2)
	if got := rows.entry(0); !near(float64(got[0]), want[0], 1e-6) || !near(float64(got[1]), want[1], 1e-6) {
		t.Errorf("plain row %v, want %v", got, want)
	}
}

// TestLinearBatchedEqualsSingle checks that a many-token product gives the
// same bits as one-token products, for every weight type, and agrees with
// quant.DotF32.
func TestLinearBatchedEqualsSingle(t *testing.T) {
	be := testBackend(model.Config{})
	defer be.pool.close()
	rng := rand.New(rand.NewPCG(7, 8))
	const rows, k, n = 33, 256, 5
	vals := make([]float32, rows*k)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	x := make([]float32, n*k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for _, typ := range []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_K, quant.Q2_K, quant.IQ2_XXS} {
		rb, _ := typ.RowBytes(k)
		data := make([]byte, int(rb)*rows)
		if typ == quant.F32 {
			for i, v := range vals {
				binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
			}
		} else if err := quant.Quantize(typ, vals, data); err != nil {
			t.Fatal(err)
		}
		m, err := newMat(&model.Tensor{Name: "w", Type: typ, Dims: []uint64{k, rows}, Data: data}, rows, k)
		if err != nil {
			t.Fatal(err)
		}
		var sc scratch
		yb := make([]float32, n*rows)
		be.linear(&sc, x, k, n, linJob{m, yb, rows})
		for tk := 0; tk < n; tk++ {
			y1 := make([]float32, rows)
			be.linear(&sc, x[tk*k:], k, 1, linJob{m, y1, rows})
			for r := 0; r < rows; r++ {
				if y1[r] != yb[tk*rows+r] {
					t.Fatalf("%s: token %d row %d: batched %g, single %g", typ, tk, r, yb[tk*rows+r], y1[r])
				}
				ref, _ := quant.DotF32(typ, m.row(r), x[tk*k:(tk+1)*k])
				tol := 1e-5
				if !isFloat(typ) {
					tol = 0.05 // activation quantization
				}
				if !near(float64(y1[r]), float64(ref), tol*math.Sqrt(k)) {
					t.Errorf("%s: row %d: %g, reference %g", typ, r, y1[r], ref)
				}
			}
		}
	}
}

// The state layout the engine gives and the backend's tables agree.
func TestStateTables(t *testing.T) {
	c := model.Flash()
	c.Layers = 4
	c.CompressRatios = model.FlashRatios(4)
	be := &Backend{cfg: c}
	lay, _ := engine.NewStateLayout(&c, 4096, 8)
	si, err := be.NewState(lay)
	if err != nil {
		t.Fatal(err)
	}
	st := si.(*state)
	for l := 0; l < c.Layers; l++ {
		for _, p := range lay.Parts(l) {
			tb := st.layers[l][p]
			if tb == nil || tb.width != lay.Width(l, p) || tb.cap != lay.Capacity(l, p) || tb.ring != p.ByPosition() {
				t.Errorf("layer %d %s: table %+v", l, p, tb)
			}
		}
	}
	// Round trip through ReadState/WriteState, ring wrap-around included.
	w := lay.Width(2, engine.PartCompKV)
	src := make([]float32, 5*w)
	for i := range src {
		src[i] = float32(i)
	}
	if err := be.WriteState(si, 2, engine.PartCompKV, 1000, 5, src); err != nil {
		t.Fatal(err)
	}
	dst := make([]float32, 5*w)
	if err := be.ReadState(si, 2, engine.PartCompKV, 1000, 5, dst); err != nil || !slices.Equal(src, dst) {
		t.Errorf("ring round trip: %v", err)
	}
	if err := be.ReadState(si, 3, engine.PartComp, 0, 1, dst); err == nil {
		t.Error("reading unwritten rows succeeded")
	}
	if err := be.ReadState(si, 0, engine.PartComp, 0, 1, dst); err == nil {
		t.Error("reading a part the layer lacks succeeded")
	}
}

// TestAttendHeadSegmented holds AttendHead's segmented order to the softmax
// it computes, in float64, for key counts below, at and past a segment and
// past several (the last segment short; past the 160 segments kept on the
// stack), with a sink that dominates, one that does not count, and scores
// spread wide enough that the segments' maxima differ; and it checks that
// the order is not the serial one's in disguise (some output differs in
// its bits for the longer cases).
func TestAttendHeadSegmented(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const hd = 24
	for _, nk := range []int{1, 5, 64, 65, 130, 640, 1299, 161*AttnSegmentKeys + 1} {
		for _, sink := range []float32{-1e30, 0.5, 30} {
			q := randomRows(rng, 1, hd, false)[0]
			keys := randomRows(rng, nk, hd, true) // scores of a few units apart between keys
			scale := float32(0.3)
			// the softmax in float64 from the same float32 scores
			sc := make([]float64, nk)
			mx := float64(sink)
			for k, row := range keys {
				sc[k] = float64(dotF32(q, row) * scale)
				mx = math.Max(mx, sc[k])
			}
			z := math.Exp(float64(sink) - mx)
			for k := range sc {
				sc[k] = math.Exp(sc[k] - mx)
				z += sc[k]
			}
			want := make([]float64, hd)
			for k, row := range keys {
				for d := range want {
					want[d] += sc[k] / z * float64(row[d])
				}
			}
			got, serial := make([]float32, hd), make([]float32, hd)
			scores := make([]float32, nk)
			AttendHead(got, q, keys, scores, sink, scale, AttnSegmentKeys)
			AttendHead(serial, q, keys, scores, sink, scale, 0)
			differs := false
			for d := range want {
				if !near(float64(got[d]), want[d], 2e-5) {
					t.Fatalf("%d keys, sink %g: out[%d] = %g, want %g", nk, sink, d, got[d], want[d])
				}
				differs = differs || math.Float32bits(got[d]) != math.Float32bits(serial[d])
			}
			if nk >= 640 && sink < 1 && !differs {
				t.Errorf("%d keys, sink %g: the segmented order's output is the serial order's bit for bit", nk, sink)
			}
		}
	}
}

// BenchmarkAttendHead times one head's attention on Flash's shape (512
// dims; a ratio-4 layer's 640 keys and a long ratio-128 layer's 2176) in
// the serial order and the segmented one.
func BenchmarkAttendHead(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	const hd = 512
	for _, nk := range []int{640, 2176} {
		q, keys := randomRows(rng, 1, hd, false)[0], randomRows(rng, nk, hd, false)
		out, scores := make([]float32, hd), make([]float32, nk)
		for _, o := range []struct {
			name string
			seg  int
		}{{"serial", 0}, {"segmented", AttnSegmentKeys}} {
			b.Run(fmt.Sprintf("keys=%d/%s", nk, o.name), func(b *testing.B) {
				for b.Loop() {
					AttendHead(out, q, keys, scores, 0.5, 0.044, o.seg)
				}
			})
		}
	}
}

// randomRows returns n rows of d standard normal values; spread scales each
// row by its own factor in [1, 4), drawn before the row's values.
func randomRows(rng *rand.Rand, n, d int, spread bool) [][]float32 {
	rows := make([][]float32, n)
	for k := range rows {
		rows[k] = make([]float32, d)
		w := float32(1)
		if spread {
			w = float32(1 + 3*rng.Float64())
		}
		for i := range rows[k] {
			rows[k][i] = w * float32(rng.NormFloat64())
		}
	}
	return rows
}
