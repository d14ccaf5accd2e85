package cuda

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"ds4go/engine"
	"ds4go/model"
	"ds4go/synth"
)

// TestDecodeSpeed times batch-1 decode and a prefill of the whole backend on
// Flash-shaped layers (synth.Flash(DS4_CUDA_BENCH_LAYERS), default 6 layers:
// ratios 0, 0, 4, 128, 4, 128; q2 storage; 32 experts, of which 6 are used
// as in Flash), in exact and fast mode, plus a per-op breakdown of one decode
// token. It runs with DS4_CUDA_BENCH=1.
func TestDecodeSpeed(t *testing.T) {
	if os.Getenv("DS4_CUDA_BENCH") == "" {
		t.Skip("set DS4_CUDA_BENCH=1 to run the decode benchmark")
	}
	gpu(t)
	layers := 6
	if v, err := strconv.Atoi(os.Getenv("DS4_CUDA_BENCH_LAYERS")); err == nil && v > 0 {
		layers = v
	}
	c := synth.Flash(layers)
	c.Experts = 32
	start := time.Now()
	w := synthWeights(t, c, model.SchemeQ2)
	t.Logf("built %v in %v", w, time.Since(start))
	ctx := context.Background()
	for _, fast := range []bool{false, true} {
		be, err := New(w, Options{Fast: fast})
		if err != nil {
			t.Fatal(err)
		}
		mode := "exact"
		if fast {
			mode = "fast"
		}
		// prefill
		toks := testTokens(1024, c.Vocab)
		s, err := engine.NewSession(be, engine.Options{ChunkSize: 256, MaxContext: 8192})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Prefill(ctx, toks[:256]); err != nil { // warm-up
			t.Fatal(err)
		}
		s.Reset()
		start := time.Now()
		if err := s.Prefill(ctx, toks); err != nil {
			t.Fatal(err)
		}
		tp := time.Since(start)
		// decode
		const warm, steps = 4, 32
		for i := 0; i < warm; i++ {
			if err := s.Decode(ctx, toks[i]); err != nil {
				t.Fatal(err)
			}
		}
		start = time.Now()
		for i := 0; i < steps; i++ {
			if err := s.Decode(ctx, toks[i]); err != nil {
				t.Fatal(err)
			}
		}
		td := time.Since(start) / steps
		fmt.Printf("decode %s: %d layers at ctx ~%d: %.3f ms/token (%.1f tok/s); prefill of %d tokens (chunk 256): %.1f tok/s\n",
			mode, layers, len(toks)+warm, float64(td.Microseconds())/1000, 1/td.Seconds(), len(toks), float64(len(toks))/tp.Seconds())

		// per-op breakdown of one decode token (device synchronised around
		// every op, so the sum exceeds the pipelined token time)
		b, err := be.NewBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		times := map[string]time.Duration{}
		op := func(name string, f func() error) {
			t0 := time.Now()
			if err := f(); err != nil {
				t.Fatal(err)
			}
			if err := be.dev.Synchronize(); err != nil {
				t.Fatal(err)
			}
			times[name] += time.Since(t0)
		}
		st := s.State()
		pos := s.Pos()
		logits := make([]float32, c.Vocab)
		for rep := 0; rep < 2; rep++ {
			clear(times)
			op("embed", func() error { return be.Embed(b, pos, []int32{5}) })
			for l := 0; l < layers; l++ {
				kind := fmt.Sprintf("ratio %d", c.Ratio(l))
				op("hc_pre", func() error { return be.HCPre(b, l, engine.AttnSub) })
				op("attention "+kind, func() error { return be.Attention(b, st, l) })
				op("hc_post", func() error { return be.HCPost(b, l, engine.AttnSub) })
				op("hc_pre", func() error { return be.HCPre(b, l, engine.FFNSub) })
				op("ffn", func() error { return be.FFN(b, l) })
				op("hc_post", func() error { return be.HCPost(b, l, engine.FFNSub) })
			}
			op("head", func() error { return be.Head(b, []int{0}, logits) })
		}
		names := make([]string, 0, len(times))
		for k := range times {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			fmt.Printf("  %-22s %8.3f ms\n", k, float64(times[k].Microseconds())/1000)
		}
		b.Release()
		s.Close()
		be.Close()
	}
}
