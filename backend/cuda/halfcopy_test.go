package cuda

import (
	"testing"

	"ds4go/quant"
)

// TestHalfCopies checks fast mode's f16 copies of the Q8_0 weights
// (DS4_CUDA_HALF_COPY=1): the Flash-shaped q2 layers' Q8_0 tensors get
// one, and a prompt prefilled in chunks of 256 (through MatMulHalf) gives
// the same logits, bit for bit, as without them (the quants converted
// before each product).
func TestHalfCopies(t *testing.T) {
	gpu(t)
	c, w := flashLayers4(t)
	toks := testTokens(600, c.Vocab)
	t.Setenv("DS4_CUDA_HALF_COPY", "0")
	without := testBackend(t, w, Options{Fast: true})
	for _, x := range without.weights {
		if x.Half != 0 {
			t.Fatalf("DS4_CUDA_HALF_COPY=0: a %v tensor has an f16 copy", x.Type)
		}
	}
	want := allLogits(t, without, 256, toks)
	t.Setenv("DS4_CUDA_HALF_COPY", "1")
	with := testBackend(t, w, Options{Fast: true})
	copies := 0
	for _, x := range with.weights {
		if x.Half != 0 {
			copies++
			if x.Type != quant.Q8_0 {
				t.Errorf("a %v tensor has an f16 copy", x.Type)
			}
		}
	}
	if copies == 0 {
		t.Fatal("DS4_CUDA_HALF_COPY=1: no f16 copy made")
	}
	got := allLogits(t, with, 256, toks)
	if n := countDiff(want, got); n != 0 {
		t.Errorf("%d logits differ with the f16 copies (%d tensors)", n, copies)
	}
	t.Logf("%d Q8_0 tensors copied; logits bit-identical", copies)
}
