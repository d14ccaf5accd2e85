package cuda

import (
	"fmt"
	"testing"

	"ds4go/synth"
)

// TestWarmLayers checks the layers the warm-up runs on Flash: the first
// of each kind — 0 (window only, hash-routed), 2 (ratio 4, hash-routed), 3
// (ratio 128, learned routing), 4 (ratio 4, learned routing); no layer of
// ratio 128 routes by hash, and the rest repeat these kinds.
func TestWarmLayers(t *testing.T) {
	c := synth.Flash(43)
	be := &Backend{cfg: c}
	if got := fmt.Sprint(be.warmLayers()); got != "[0 2 3 4]" {
		t.Fatalf("warm layers %s, want [0 2 3 4]", got)
	}
	c = synth.Flash(2) // two window-only hash-routed layers: one kind
	be = &Backend{cfg: c}
	if got := fmt.Sprint(be.warmLayers()); got != "[0]" {
		t.Fatalf("warm layers of two layers %s, want [0]", got)
	}
}

// TestWarmSmallSize checks DS4_CUDA_WARM_SMALL: unset the default, 0 no
// small chunk, a count that size, anything else an error.
func TestWarmSmallSize(t *testing.T) {
	for _, c := range []struct {
		env  string
		want int
		bad  bool
	}{{"", warmSmall, false}, {"0", 0, false}, {"512", 512, false}, {"-1", 0, true}, {"x", 0, true}} {
		t.Setenv("DS4_CUDA_WARM_SMALL", c.env)
		n, err := warmSmallSize()
		if (err != nil) != c.bad || (!c.bad && n != c.want) {
			t.Errorf("DS4_CUDA_WARM_SMALL=%q: %d, %v; want %d (error: %v)", c.env, n, err, c.want, c.bad)
		}
	}
}

// TestWarmUp checks that a backend warmed up at load (Options.WarmUp: a
// chunk and a step through one layer of each kind on its own batch and
// state) gives the same logits, bit for bit, as one that is not, in exact
// and fast mode, prefill and decode.
func TestWarmUp(t *testing.T) {
	gpu(t)
	c, w := flashLayers4(t)
	toks := testTokens(40, c.Vocab)
	for _, fast := range []bool{false, true} {
		cold := testBackend(t, w, Options{Fast: fast})
		want := allLogits(t, cold, 16, toks)
		wantG := greedy(t, cold, toks[:20], 8)
		warm := testBackend(t, w, Options{Fast: fast, WarmUp: true})
		got := allLogits(t, warm, 16, toks)
		gotG := greedy(t, warm, toks[:20], 8)
		if n := countDiff(want, got); n != 0 {
			t.Errorf("fast=%v: %d logits differ after the warm-up", fast, n)
		}
		if fmt.Sprint(wantG) != fmt.Sprint(gotG) {
			t.Errorf("fast=%v: greedy tokens %v after the warm-up, %v without", fast, gotG, wantG)
		}
	}
}
