// Command ds4-score measures a model's next-token distribution: it writes
// the logits of a token sequence or a text to a safetensors file, compares
// them with a reference file (relative error, KL divergence, top-1
// agreement) and reports perplexity over a text, like llama-perplexity
// (with --kl-divergence). docs/score.md has the formats and definitions.
//
//	ds4-score [-m MODEL.gguf | --demo] --tokens SEQ.json [--prefill P] [--logits-out OUT.safetensors]
//	          [--ref REF.safetensors [--max-p50 X] [--max-kl X] [--min-top1 X]]
//	          [--prefill-chunk K] [--backend cpu|cuda] [--cuda-fast] [--threads N] [--json]
//	ds4-score [-m MODEL.gguf | --demo] --text FILE [--ctx 512] [--chunks N]
//	          [--save-logits OUT.safetensors] [--ref REF.safetensors ...]
//
// SEQ.json is {"tokens": [ids...], "prefill": P}: tokens[0:P] are prefilled,
// the rest fed one at a time; there is a logits row after the prefill and
// after each decode step. Exit status: 0 success, 1 error, 2 usage,
// 3 a --max-*/--min-* bound was not met.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"ds4go/backend/cuda"
	bars "ds4go/internal/progress"
	"ds4go/loader"
	"ds4go/score"
)

// Exit statuses.
const (
	exitOK     = 0
	exitError  = 1
	exitUsage  = 2
	exitBounds = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, isTerminal(os.Stderr))
	stop()
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// report is what --json prints.
type report struct {
	Model       string         `json:"model"`
	Backend     string         `json:"backend"`
	Mode        string         `json:"mode"` // "tokens" or "text"
	Tokens      int            `json:"tokens"`
	Prefill     int            `json:"prefill,omitempty"`
	Ctx         int            `json:"ctx,omitempty"`
	Windows     int            `json:"windows,omitempty"`
	Rows        int            `json:"rows"`
	Seconds     float64        `json:"seconds"`
	TokensPerS  float64        `json:"tokens_per_s"`
	Perplexity  *pplReport     `json:"perplexity,omitempty"`
	LogitsOut   string         `json:"logits_out,omitempty"`
	Ref         string         `json:"ref,omitempty"`
	Compare     *score.Summary `json:"compare,omitempty"`
	BoundsFails []string       `json:"bounds_failed,omitempty"`
}

