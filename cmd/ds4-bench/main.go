// Command ds4-bench walks a prompt to growing context frontiers and reports,
// at each, the prefill speed of the new interval, the greedy generation speed
// at the frontier and the KV state size, as CSV (and optionally an SVG plot).
//
//	ds4-bench [-m MODEL.gguf] [--backend cpu|cuda] [--frontiers 2048,4096,...]
//	          [--gen 32] [--ctx N] [--chunk N] [--prompt FILE] [--seed N]
//	          [--csv FILE] [--plot FILE.svg] [--time-limit DUR]
//	          [--fast] [--graph-layers N] [--recapture] [--cpuprofile FILE]
//	ds4-bench --plot-csv IN.csv --plot OUT.svg     (plot an existing CSV)
//
// Without -m it runs ./ds4flash.gguf when present, else the built-in demo
// model (synth.Demo: random weights, the real tokenizer).
// The prompt is random valid token ids from --seed, or --prompt's text
// tokenized (repeated to the last frontier). After each frontier's
// generation the session is rewound to the frontier.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"ds4go/backend/cuda"
	"ds4go/bench"
	"ds4go/engine"
	"ds4go/loader"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ds4-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("m", "", "GGUF model (default ./ds4flash.gguf, else the built-in demo model)")
	backend := fs.String("backend", "cpu", "backend: cpu or cuda")
	frontiers := fs.String("frontiers", "2048,4096,8192,16384,32768", "ascending context frontiers")
	gen := fs.Int("gen", 32, "tokens generated at each frontier (greedily, unless --temp)")
	ctxLen := fs.Int("ctx", 0, "session context size (default: last frontier + gen + 1)")
	chunk := fs.Int("chunk", 0, "prefill chunk size (engine default when 0)")
	promptFile := fs.String("prompt", "", "text file to tokenize as the prompt (default: random token ids)")
	seed := fs.Uint64("seed", 1, "seed of the random prompt")
	csvPath := fs.String("csv", "", "CSV output file (default: stdout)")
	plot := fs.String("plot", "", "also write an SVG plot to this file")
	plotCSV := fs.String("plot-csv", "", "only plot this CSV (written by ds4-bench) to --plot")
	threads := fs.Int("threads", 0, "CPU backend threads (all cores when 0)")
	fast := fs.Bool("fast", false, "CUDA backend: fast mode (parallel sums, prompts' attention and indexer scores in f16 on the tensor cores, their Q8_0 and F16 products in f16 through cuBLAS, decode attention split over the keys)")
	graphLayers := fs.Int("graph-layers", 0, "CUDA backend: decode through CUDA graphs of N layers each (0: the default, 1; -1: plain launches)")
	recapture := fs.Bool("recapture", false, "CUDA backend: capture every decode token's graphs again instead of replaying recorded ones (for comparison)")
	noWarm := fs.Bool("no-warm", false, "do not ready the backend at load (CUDA: a prefill chunk through one layer of each kind, so that the first row leaves out the kernels' and cuBLAS's one-time costs; CPU: the weights paged in), as the ds4 CLI and ds4-server do")
	warmup := fs.Int("warmup", 0, "prefill this many tokens first and rewind, so that the rows leave out one-time costs (kernel loading, scratch allocation) as a running server does")
	hostGreedy := fs.Bool("host-greedy", false, "generate one step at a time, the host choosing each token (greedy, or the draw with --temp) from the downloaded logits (the way before the device's pipelines; for comparison)")
	temp := fs.Float64("temp", 0, "sample the generated tokens at this temperature (0: greedy), with --top-k, --top-p, --min-p")
	topK := fs.Int("top-k", 0, "with --temp: keep the K most likely tokens (0: all)")
	topP := fs.Float64("top-p", 1, "with --temp: nucleus sampling (1: off)")
	minP := fs.Float64("min-p", 0.05, "with --temp: drop tokens below this fraction of the best one's probability (ds4-server's default)")
	sampleSeed := fs.Uint64("sample-seed", 1, "with --temp: the sampler's seed")
	limit := fs.Duration("time-limit", 0, "stop this long after the start (loading included), keeping the frontiers completed (0: none)")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the run (after loading) to this file")
	mtp := fs.String("mtp", "", "speculative decoding with an MTP block (greedy, or sampled with --temp: the same tokens either way, but for near ties --fast may flip): a separate MTP `FILE`, or \"model\" for the model file's own block")
	draftAlways := fs.Bool("draft-always", false, "with --mtp: verify every draft, never pausing speculation while the drafts' acceptance is too low to pay (engine.Options.DraftAlways: the cost of a pass that commits nothing, at --accept 0)")
	accept := fs.String("accept", "", "with --mtp: time speculative decoding with the drafts committed at these `RATES` (comma-separated, 0-1; one run each) whatever the model's choice, against a plain run (greedy, or sampled with --temp): the speed a trained MTP block of that acceptance gives (random weights' drafts are never right; the tokens are then not plain decoding's)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ds4-bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	started := time.Now()
	fail := func(err error) int { fmt.Fprintln(stderr, "ds4-bench:", err); return 1 }
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "ds4-bench: "+format+"\n", a...) }

	if *plotCSV != "" {
		if *plot == "" {
			return fail(errors.New("--plot-csv needs --plot"))
		}
		f, err := os.Open(*plotCSV)
		if err != nil {
			return fail(err)
		}
		rows, err := bench.ReadCSV(f)
		f.Close()
		if err != nil {
			return fail(err)
		}
		if err := writePlot(*plot, rows, "ds4-bench: "+*plotCSV); err != nil {
			return fail(err)
		}
		return 0
	}

	fr, err := bench.ParseFrontiers(*frontiers)
	if err != nil {
		return fail(err)
	}
	if *gen < 0 {
		return fail(fmt.Errorf("--gen %d is negative", *gen))
	}
	last := fr[len(fr)-1]
	need := last + *gen + 1
	if *ctxLen == 0 {
		*ctxLen = need
	} else if *ctxLen < need {
		return fail(fmt.Errorf("--ctx %d is below the last frontier %d + gen %d + 1", *ctxLen, last, *gen))
	}

	// Model and backend.
	t0 := time.Now()
	var rates []float64
	for _, f := range strings.Split(*accept, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return fail(fmt.Errorf("--accept: %q is not a rate in [0, 1]", f))
		}
		rates = append(rates, r)
	}
	if len(rates) > 0 && *mtp == "" {
		return fail(errors.New("--accept needs --mtp"))
	}
	mtpPath := *mtp
	if mtpPath == "model" {
		mtpPath = ""
	}
	m, err := loader.Open(loader.Options{Path: *modelPath, MTPPath: mtpPath, Backend: strings.ToLower(*backend), Threads: *threads,
		Warm: !*noWarm, CUDA: cuda.Options{Fast: *fast, GraphLayers: *graphLayers, Recapture: *recapture}})
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	if *mtp != "" && !m.HasMTP() {
		return fail(fmt.Errorf("%s has no MTP block (--mtp FILE loads a separate one)", m.Name))
	}
	be, c := m.Backend, m.Config
	logf("model %s: %v; backend %s ready in %.2f s (map %.2f s, validate %.2f s, backend %.2f s)", m.Name, m.Weights, *backend,
		time.Since(t0).Seconds(), m.MapTime.Seconds(), m.LoadTime.Seconds(), m.BackendTime.Seconds())
	if *ctxLen > c.ContextLen && c.ContextLen > 0 {
		return fail(fmt.Errorf("context %d exceeds the model's %d", *ctxLen, c.ContextLen))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(fmt.Errorf("cpu profile: %w", err))
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(fmt.Errorf("cpu profile: %w", err))
		}
		defer pprof.StopCPUProfile()
	}

	// Prompt.
	var prompt []int32
	if *promptFile != "" {
		text, err := os.ReadFile(*promptFile)
		if err != nil {
			return fail(err)
		}
		toks := m.Tokenizer.Encode(string(text))
		if len(toks) == 0 {
			return fail(fmt.Errorf("%s tokenizes to nothing", *promptFile))
		}
		logf("prompt %s: %d tokens (repeated to %d)", *promptFile, len(toks), last)
		prompt = bench.Repeat(toks, last)
	} else {
		prompt = bench.RandomTokens(last, c.Vocab, *seed)
	}

	// Output.
	out := stdout
	if *csvPath != "" {
		cf, err := os.Create(*csvPath)
		if err != nil {
			return fail(err)
		}
		defer cf.Close()
		out = cf
	}
	cw, err := bench.NewCSVWriter(out)
	if err != nil {
		return fail(err)
	}

	ctx := context.Background()
	if *limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, started.Add(*limit))
		defer cancel()
	}
	var werr error
	var st engine.Stats
	runs := []float64{-1} // the block's own drafts (or none)
	if len(rates) > 0 {
		runs = rates
	}
	status := 0
	var rows []bench.Row
	for i, rate := range runs {
		so := engine.Options{ChunkSize: *chunk, MaxContext: *ctxLen, Draft: *mtp != "", DraftAlways: *draftAlways}
		if rate >= 0 {
			so.RewindSlack = *gen + 8 // the oracle's rewinds stay in place
		}
		var acc *bench.Acceptance
		if rate >= 0 {
			if acc, err = bench.NewAcceptance(rate, *seed); err != nil {
				return fail(err)
			}
			so.ForceAccept = acc.Accept
			logf("drafts committed at the rate %g", rate)
		}
		s, err := engine.NewSession(be, so)
		if err != nil {
			return fail(err)
		}
		r, err := bench.Run(ctx, s, prompt, bench.Options{Frontiers: fr, Gen: *gen, Warmup: *warmup, HostGreedy: *hostGreedy, Accept: acc,
			Sampling: engine.SamplerOptions{Temperature: float32(*temp), TopK: *topK, TopP: float32(*topP), MinP: float32(*minP), Seed: *sampleSeed}, Progress: func(r bench.Row) {
				if e := cw.Write(r); e != nil && werr == nil {
					werr = e
				}
				logf("frontier %d: prefill %d tokens in %.2f s (%.1f tok/s), gen %d in %.2f s (%.2f tok/s), kv %.1f MiB",
					r.Frontier, r.PrefillTokens, r.PrefillS, r.PrefillTPS, r.GenTokens, r.GenS, r.GenTPS, float64(r.KVBytes)/(1<<20))
				if acc != nil {
					mode := "greedy"
					if *temp > 0 {
						mode = "sampled"
					}
					logf("frontier %d: speculative %.2f tok/s (%d drafts, %d committed: %.0f %%; %d only checked) against plain %s %.2f tok/s (×%.3f)",
						r.Frontier, r.GenTPS, r.Drafted, r.Accepted, 100*float64(r.Accepted)/float64(max(r.Drafted, 1)), r.Checked, mode, r.PlainGenTPS, r.GenTPS/r.PlainGenTPS)
				}
			}})
		st = s.Stats()
		s.Close()
		if i == 0 {
			rows = r
		}
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				logf("time limit %v reached: %d of %d frontiers done", *limit, len(r), len(fr))
			} else {
				fmt.Fprintln(stderr, "ds4-bench:", err)
				status = 1
			}
			break
		}
	}
	if werr != nil {
		fmt.Fprintln(stderr, "ds4-bench:", werr)
		status = 1
	}
	if *plot != "" {
		title := fmt.Sprintf("ds4-bench: %s, backend %s, gen %d", m.Name, *backend, *gen)
		if err := writePlot(*plot, rows, title); err != nil {
			return fail(err)
		}
	}
	logf("session stats (the last run): %+v", st)
	if g, ok := be.(interface{ GraphStats() cuda.GraphStats }); ok {
		if gs := g.GraphStats(); gs.Captures > 0 {
			per := func(ns int64) float64 { return float64(ns) / float64(gs.Captures) / 1e6 }
			logf("graph decode: %d tokens, host %.3f ms a token recording and launching, %.3f ms waiting in the head; %+v",
				gs.Captures, per(gs.HostNs), per(gs.WaitNs), gs)
			if gs.Rebuilds*8 > gs.Captures && gs.Captures >= 64 {
				logf("warning: %d decode graphs were built again for a shape that had one (%d tokens): a per-step structure is missing from the graph's shape, and decode pays a graph build for it", gs.Rebuilds, gs.Captures)
			}
		}
	}
	return status
}

func writePlot(path string, rows []bench.Row, title string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WriteSVG(f, rows, title); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
