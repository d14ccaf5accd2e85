package cuda

import "testing"

// TestFastDecodeOptions decodes one token at a time in fast mode through
// four Flash-shaped layers (ratios 0, 0, 4, 128: 136 tokens complete rows
// of both) with each library option that fuses decode-step launches at 0
// and at its default, with and without graphs: the same logits bit for bit
// (OptCompEmit: a compressor's emitted row in one launch).
func TestFastDecodeOptions(t *testing.T) {
	gpu(t)
	flash, w := flashLayers4(t)
	toks := testTokens(136, flash.Vocab)
	for _, gl := range []int{-1, 0} {
		for _, o := range []struct {
			name     string
			key, def int
		}{{"comp_emit", OptCompEmit, DefaultCompEmit}} {
			opts := Options{GraphLayers: gl, Fast: true}
			on := optionLogits(t, w, opts, o.key, o.def, o.def, 1, toks)
			off := optionLogits(t, w, opts, o.key, 0, o.def, 1, toks)
			if p, j, ok := firstDiff(on, off); !ok {
				t.Errorf("graph layers %d: %s 0: logit %d of position %d differs: %v against %v", gl, o.name, j, p, off[p][j], on[p][j])
			}
		}
	}
}
