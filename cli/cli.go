// Package cli is the ds4 command line: one-shot generation (-p), an
// interactive multi-turn chat that extends one live session turn by turn,
// and --dump-tokens. cmd/ds4 is a thin wrapper around Main; docs/cli.md
// describes the flags and commands.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"ds4go/chat"
	"ds4go/engine"
)

// Options are the parsed command-line flags.
type Options struct {
	Model      string
	Demo       bool
	Prompt     string
	PromptFile string
	System     string
	MaxTokens  int
	Ctx        int
	Temp       float64
	TopP       float64
	TopK       int
	MinP       float64
	Seed       uint64
	Threads    int
	Backend    string
	Think      bool
	NoThink    bool
	ThinkMax   bool
	DumpTokens bool
	// Raw (with DumpTokens) tokenizes the text alone, without the chat
	// template; JSON prints {"ids", "pieces"} instead of lines.
	Raw  bool
	JSON bool
	// DumpLogprobs names a JSON file for the greedy continuation's
	// per-step top-LogprobsTopK log-probabilities (no text printed).
	DumpLogprobs string
	LogprobsTopK int
	// NoWarm skips paging the weights in before the first token.
	NoWarm bool
	// Fast selects the CUDA backend's fast mode (parallel sums, tensor-core
	// attention, prompts' Q8_0 and F16 products in f16 through cuBLAS).
	Fast bool
	// Inspect loads the model, prints a summary and exits.
	Inspect bool
	Color   string
	// MTP names a separate MTP file (ds4's DeepSeek-V4-Flash-MTP GGUF);
	// MTPDraft ≥ 2 decodes answers speculatively with the MTP block
	// (Options.MTP's, or the model file's own), one draft a pass, greedy or
	// sampled (the same tokens as without it, but for near ties that CUDA
	// fast mode's two-token passes may flip); 1, the default as in ds4.c,
	// does not speculate.
	MTP      string
	MTPDraft int
	// MTPMargin is accepted for ds4.c compatibility (its confidence gate);
	// ds4go verifies every draft, so it is ignored.
	MTPMargin float64
}

// Defaults of the flags, as ds4.c's.
const (
	// DefaultCtx is the context size when --ctx is not given (capped at
	// the model's).
	DefaultCtx = 32768
	// DefaultSystem is the system prompt when -sys is not given.
	DefaultSystem = "You are a helpful assistant"
	// DefaultMaxTokens caps an answer's length when -n is not given.
	DefaultMaxTokens = 50000
)

// Env is what Main talks to; the zero value of a field means the process's.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Interrupts delivers Ctrl+C; nil installs an os/signal handler for
	// os.Interrupt.
	Interrupts <-chan struct{}
	// IsTerminal reports whether stdout is a terminal (for dimmed
	// reasoning); nil checks os.Stdout.
	IsTerminal func() bool

	onTurn func(*Chat, TurnStats) // test hook, called after every turn
}

