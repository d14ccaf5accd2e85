package cuda

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
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
	d := gpu(t)
	// DS4_CUDA_TC_MIN_SEL=N: grouped tensor-core products from N selections
	// (every mode; the library default, 32, is restored at the end)
	if v, err := strconv.Atoi(os.Getenv("DS4_CUDA_TC_MIN_SEL")); err == nil {
		must(t, d.SetOption(OptTCMinSel, v))
		defer d.SetOption(OptTCMinSel, 32)
	}
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
	for _, m := range []struct {
		mode string
		opts Options
	}{
		{"exact, graph per token", Options{GraphLayers: 1 << 20}},
		{"exact, graph per layer", Options{GraphLayers: 1}},
		{"exact, recaptured graph per layer", Options{GraphLayers: 1, Recapture: true}},
		{"exact, recaptured graph per token", Options{GraphLayers: 1 << 20, Recapture: true}},
		{"exact, one stream, graph per layer", Options{GraphLayers: 1, OneStream: true}},
		{"exact, one stream, no graph", Options{GraphLayers: -1, OneStream: true}},
		{"exact, graph per 2 layers", Options{GraphLayers: 2}},
		{"exact, no graph", Options{GraphLayers: -1}},
		{"fast, graph per token", Options{Fast: true, GraphLayers: 1 << 20}},
		{"fast, graph per layer", Options{Fast: true, GraphLayers: 1}},
		{"fast, no graph", Options{Fast: true, GraphLayers: -1}},
	} {
		if f := os.Getenv("DS4_CUDA_BENCH_MODE"); f != "" && !strings.Contains(m.mode, f) {
			continue
		}
		be, err := New(w, m.opts)
		if err != nil {
			t.Fatal(err)
		}
		mode := m.mode
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

		if m.opts.GraphLayers > 0 {
			gs := be.GraphStats()
			fmt.Printf("  graph stats: %+v; per token: host %.3f ms, wait %.3f ms\n", gs,
				float64(gs.HostNs)/1e6/float64(gs.Captures), float64(gs.WaitNs)/1e6/float64(gs.Captures))
			s.Close()
			be.Close()
			continue
		}

		// per-op breakdown of one decode token, then of a prefill chunk
		opBreakdown(t, be, s, c, layers, 1)
		opBreakdown(t, be, s, c, layers, 512)
		s.Close()
		be.Close()
	}
}

// opBreakdown prints the time of each op of one chunk of ntok tokens at the
// session's position: host-timed with the device synchronised around every
// op (launch costs included, so the sum exceeds the pipelined chunk time),
// and GPU-timed (the op captured into a graph, launched between two events:
// kernels back to back, no host in the way). The first pass sizes the
// buffers.
func opBreakdown(t *testing.T, be *Backend, s *engine.Session, c model.Config, layers, ntok int) {
	toks := testTokens(ntok, c.Vocab)
	b, err := be.NewBatch(ntok)
	if err != nil {
		t.Fatal(err)
	}
	bb := b.(*batch)
	e0, err0 := be.dev.NewEvent()
	e1, err1 := be.dev.NewEvent()
	if err0 != nil || err1 != nil {
		t.Fatal(err0, err1)
	}
	times := map[string]time.Duration{}
	gpuMs := map[string]float64{}
	rep := 0
	op := func(name string, f func() error) {
		if rep == 1 && name != "head" && name != "embed" {
			if err := be.dev.BeginCapture(bb.s); err != nil {
				t.Fatal(err)
			}
			if err := f(); err != nil {
				t.Fatal(err)
			}
			g, err := be.dev.EndCapture(bb.s)
			if err != nil {
				t.Fatal(err)
			}
			if err := be.dev.Record(e0, bb.s); err != nil {
				t.Fatal(err)
			}
			if err := be.dev.Launch(g, bb.s); err != nil {
				t.Fatal(err)
			}
			if err := be.dev.Record(e1, bb.s); err != nil {
				t.Fatal(err)
			}
			if err := be.dev.SyncEvent(e1); err != nil {
				t.Fatal(err)
			}
			ms, err := be.dev.Elapsed(e0, e1)
			if err != nil {
				t.Fatal(err)
			}
			gpuMs[name] += float64(ms)
			be.dev.DestroyGraph(g)
			return
		}
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
	// DS4_CUDA_PROFILE=N: the last (host-timed) pass of the N-token chunk
	// runs between profiler start and stop (scripts/cuda/profile.sh).
	profile := os.Getenv("DS4_CUDA_PROFILE") == strconv.Itoa(ntok)
	for rep = 0; rep < 3; rep++ {
		if rep != 1 {
			clear(times)
		}
		if profile && rep == 2 {
			if err := be.dev.Profiler(true); err != nil {
				t.Fatal(err)
			}
		}
		op("embed", func() error { return be.Embed(b, pos, toks) })
		for l := 0; l < layers; l++ {
			kind := fmt.Sprintf("ratio %d", c.Ratio(l))
			op("hc_pre", func() error { return be.HCPre(b, l, engine.AttnSub) })
			op("attention "+kind, func() error { return be.Attention(b, st, l) })
			op("hc_post", func() error { return be.HCPost(b, l, engine.AttnSub) })
			op("hc_pre", func() error { return be.HCPre(b, l, engine.FFNSub) })
			op("ffn", func() error { return be.FFN(b, l) })
			op("hc_post", func() error { return be.HCPost(b, l, engine.FFNSub) })
		}
		op("head", func() error { return be.Head(b, []int{ntok - 1}, logits) })
		if profile && rep == 2 {
			if err := be.dev.Profiler(false); err != nil {
				t.Fatal(err)
			}
		}
	}
	be.dev.DestroyEvent(e0)
	be.dev.DestroyEvent(e1)
	gsum := 0.0
	for _, v := range gpuMs {
		gsum += v
	}
	fmt.Printf("  chunk of %d token(s) at %d:\n  %-22s %8s %8s\n", ntok, pos, "op (sum over layers)", "host+sync", "GPU")
	names := make([]string, 0, len(times))
	for k := range times {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		fmt.Printf("  %-22s %8.3f %8.3f ms\n", k, float64(times[k].Microseconds())/1000, gpuMs[k])
	}
	fmt.Printf("  %-22s %8s %8.3f ms (embed, head excluded)\n", "GPU total", "", gsum)
	b.Release()
}
