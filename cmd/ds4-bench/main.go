// Command ds4-bench walks a prompt to growing context frontiers and reports,
// at each, the prefill speed of the new interval, the greedy generation speed
// at the frontier and the KV state size, as CSV (and optionally an SVG plot).
//
//	ds4-bench [-m MODEL.gguf] [--backend cpu|cuda] [--frontiers 2048,4096,...]
//	          [--gen 32] [--ctx N] [--chunk N] [--prompt FILE] [--seed N]
//	          [--csv FILE] [--plot FILE.svg] [--time-limit DUR]
//	          [--fast] [--graph-layers N] [--recapture] [--cpuprofile FILE]
//	          [--mtp FILE [--accept RATES]] [--settle N]
//	ds4-bench --plot-csv IN.csv --plot OUT.svg     (plot an existing CSV)
//	ds4-bench --backend cuda --frontiers 8192 --gen 256 --ab 'default;DS4_CUDA_X=0' [--rounds 5]
//	          [--ab-prefill 4096] [--mtp FILE [--accept RATE]]
//	          (an A/B of CUDA library options inside one process)
//
// Without -m it runs ./ds4flash.gguf when present, else the built-in demo
// model (synth.Demo: random weights, the real tokenizer).
// The prompt is random valid token ids from --seed, or --prompt's text
// tokenized (repeated to the last frontier). After each frontier's
// generation the session is rewound to the frontier. --settle N decodes N
// tokens untimed (then rewinds) before each timed decode, so that the rows
// measure a session past its first decode graphs' builds and, speculating,
// past its draft policy's start (a server's long-lived session); without
// it a row's decode includes them.
//
// With --ab, the CUDA backend's library options are compared inside one
// process instead (bench.RunAB): the prompt is prefilled to the one
// frontier, then each round times, once per variant, the prefill of
// --ab-prefill more tokens (if set) and the greedy decode of --gen tokens
// (if set), each variant being the starting options plus its own
// NAME=VALUE assignments (the library's environment variables, switched at
// run time, and the CUDA backend's own result-keeping switches such as
// DS4_CUDA_WO_Q8: cuda.Backend.SetOptionEnv), rewinding to the frontier
// after each. The CSV then has a line
// per run (round, variant, prefill_tokens, prefill_s, prefill_tps,
// gen_tokens, gen_s, gen_tps) and stderr a summary per variant against the
// first. With --mtp the decodes speculate (at one --accept rate if given,
// the same draws of commits for every variant). An option takes effect where the library
// reads it: for most, each launch; for a few (weight copies made at load),
// only at load, which --ab cannot switch.
package main

