package cuda

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/model"
)

// TestArgmax: Argmax picks what engine.Greedy picks — ties to the lower id,
// −0 equal to +0, NaNs never unless all are — for sizes below, at and past
// a vocabulary, aligned and not, and twice in a row (its work area must
// come back zero).
func TestArgmax(t *testing.T) {
	d := gpu(t)
	work := alloc(t, d, ArgmaxWork)
	must(t, d.MemsetAsync(work, 0, ArgmaxWork, 0))
	out := alloc(t, d, 4)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := math.Float32frombits(1 << 31)
	type tc struct {
		name string
		x    []float32
	}
	var cases []tc
	for _, n := range []int{1, 3, 1000, 129280, 129283, 1 << 20} {
		x := gaussian(n, uint64(n))
		cases = append(cases, tc{fmt.Sprintf("gaussian %d", n), x})
		y := slices.Clone(x)
		m := slices.Max(y) + 1
		y[n-1], y[n/2] = m, m // a tie: the lower id wins
		y[0] = nan
		cases = append(cases, tc{fmt.Sprintf("tie %d", n), y})
	}
	cases = append(cases,
		tc{"all nan", []float32{nan, nan, nan, nan, nan}},
		tc{"nan then values", []float32{nan, -3, -1, nan, -1, -2}},
		tc{"zeros", []float32{-1, -2, negZero, 0, -5, negZero, 0, -1}},
		tc{"zeros, +0 later", []float32{-1, -2, 0, negZero, -5, 0}},
		tc{"-inf", []float32{-inf, -inf, -inf}},
		tc{"+inf", []float32{1, inf, 2, inf}},
	)
	for _, c := range cases {
		for _, off := range []int{0, 1} { // aligned, and one float in
			if off >= len(c.x) {
				continue
			}
			x := c.x[off:]
			xp := upload(t, d, c.x)
			want := engine.Greedy(x)
			for rep := 0; rep < 2; rep++ {
				must(t, d.MemsetAsync(out, 0xff, 4, 0))
				must(t, d.Argmax(0, xp.Add(int64(4*off)), len(x), work, out))
				got := int32(math.Float32bits(download(t, d, out, 1)[0]))
				if got != want {
					t.Errorf("%s (offset %d, call %d): argmax %d, want %d", c.name, off, rep, got, want)
				}
			}
		}
	}
	if w := download(t, d, work, ArgmaxWork/4); slices.ContainsFunc(w, func(v float32) bool { return math.Float32bits(v) != 0 }) {
		t.Errorf("work area not left zero: %v", w)
	}
}

// TestGreedyPipeline: Session.DecodeGreedy on the CUDA backend (the choice
// made on the device, the next step queued before the host reads it) gives
// the CPU backend's 256 greedy tokens and leaves the session as the
// one-step loop does — with graphs, per-layer graph segments and plain
// launches, run to the end and stopped by a refused token.
func TestGreedyPipeline(t *testing.T) {
	gpu(t)
	eachTinyModel(t, func(t *testing.T, cfg model.Config, w *model.Weights, ref *cpu.Backend) {
		const gen = 256
		prompt := testTokens(40, cfg.Vocab)
		want := greedy(t, ref, prompt, gen)
		for _, gl := range []int{1 << 20, 1, -1} {
			be := testBackend(t, w, Options{GraphLayers: gl})
			ctx := context.Background()
			// to the end
			s := session(t, be, 64)
			if err := s.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			var got []int32
			n, err := s.DecodeGreedy(ctx, gen, func(tok int32) bool { got = append(got, tok); return true })
			if err != nil || n != gen {
				t.Fatalf("graph layers %d: %d decoded: %v", gl, n, err)
			}
			if st := be.GraphStats(); st.GreedyHeads < gen-1 {
				t.Errorf("graph layers %d: %d steps chosen on the device, want %d", gl, st.GreedyHeads, gen-1)
			}
			same := 0
			for same < gen && got[same] == want[same] {
				same++
			}
			if same < gen {
				t.Errorf("graph layers %d: pipelined greedy differs from the cpu's at token %d: %v… against %v…", gl, same,
					got[same:min(same+8, gen)], want[same:min(same+8, gen)])
			}
			// the session as after the one-step loop on the same backend
			plain := session(t, be, 64)
			if err := plain.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			for _, tok := range got {
				if err := plain.Decode(ctx, tok); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(s.Tokens(), plain.Tokens()) || !sameBits(s.Logits(), plain.Logits()) {
				t.Errorf("graph layers %d: the session after DecodeGreedy differs from the one-step loop's", gl)
			}
			// stopped by a refused token: the discarded step leaves no trace
			s2 := session(t, be, 64)
			if err := s2.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			offered := 0
			n, err = s2.DecodeGreedy(ctx, gen, func(int32) bool { offered++; return offered <= 100 })
			if err != nil || n != 100 {
				t.Fatalf("graph layers %d: refused at 101: %d decoded: %v", gl, n, err)
			}
			if l := s2.Logits(); engine.Greedy(l) != want[100] {
				t.Errorf("graph layers %d: after the refusal the logits choose %d, want %d", gl, engine.Greedy(l), want[100])
			}
			if err := s2.Decode(ctx, want[100]); err != nil {
				t.Fatal(err)
			}
			if engine.Greedy(s2.Logits()) != want[101] {
				t.Errorf("graph layers %d: after the refusal and one step the logits choose %d, want %d", gl,
					engine.Greedy(s2.Logits()), want[101])
			}
		}
	})
}

func sameBits(a, b []float32) bool {
	_, ok := firstBitDiff(a, b)
	return ok
}