type pplReport struct {
	PPL     float64 `json:"ppl"`
	StdErr  float64 `json:"stderr"`
	MeanNLL float64 `json:"mean_nll"`
	Scored  int     `json:"scored_tokens"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, tty bool) int {
	fs := flag.NewFlagSet("ds4-score", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("m", "", "GGUF model (default ./ds4flash.gguf, else the demo model)")
	demo := fs.Bool("demo", false, "use the built-in demo model")
	backend := fs.String("backend", "cpu", "backend: cpu or cuda")
	threads := fs.Int("threads", 0, "CPU backend threads (all cores when 0)")
	cudaFast := fs.Bool("cuda-fast", false, "CUDA backend: fast mode (parallel sums, prompts' attention and indexer scores in f16 on the tensor cores, their Q8_0 and F16 products in f16 through cuBLAS, decode attention split over the keys) instead of bit-exact")
	tokensPath := fs.String("tokens", "", `sequence file {"tokens": [ids...], "prefill": P}`)
	prefill := fs.Int("prefill", 0, "--tokens: prefill count, overriding the file's \"prefill\"")
	textPath := fs.String("text", "", "text file: perplexity over windows of --ctx tokens")
	ctxLen := fs.Int("ctx", 512, "--text: window size in tokens")
	chunks := fs.Int("chunks", 0, "--text: score at most this many windows (all when 0)")
	chunk := fs.Int("prefill-chunk", 0, "prefill chunk size (the engine default when 0)")
	logitsOut := fs.String("logits-out", "", "write the logits rows to this safetensors file")
	saveLogits := fs.String("save-logits", "", "same as --logits-out")
	refPath := fs.String("ref", "", "compare with this logits file (same layout)")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	maxP50 := fs.Float64("max-p50", 0, "fail (exit 3) if the median relative error exceeds this")
	maxKL := fs.Float64("max-kl", 0, "fail (exit 3) if the mean KL(ref || model) exceeds this")
	minTop1 := fs.Float64("min-top1", 0, "fail (exit 3) if the top-1 agreement is below this")
	progress := fs.Bool("progress", tty, "show a progress bar on stderr (default when stderr is a terminal)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "ds4-score: "+format+"\n", a...)
		return exitUsage
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected arguments %q", fs.Args())
	case (*tokensPath == "") == (*textPath == ""):
		return usage("give exactly one of --tokens SEQ.json and --text FILE")
	case *logitsOut != "" && *saveLogits != "" && *logitsOut != *saveLogits:
		return usage("--logits-out and --save-logits name different files")
	case *chunk < 0 || *threads < 0 || *chunks < 0 || *prefill < 0:
		return usage("--prefill, --prefill-chunk, --threads and --chunks must not be negative")
	case *maxP50 < 0 || *maxKL < 0 || *minTop1 < 0 || *minTop1 > 1:
		return usage("bounds must be ≥ 0 (and --min-top1 ≤ 1)")
	case (*maxP50 > 0 || *maxKL > 0 || *minTop1 > 0) && *refPath == "":
		return usage("--max-p50, --max-kl and --min-top1 need --ref")
	case *tokensPath != "" && *chunks > 0:
		return usage("--chunks applies to --text")
	case *textPath != "" && *prefill > 0:
		return usage("--prefill applies to --tokens")
	}
	if *logitsOut == "" {
		*logitsOut = *saveLogits
	}
	fail := func(err error) int {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(stderr, "ds4-score: interrupted")
		} else {
			fmt.Fprintln(stderr, "ds4-score:", err)
		}
		return exitError
	}

	var loadProgress io.Writer
	if *progress {
		loadProgress = stderr
	}
	m, err := loader.Open(loader.Options{Path: *modelPath, Demo: *demo, Backend: *backend,
		Threads: *threads, CUDA: cuda.Options{Fast: *cudaFast}, Warm: true, Progress: loadProgress})
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	vocab := m.Config.Vocab
	rep := report{Model: m.Name, Backend: *backend, LogitsOut: *logitsOut, Ref: *refPath}
	if *backend == loader.BackendCUDA && *cudaFast {
		rep.Backend += " (fast)"
	}

	// Plan the rows, so that the reference and the output are checked and
	// created before any work.
	var (
		seq       *score.Seq
		plan      *score.TextPlan
		positions []int32
	)
	if *tokensPath != "" {
		if seq, err = score.LoadSeq(*tokensPath, vocab, *prefill); err != nil {
			return fail(err)
		}
		positions = seq.Positions()
		rep.Mode, rep.Tokens, rep.Prefill = "tokens", len(seq.Tokens), seq.Prefill
	} else {
		text, err := os.ReadFile(*textPath)
		if err != nil {
			return fail(fmt.Errorf("text: %w", err))
		}
		bos := m.Tokenizer.BOS()
		if bos < 0 {
			return fail(errors.New("the model's vocabulary has no BOS token"))
		}
		toks := append([]int32{bos}, m.Tokenizer.Encode(string(text))...)
		if plan, err = score.PlanText(toks, bos, *ctxLen, *chunks); err != nil {
			return fail(fmt.Errorf("text %s: %w", *textPath, err))
		}
		positions = plan.Positions()
		rep.Mode, rep.Tokens, rep.Ctx, rep.Windows = "text", len(toks), plan.Ctx, plan.Windows
		fmt.Fprintf(stderr, "ds4-score: %s: %d tokens, %d windows of %d, scoring %d tokens\n",
			*textPath, len(toks), plan.Windows, plan.Ctx, plan.Scored())
	}
	rep.Rows = len(positions)

	var ref *score.LogitsFile
	if *refPath != "" {
		if ref, err = score.OpenLogits(*refPath); err != nil {
			return fail(err)
		}
		defer ref.Close()
		if err := ref.Match(vocab, positions); err != nil {
			return fail(err)
		}
	}
	var out *score.LogitsWriter
	if *logitsOut != "" {
		meta := map[string]string{"model": m.Name, "backend": *backend, "mode": rep.Mode,
			"prefill_chunk": fmt.Sprint(*chunk), "generator": "ds4-score"}
		if seq != nil {
			meta["prefill"] = fmt.Sprint(seq.Prefill)
		} else {
			meta["ctx"] = fmt.Sprint(plan.Ctx)
		}
		if out, err = score.CreateLogits(*logitsOut, vocab, positions, meta); err != nil {
			return fail(err)
		}
		defer out.Abort() // no-op after a successful Close
	}

	var bar *progressbar.ProgressBar
	var total int // tokens run through the model
	if plan != nil {
		total = plan.Evaluated()
	} else {
		total = len(seq.Tokens)
	}
	if *progress {
		bar = bars.Tokens(stderr, total, "scoring", true)
	}
	opts := score.RunOptions{ChunkSize: *chunk}
	if bar != nil {
		opts.Progress = func(done, _ int) { bar.Set(done) }
	}

	var (
		cmp     score.Comparer
		ppl     score.Perplexity
		refRow  []float32
		scratch []float64
	)
	consume := func(r score.Row) error {
		if err := score.CheckFinite(r.Logits); err != nil {
			return fmt.Errorf("model logits at position %d are not finite: %v", r.Pos, err)
		}
		if out != nil {
			if err := out.WriteRow(r.Logits); err != nil {
				return err
			}
		}
		if ref != nil {
			var rerr error
			if refRow, rerr = ref.Row(r.Index, refRow); rerr != nil {
				return rerr
			}
			if err := cmp.Add(r.Pos, refRow, r.Logits); err != nil {
				return err
			}
		}
		return nil
	}
	start := time.Now()
	if seq != nil {
		err = score.RunSeq(ctx, m.Backend, seq, opts, consume)
	} else {
		lastWin := -1
		err = score.RunText(ctx, m.Backend, plan, opts, func(r score.TextRow) error {
			var nll float64
			nll, scratch = score.NLL(r.Logits, r.Next, scratch)
			ppl.Add(nll)
			if bar != nil && r.Window != lastWin {
				lastWin = r.Window
				if r.Window > 0 {
					p, _ := ppl.Result()
					bar.Describe(fmt.Sprintf("scoring (ppl %.4f)", p))
				}
			}
			return consume(r.Row)
		})
	}
	elapsed := time.Since(start)
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		return fail(err)
	}
	if out != nil {
		if err := out.Close(); err != nil {
			return fail(err)
		}
	}
	rep.Seconds = elapsed.Seconds()
	if plan != nil {
		rep.TokensPerS = float64(plan.Evaluated()) / elapsed.Seconds()
		p, e := ppl.Result()
		rep.Perplexity = &pplReport{PPL: p, StdErr: e, MeanNLL: mathLog(p), Scored: ppl.Count()}
	} else {
		rep.TokensPerS = float64(len(seq.Tokens)) / elapsed.Seconds()
	}
	code := exitOK
	if ref != nil {
		s := cmp.Summary()
		rep.Compare = &s
		rep.BoundsFails = score.Bounds{MaxP50: *maxP50, MaxKL: *maxKL, MinTop1: *minTop1}.Check(s)
		if len(rep.BoundsFails) > 0 {
			code = exitBounds
		}
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(jsonSafe(rep)); err != nil {
			return fail(err)
		}
	} else {
		printTable(stdout, &rep)
	}
	for _, f := range rep.BoundsFails {
		fmt.Fprintln(stderr, "ds4-score: bound not met:", f)
	}
	return code
}

func printTable(w io.Writer, r *report) {
	var b strings.Builder
	fmt.Fprintf(&b, "model        %s (%s backend)\n", r.Model, r.Backend)
	if r.Mode == "tokens" {
		fmt.Fprintf(&b, "sequence     %d tokens, prefill %d, %d decode steps, %d rows\n", r.Tokens, r.Prefill, r.Tokens-r.Prefill, r.Rows)
	} else {
		fmt.Fprintf(&b, "text         %d tokens, %d windows of %d, %d scored\n", r.Tokens, r.Windows, r.Ctx, r.Rows)
	}
	fmt.Fprintf(&b, "speed        %.2f tokens/s (%.2f s)\n", r.TokensPerS, r.Seconds)
	if p := r.Perplexity; p != nil {
		fmt.Fprintf(&b, "perplexity   %.4f +/- %.5f (mean NLL %.5f over %d tokens)\n", p.PPL, p.StdErr, p.MeanNLL, p.Scored)
	}
	if r.LogitsOut != "" {
		fmt.Fprintf(&b, "logits       %s\n", r.LogitsOut)
	}
	if s := r.Compare; s != nil {
		fmt.Fprintf(&b, "reference    %s (%d rows)\n", r.Ref, s.Rows)
		fmt.Fprintf(&b, "  %-20s %10s %10s %10s\n", "", "median", "p95", "max")
		fmt.Fprintf(&b, "  %-20s %10.3g %10.3g %10.3g  (max at position %d)\n", "relative error", s.RelErrP50, s.RelErrP95, s.RelErrMax, s.RelErrMaxPos)
		fmt.Fprintf(&b, "  %-20s %10s %10s %10s\n", "", "mean", "", "max")
		fmt.Fprintf(&b, "  %-20s %10.3g %10s %10.3g  (max at position %d)\n", "KL(ref || model)", s.KLMean, "", s.KLMax, s.KLMaxPos)
		fmt.Fprintf(&b, "  %-20s %10.4f\n", "top-1 agreement", s.Top1)
	}
	io.WriteString(w, b.String())
}