const usageText = `usage: ds4 [flags]              interactive chat (/help lists its commands)
       ds4 [flags] -p PROMPT    one-shot answer
       ds4 --dump-tokens [--raw] [--json] -p TEXT
       ds4 --dump-logprobs FILE [--logprobs-top-k K] -p PROMPT
flags (-x and --x are the same):
  -m, --model FILE     model GGUF (default ./ds4flash.gguf; without it, the demo model)
  --demo               built-in demo model: synthetic, random weights, meaningless text
  -p, --prompt TEXT    one-shot prompt        --prompt-file FILE   one-shot prompt from a file
  -sys, --system TEXT  system prompt ("You are a helpful assistant"; -sys "" for none)
  -n, --tokens N       max tokens per answer (50000; --max-tokens too)
  -c, --ctx N          context size in tokens (32768, capped at the model's)
  --temp T (1)  --top-p P (1: off)  --top-k K (0: off)  --min-p P (0.05)  --seed S (0: random)
  --think (default) | --nothink | --think-max (Think-Max needs --ctx >= 393216)
  -t, --threads N      CPU threads (0: all cores)
  --backend cpu|cuda   (--cpu, --cuda: the same)   --fast: CUDA ≈4× faster prompts, ≈1.2× decode, not bit-exact (--quality: exact, default)
  --inspect            load the model, print a summary and exit
  --color auto|always|never   dim the reasoning with ANSI colours
  --dump-tokens        print the token ids and pieces of the prompt (chat template applied,
                       unless the text is already a rendered chat starting with BOS) and exit
  --raw                with --dump-tokens: the text alone, no chat template
  --json               with --dump-tokens: {"ids": [...], "pieces": [...]} (hex for non-UTF-8 pieces)
  --dump-logprobs FILE write the greedy continuation's top-k logprobs per step as JSON, print nothing
  --logprobs-top-k K   alternatives per step for --dump-logprobs (20, at most 128)
  --no-warm            do not ready the backend before the first token: page the weights in (CPU), a warm-up chunk through one layer of each kind (CUDA) (--warm-weights: do, the default)
  --mtp FILE           separate MTP GGUF (the draft head); --mtp-draft 2: answers decoded speculatively,
                       one drafted token verified a pass, greedy or sampled (1, the default: off); --mtp-draft k
                       (3..16): answers (greedy or sampled) draft up to k-1 a pass, the block run again
                       over its own output, as deep as the backend's measured costs say pays
`

// errUsage marks a command-line error (exit status 2).
var errUsage = errors.New("usage")

func newFlagSet(o *Options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ds4", flag.ContinueOnError)
	fs.SetOutput(stderr)
	str := func(p *string, def, usage string, names ...string) {
		for _, n := range names {
			fs.StringVar(p, n, def, usage)
		}
	}
	integer := func(p *int, def int, usage string, names ...string) {
		for _, n := range names {
			fs.IntVar(p, n, def, usage)
		}
	}
	boolean := func(p *bool, usage string, names ...string) {
		for _, n := range names {
			fs.BoolVar(p, n, false, usage)
		}
	}
	str(&o.Model, "", "model GGUF file (default ./"+DefaultModelPath+", else the demo model)", "m", "model")
	boolean(&o.Demo, "run the built-in demo model (random weights, meaningless text)", "demo")
	str(&o.Prompt, "", "one-shot prompt (no -p: interactive chat)", "p", "prompt")
	str(&o.PromptFile, "", "read the one-shot prompt from a file", "prompt-file")
	str(&o.System, DefaultSystem, "system prompt (\"\" for none)", "sys", "system")
	integer(&o.MaxTokens, DefaultMaxTokens, "max tokens generated per answer", "n", "tokens", "max-tokens")
	integer(&o.Ctx, DefaultCtx, "context size in tokens (capped at the model's)", "c", "ctx")
	fs.Float64Var(&o.Temp, "temp", 1, "sampling temperature (0: greedy)")
	fs.Float64Var(&o.TopP, "top-p", 1, "top-p (nucleus) sampling (1: off)")
	integer(&o.TopK, 0, "top-k sampling (0: off)", "top-k")
	fs.Float64Var(&o.MinP, "min-p", 0.05, "min-p sampling (0: off)")
	fs.Uint64Var(&o.Seed, "seed", 0, "sampler seed (0: random)")
	integer(&o.Threads, 0, "CPU threads (0: all cores)", "t", "threads")
	str(&o.Backend, "cpu", "backend: cpu or cuda", "backend")
	fs.BoolFunc("cuda", "same as --backend cuda", func(string) error { o.Backend = "cuda"; return nil })
	fs.BoolFunc("cpu", "same as --backend cpu", func(string) error { o.Backend = "cpu"; return nil })
	boolean(&o.Fast, "CUDA: fast mode (on an H200 ≈ 4× faster prompts and ≈ 1.2× faster decode than exact mode: README's Performance) — parallel sums, prompts' attention and indexer scores in f16 on the tensor cores, their Q8_0 and F16 products in f16 through cuBLAS, decode attention split over the keys (not bit-identical to the CPU backend)", "fast")
	fs.BoolFunc("quality", "exact kernels (the default; --fast turns it off)", func(string) error { o.Fast = false; return nil })
	boolean(&o.Inspect, "load the model, print a summary and exit", "inspect")
	fs.BoolFunc("warm-weights", "page the weights in before the first token (the default)", func(string) error { o.NoWarm = false; return nil })
	boolean(&o.Think, "thinking mode (the default)", "think")
	boolean(&o.NoThink, "non-thinking mode: direct answers", "nothink")
	boolean(&o.ThinkMax, "Think-Max mode (needs --ctx >= 393216, else plain thinking)", "think-max")
	boolean(&o.DumpTokens, "print the token ids and pieces of the prompt and exit", "dump-tokens")
	boolean(&o.Raw, "with --dump-tokens: the text alone, without the chat template", "raw")
	boolean(&o.JSON, "with --dump-tokens: print JSON", "json")
	str(&o.DumpLogprobs, "", "write the greedy continuation's top-k logprobs per step to this JSON file", "dump-logprobs")
	integer(&o.LogprobsTopK, 20, "alternatives per step for --dump-logprobs", "logprobs-top-k")
	boolean(&o.NoWarm, "do not page the weights in before the first token", "no-warm")
	str(&o.Color, "auto", "dim reasoning with ANSI colours: auto, always, never", "color")
	str(&o.MTP, "", "separate MTP GGUF (the draft head of speculative decoding)", "mtp")
	integer(&o.MTPDraft, 1, "tokens a speculative pass aims at: 2 drafts one token with the MTP block (greedy or sampled answers; the same tokens, but for near ties --fast may flip); k > 2 drafts up to k-1, the block run again over its own output, as deep as the backend's measured costs say pays (greedy answers; sampled ones draft one); 1: no speculation", "mtp-draft")
	fs.Float64Var(&o.MTPMargin, "mtp-margin", 0, "accepted for ds4.c compatibility; every draft is verified (ignored)")
	fs.Usage = func() { io.WriteString(stderr, usageText) }
	return fs
}