import (
	"context"
	"encoding/csv"
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
	mtpDraft := fs.Int("mtp-draft", 2, "with --mtp: tokens a speculative pass aims at, greedy decoding: 2 drafts one token with the MTP block; k > 2 drafts up to k-1, the block run again over its own output (greedy and sampled; on CUDA on the device up to 3, deeper on the engine's host path; only as deep as pays by the backend's measured costs unless --draft-always)")
	draftHost := fs.Bool("draft-host", false, "with --mtp: speculative passes on the engine's host path (the drafts' and the verification's logits downloaded, the choices made by the host), where they otherwise take the device's pipelined pass (CUDA: up to three drafts a pass; for comparison)")
	draftAlways := fs.Bool("draft-always", false, "with --mtp: verify every draft, never pausing speculation while the drafts' acceptance is too low to pay (engine.Options.DraftAlways: the cost of a pass that commits nothing, at --accept 0)")
	abSets := fs.String("ab", "", "CUDA backend: compare option `SETS` inside one process (the library's, and the backend's own switches such as DS4_CUDA_WO_Q8): ';'-separated variants, each space-separated DS4_CUDA_NAME=VALUE assignments on top of the starting options (\"default\": none), decoded --gen tokens each at the one frontier, interleaved for --rounds rounds")
	rounds := fs.Int("rounds", 3, "with --ab: timed rounds (each runs every variant once), after an untimed one")
	settleN := fs.Int("settle", 0, "tokens decoded untimed at each frontier before each timed decode (with --accept: before the plain and before the speculative one), then rewound: the timed run finds its decode graphs built and the draft policy past its start, as a server's long-lived session does (0: none; the timed runs then include their graph builds)")
	abSettle := fs.Int("ab-settle", 16, "with --ab: tokens decoded untimed after each switch, before the timed run (the decode graphs whose kernels changed are built again in the first steps)")
	abPrefill := fs.Int("ab-prefill", 0, "with --ab: also time the prefill of this many tokens from the frontier in each run (--gen 0: the prefill only)")
	accept := fs.String("accept", "", "with --mtp: time speculative decoding with the drafts committed at these `RATES` (comma-separated, 0-1; one run each; with --ab one rate, the same draws for every variant) whatever the model's choice, against a plain run (greedy, or sampled with --temp): the speed a trained MTP block of that acceptance gives (random weights' drafts are never right; the tokens are then not plain decoding's)")
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
	if *abSets != "" {
		switch {
		case len(fr) != 1:
			return fail(fmt.Errorf("--ab runs at one frontier, not %v", fr))
		case *gen+*abPrefill <= 0 || *abPrefill < 0 || *rounds <= 0 || *abSettle < 0:
			return fail(fmt.Errorf("--ab needs --gen or --ab-prefill > 0, --rounds > 0 and --ab-settle ≥ 0"))
		case *temp > 0 || *hostGreedy:
			return fail(errors.New("--ab decodes greedily: not with --temp or --host-greedy"))
		case strings.Contains(*accept, ","):
			return fail(fmt.Errorf("--ab takes one --accept rate, not %q", *accept))
		case strings.ToLower(*backend) != "cuda":
			return fail(fmt.Errorf("--ab switches CUDA library options: --backend cuda, not %s", *backend))
		}
		need = last + max(*gen, *abSettle, *abPrefill) + 1
	}
	if *ctxLen == 0 {
		*ctxLen = need
	} else if *ctxLen < need {
		return fail(fmt.Errorf("--ctx %d is below the last frontier %d + gen %d + 1", *ctxLen, last, *gen))
	}

	// Model and backend.
	t0 := time.Now()
	var rates []float64
	switch {
	case *settleN < 0:
		return fail(fmt.Errorf("--settle %d: not below 0", *settleN))
	case *settleN > 0 && *abSets != "":
		return fail(errors.New("--settle is for the frontier runs; --ab settles with --ab-settle"))
	case *hostGreedy && *accept != "":
		return fail(errors.New("--host-greedy times plain decoding: not with --accept"))
	}
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
	if *mtpDraft < 2 || *mtpDraft > engine.MaxDraftDepth+1 {
		return fail(fmt.Errorf("--mtp-draft %d must be 2..%d", *mtpDraft, engine.MaxDraftDepth+1))
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
		logf("prompt %s: %d tokens (repeated to %d)", *promptFile, len(toks), last+*abPrefill)
		prompt = bench.Repeat(toks, last+*abPrefill)
	} else {
		prompt = bench.RandomTokens(last+*abPrefill, c.Vocab, *seed)
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
	ctx := context.Background()
	if *limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, started.Add(*limit))
		defer cancel()
	}
	if *abSets != "" { // its own CSV columns: runAB writes the header
		opts, ok := be.(bench.OptionSetter)
		if !ok {
			return fail(fmt.Errorf("--ab switches CUDA options: --backend cuda, not %s", *backend))
		}
		ac := abConfig{sets: *abSets, frontier: last, prefill: *abPrefill, gen: *gen, rounds: *rounds, settle: *abSettle,
			warmup: *warmup, chunk: *chunk, ctxLen: *ctxLen, draft: *mtp != "", draftAlways: *draftAlways, draftDepth: *mtpDraft - 1}
		if len(rates) == 1 {
			if ac.accept, err = bench.NewAcceptance(rates[0], *seed); err != nil {
				return fail(err)
			}
		}
		return runAB(ctx, opts, be, prompt, out, ac, logf, fail)
	}
	cw, err := bench.NewCSVWriter(out)
	if err != nil {
		return fail(err)
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
		so := engine.Options{ChunkSize: *chunk, MaxContext: *ctxLen, Draft: *mtp != "", DraftAlways: *draftAlways, DraftDepth: *mtpDraft - 1}
		if *draftHost {
			so.DraftOverride = func(_ int, d int32) int32 { return d } // (the host path)
		}
		// every rewind in place (the oracle's, the settling's and each
		// frontier's after its decode): past the slack a rewind re-prefills
		// the whole frontier, which at 1M tokens takes minutes
		so.RewindSlack = max(*gen+8, *settleN+8, engine.DefaultRewindSlack)
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
		r, err := bench.Run(ctx, s, prompt, bench.Options{Frontiers: fr, Gen: *gen, Warmup: *warmup, HostGreedy: *hostGreedy, Accept: acc, Settle: *settleN,
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
			logf("graph decode: %d tokens, host %.3f ms a token recording and launching, %.3f ms waiting in the head; %d graphs built in %.1f ms; %+v",
				gs.Captures, per(gs.HostNs), per(gs.WaitNs), gs.Instantiates, float64(gs.BuildNs)/1e6, gs)
			if gs.Rebuilds*8 > gs.Captures && gs.Captures >= 64 {
				logf("warning: %d decode graphs were built again for a shape that had one (%d tokens): a per-step structure is missing from the graph's shape, and decode pays a graph build for it", gs.Rebuilds, gs.Captures)
			}
		}
	}
	return status
}