// ParseFlags parses the command line (without the program name).
func ParseFlags(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{}
	fs := newFlagSet(o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	bad := func(format string, a ...any) (*Options, error) {
		err := fmt.Errorf("%w: "+format, append([]any{errUsage}, a...)...)
		fmt.Fprintln(stderr, "ds4:", strings.TrimPrefix(err.Error(), "usage: "))
		fs.Usage()
		return nil, err
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	n := 0
	for _, b := range []bool{o.Think, o.NoThink, o.ThinkMax} {
		if b {
			n++
		}
	}
	switch {
	case n > 1:
		return bad("--think, --nothink and --think-max exclude each other")
	case o.Model != "" && o.Demo:
		return bad("-m and --demo exclude each other")
	case o.Prompt != "" && o.PromptFile != "":
		return bad("-p and --prompt-file exclude each other")
	case o.MaxTokens <= 0:
		return bad("-n must be positive")
	case o.Ctx <= 0:
		return bad("--ctx must be positive")
	case o.Temp < 0 || o.TopP < 0 || o.TopP > 1 || o.TopK < 0 || o.MinP < 0 || o.MinP > 1:
		return bad("sampling parameters out of range")
	case o.Backend != "cpu" && o.Backend != "cuda":
		return bad("--backend must be cpu or cuda")
	case o.Color != "auto" && o.Color != "always" && o.Color != "never":
		return bad("--color must be auto, always or never")
	}
	if o.PromptFile != "" {
		b, err := os.ReadFile(o.PromptFile)
		if err != nil {
			return nil, err
		}
		o.Prompt = string(b)
	}
	switch {
	case o.DumpTokens && o.Prompt == "":
		return bad("--dump-tokens needs -p TEXT or --prompt-file FILE")
	case (o.Raw || o.JSON) && !o.DumpTokens:
		return bad("--raw and --json go with --dump-tokens")
	case o.DumpLogprobs != "" && o.Prompt == "":
		return bad("--dump-logprobs needs -p PROMPT or --prompt-file FILE")
	case o.DumpLogprobs != "" && o.DumpTokens:
		return bad("--dump-logprobs and --dump-tokens exclude each other")
	case o.LogprobsTopK <= 0 || o.LogprobsTopK > MaxLogprobsTopK:
		return bad("--logprobs-top-k must be 1..%d", MaxLogprobsTopK)
	case o.MTPDraft < 1 || o.MTPDraft > engine.MaxDraftDepth+1:
		return bad("--mtp-draft must be 1..%d", engine.MaxDraftDepth+1)
	}
	return o, nil
}

// Mode returns the thinking mode the flags select (thinking by default, as
// ds4.c).
func (o *Options) Mode() chat.Mode {
	switch {
	case o.NoThink:
		return chat.ModeChat
	case o.ThinkMax:
		return chat.ModeThinkMax
	}
	return chat.ModeThinking
}

// Main runs ds4 with args (without the program name) and returns the exit
// status: 0 ok, 1 error, 2 usage error, 130 interrupted at the prompt.
func Main(args []string, env Env) int {
	if env.Stdin == nil {
		env.Stdin = os.Stdin
	}
	if env.Stdout == nil {
		env.Stdout = os.Stdout
	}
	if env.Stderr == nil {
		env.Stderr = os.Stderr
	}
	o, err := ParseFlags(args, env.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if env.Interrupts == nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt)
		defer signal.Stop(sig)
		ch := make(chan struct{}, 1)
		go func() {
			for range sig {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}()
		env.Interrupts = ch
	}
	m, err := openModel(o, env.Stderr, stderrIsTerminal(env.Stderr))
	if err != nil {
		fmt.Fprintln(env.Stderr, "ds4:", err)
		return 1
	}
	defer m.Close()

	if o.Inspect {
		inspect(env.Stdout, m)
		return 0
	}
	if o.DumpTokens {
		if err := dumpTokens(env.Stdout, m, o); err != nil {
			fmt.Fprintln(env.Stderr, "ds4:", err)
			return 1
		}
		return 0
	}
	if o.DumpLogprobs != "" {
		ctx, stop := turnCtx(env.Interrupts)
		defer stop()
		n, err := dumpLogprobs(ctx, m, o)
		if err != nil {
			fmt.Fprintln(env.Stderr, "ds4:", err)
			return 1
		}
		fmt.Fprintf(env.Stderr, "ds4: wrote %d steps to %s\n", n, o.DumpLogprobs)
		return 0
	}
	color := o.Color == "always"
	if o.Color == "auto" {
		if env.IsTerminal != nil {
			color = env.IsTerminal()
		} else {
			color = isTerminal(os.Stdout) && env.Stdout == io.Writer(os.Stdout)
		}
	}
	c, err := newChat(m, o, env.Stdout, env.Stderr, color)
	if err != nil {
		fmt.Fprintln(env.Stderr, "ds4:", err)
		return 1
	}
	defer c.Close()
	c.progress = stderrIsTerminal(env.Stderr)
	if o.Prompt != "" {
		ctx, stop := turnCtx(env.Interrupts)
		st, err := c.Turn(ctx, o.Prompt)
		stop()
		if env.onTurn != nil {
			env.onTurn(c, st)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(env.Stderr, "ds4:", err)
			return 1
		}
		st.print(env.Stderr)
		return 0
	}
	return interactive(c, env)
}

// turnCtx returns a context cancelled by the next interrupt, and a stop
// function that ends the watch (and cancels the context).
func turnCtx(intr <-chan struct{}) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-intr:
			cancel()
		case <-done:
		}
	}()
	return ctx, func() {
		close(done)
		<-exited
		cancel()
	}
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