// abConfig is what runAB takes from the flags.
type abConfig struct {
	sets                                                          string
	frontier, prefill, gen, rounds, settle, warmup, chunk, ctxLen int
	// draft: speculative decoding with the model's MTP block (--mtp);
	// accept, if set, commits the drafts at its rate (--accept), reset
	// before each variant's runs so that every variant draws the same
	// commits.
	draft, draftAlways bool
	draftDepth         int // engine.Options.DraftDepth
	accept             *bench.Acceptance
}

// runAB is ds4-bench --ab: bench.RunAB over the option variants of sets,
// a CSV line per run to out and a summary line per variant to the log.
func runAB(ctx context.Context, dev bench.OptionSetter, be engine.Backend, prompt []int32, out io.Writer, c abConfig,
	logf func(string, ...any), fail func(error) int) int {
	variants, err := bench.OptionVariants(c.sets, dev)
	if err != nil {
		return fail(err)
	}
	so := engine.Options{ChunkSize: c.chunk, MaxContext: c.ctxLen, RewindSlack: max(c.gen, c.settle, c.prefill) + 8,
		Draft: c.draft, DraftAlways: c.draftAlways, DraftDepth: c.draftDepth}
	if c.accept != nil {
		so.ForceAccept = c.accept.Accept
		for i := range variants { // the same commits for every variant: the draws restart at its switch
			apply := variants[i].Apply
			variants[i].Apply = func() error {
				c.accept.Reset()
				return apply()
			}
		}
	}
	s, err := engine.NewSession(be, so)
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	cw := csv.NewWriter(out)
	cw.Write([]string{"round", "variant", "prefill_tokens", "prefill_s", "prefill_tps", "gen_tokens", "gen_s", "gen_tps"})
	cw.Flush()
	spec := ""
	if c.draft {
		spec = ", speculative (MTP drafts: the model's choice)"
		if c.accept != nil {
			spec = fmt.Sprintf(", speculative (MTP drafts committed at the rate %g)", c.accept.Rate())
		}
	}
	logf("A/B at %d: %d variants, an untimed round and %d timed ones of a %d-token prefill and a %d-token decode%s (%d untimed after each switch)",
		c.frontier, len(variants), c.rounds, c.prefill, c.gen, spec, c.settle)
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
	runs, err := bench.RunAB(ctx, s, prompt, variants, bench.ABOptions{Frontier: c.frontier, Prefill: c.prefill, Gen: c.gen,
		Rounds: c.rounds, Settle: c.settle, Warmup: c.warmup, Progress: func(r bench.ABRun) {
			name := variants[r.Variant].Name
			cw.Write([]string{strconv.Itoa(r.Round), name, strconv.Itoa(c.prefill), f(r.PrefillS), f(r.PrefillTPS),
				strconv.Itoa(c.gen), f(r.GenS), f(r.GenTPS)})
			cw.Flush()
			logf("ab round %d, %s: prefill %d in %.3f s (%.1f tok/s), gen %d in %.3f s (%.2f tok/s)", r.Round, name,
				c.prefill, r.PrefillS, r.PrefillTPS, c.gen, r.GenS, r.GenTPS)
		}})
	if c.prefill > 0 {
		for _, sum := range bench.SummarizeAB(variants, runs, bench.ABPrefill) {
			logf("ab prefill %s", sum)
		}
	}
	if c.gen > 0 {
		for _, sum := range bench.SummarizeAB(variants, runs, bench.ABDecode) {
			logf("ab decode %s", sum)
		}
	}
	if c.draft {
		st := s.Stats()
		logf("ab speculation over every run: %d drafts, %d committed, %d only checked", st.Drafted, st.Accepted, st.Checked)
	}
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		logf("time limit reached: %d of %d runs done", len(runs), c.rounds*len(variants))
	} else if err != nil {
		return fail(err)
	}
	if err := cw.Error(); err != nil {
		return fail(err)
	}
	return 0
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
