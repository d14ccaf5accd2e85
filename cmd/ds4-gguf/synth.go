package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"ds4go/model"
	"ds4go/synth"
)

const synthSynopsis = `synth -o FILE [--tiny | --flash-q2 | --flash-q4] [--layers N] [--scheme q2|q4|q8|f16|f32] [--mtp | --mtp-only]
       [--dim E --heads H --experts N --ff F --vocab real|N --window W --topk K ...] [--seed S]

Writes a DS4-layout GGUF file with random weights. Presets: --tiny (default; 6 layers
covering every layer kind, scheme q8), --flash-q2 and --flash-q4 (DeepSeek V4 Flash, the
published files' tensor table and types; --layers defaults to 43). Flags after the preset
override its hyperparameters; --layers alone keeps Flash's compression pattern. --mtp adds
the multi-token-prediction block (mtp.0.*, the draft head of speculative decoding);
--mtp-only writes it alone, as a separate MTP file for --mtp of ds4, ds4-server, ds4-bench.`

// intFlag is an integer hyperparameter flag and the Config field it sets.
type intFlag struct {
	name, help string
	field      func(*model.Config) *int
}

var synthIntFlags = []intFlag{
	{"dim", "embedding width", func(c *model.Config) *int { return &c.Embed }},
	{"heads", "query heads", func(c *model.Config) *int { return &c.Heads }},
	{"head-dim", "key/value width per head", func(c *model.Config) *int { return &c.HeadDim }},
	{"rope-dim", "rotated dims per head", func(c *model.Config) *int { return &c.RopeDim }},
	{"q-lora", "query LoRA rank", func(c *model.Config) *int { return &c.QLoraRank }},
	{"o-lora", "output LoRA rank per group", func(c *model.Config) *int { return &c.OLoraRank }},
	{"o-groups", "output projection groups", func(c *model.Config) *int { return &c.OGroups }},
	{"window", "sliding-window length", func(c *model.Config) *int { return &c.Window }},
	{"experts", "routed experts", func(c *model.Config) *int { return &c.Experts }},
	{"experts-used", "experts per token", func(c *model.Config) *int { return &c.ExpertsUsed }},
	{"ff", "expert intermediate size", func(c *model.Config) *int { return &c.ExpertFF }},
	{"hash-layers", "leading layers routed by token id", func(c *model.Config) *int { return &c.HashLayers }},
	{"indexer-heads", "indexer heads", func(c *model.Config) *int { return &c.IndexerHeads }},
	{"indexer-dim", "indexer head width", func(c *model.Config) *int { return &c.IndexerHeadDim }},
	{"topk", "compressed rows the indexer keeps", func(c *model.Config) *int { return &c.IndexerTopK }},
	{"context", "context length (informative)", func(c *model.Config) *int { return &c.ContextLen }},
}

func runSynth(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("synth", synthSynopsis, stderr)
	out := fs.String("o", "", "output `FILE` (required)")
	tiny := fs.Bool("tiny", false, "preset: the small test model (default)")
	flashQ2 := fs.Bool("flash-q2", false, "preset: DeepSeek V4 Flash as the published q2 file")
	flashQ4 := fs.Bool("flash-q4", false, "preset: DeepSeek V4 Flash as the published q4 file")
	layers := fs.Int("layers", 0, "number of layers (default: the preset's; 43 for --flash-*)")
	scheme := fs.String("scheme", "", "storage scheme: q2, q4, q8, f16 or f32 (default: the preset's)")
	vocab := fs.String("vocab", "", "vocabulary: real (the DeepSeek V4 tokenizer, 129280 tokens) or a size N for a cut-down byte-level BPE vocabulary")
	ratios := fs.String("ratios", "", "per-layer compression ratios, comma-separated (0, 4 or 128); default: Flash's pattern")
	seed := fs.Uint64("seed", 1, "random seed")
	workers := fs.Int("workers", 0, "goroutines filling tensors (default GOMAXPROCS)")
	exact := fs.Bool("exact-quant", false, "quantize random floats with the real quantizers (slow; small models)")
	name := fs.String("name", "", "general.name")
	mtp := fs.Bool("mtp", false, "add the MTP block (the draft head of speculative decoding)")
	mtpOnly := fs.Bool("mtp-only", false, "write the MTP block alone (a separate MTP file)")
	dry := fs.Bool("dry-run", false, "print the planned file's size and stop")
	headerOnly := fs.Bool("header-only", false, "write only the header: a sparse file of the full size whose tensors read as zeros")
	force := fs.Bool("force", false, "write even if the file system seems to lack the space")
	ints := make([]*int, len(synthIntFlags))
	for i, f := range synthIntFlags {
		ints[i] = fs.Int(f.name, 0, f.help)
	}
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "synth: unexpected arguments %q", pos)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	presets := 0
	for _, b := range []bool{*tiny, *flashQ2, *flashQ4} {
		if b {
			presets++
		}
	}
	if presets > 1 {
		return usageError(fs, "synth: choose one of --tiny, --flash-q2, --flash-q4")
	}
	var opts synth.Options
	switch {
	case *flashQ2, *flashQ4:
		n := 43
		if set["layers"] {
			n = *layers
		}
		if n <= 0 {
			return usageError(fs, "synth: --layers must be positive")
		}
		opts.Config, opts.Scheme = synth.Flash(n), model.SchemeQ2
		if *flashQ4 {
			opts.Scheme = model.SchemeQ4
		}
	default:
		opts.Config, opts.Scheme = synth.Tiny(), model.SchemeQ8
		if set["layers"] {
			n := *layers
			if n <= 0 {
				return usageError(fs, "synth: --layers must be positive")
			}
			c := &opts.Config
			c.Layers, c.HashLayers = n, min(c.HashLayers, n)
			c.CompressRatios = model.FlashRatios(n)
			c.SwigluClamp = make([]float32, n)
			for i := range c.SwigluClamp {
				c.SwigluClamp[i] = 10
			}
		}
	}
	c := &opts.Config
	for i, f := range synthIntFlags {
		if set[f.name] {
			*f.field(c) = *ints[i]
		}
	}
	if set["ratios"] {
		rs, err := parseRatios(*ratios)
		if err != nil {
			return usageError(fs, "synth: --ratios: %v", err)
		}
		c.CompressRatios = rs
	}
	if set["scheme"] {
		s, ok := model.SchemeByName(*scheme)
		if !ok {
			return usageError(fs, "synth: unknown --scheme %q", *scheme)
		}
		opts.Scheme = s
	}
	switch v := *vocab; {
	case !set["vocab"]:
	case v == "real":
		c.Vocab = synth.RealVocabSize
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return usageError(fs, "synth: --vocab must be \"real\" or a positive size, got %q", v)
		}
		c.Vocab = n
	}
	if *out == "" && !*dry {
		return usageError(fs, "synth: -o FILE is required")
	}
	opts.Seed, opts.Workers, opts.ExactQuant, opts.Name = *seed, *workers, *exact, *name
	opts.HeaderOnly = *headerOnly
	switch {
	case *mtp && *mtpOnly:
		return usageError(fs, "synth: --mtp and --mtp-only exclude each other")
	case *mtp:
		opts.MTP = synth.MTPInclude
	case *mtpOnly:
		opts.MTP = synth.MTPOnly
	}

	_, layout, err := synth.Plan(opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "plan: %d layers, dim %d, %d experts, vocab %d, scheme %s: %d bytes (%s)\n",
		c.Layers, c.Embed, c.Experts, c.Vocab, opts.Scheme.Name, layout.TotalSize, human(layout.TotalSize))
	if *dry {
		return nil
	}
	if free, ok := freeBytes(filepath.Dir(*out)); ok && free < layout.TotalSize && !*force && !*headerOnly {
		return fmt.Errorf("%s has %s free, the file needs %s (use --force to try anyway)",
			filepath.Dir(*out), human(free), human(layout.TotalSize))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	last := start
	opts.Progress = func(done, total uint64) {
		if now := time.Now(); now.Sub(last) >= 2*time.Second && done < total {
			last = now
			fmt.Fprintf(stderr, "  %5.1f%%  %s of %s, %.2f GB/s\n", 100*float64(done)/float64(total),
				human(done), human(total), float64(done)/now.Sub(start).Seconds()/1e9)
		}
	}
	if err := synth.WriteFile(ctx, *out, opts); err != nil {
		if errors.Is(err, context.Canceled) {
			return errors.New("interrupted")
		}
		return err
	}
	el := time.Since(start)
	if *headerOnly {
		fmt.Fprintf(stdout, "wrote %s: the header, pre-sized to %d bytes (%s; sparse, tensors read as zeros)\n",
			*out, layout.TotalSize, human(layout.TotalSize))
		return nil
	}
	fmt.Fprintf(stdout, "wrote %s: %d bytes (%s) in %.2fs, %.2f GB/s\n", *out, layout.TotalSize,
		human(layout.TotalSize), el.Seconds(), float64(layout.TotalSize)/el.Seconds()/1e9)
	return nil
}

func parseRatios(s string) ([]int, error) {
	var rs []int
	for _, p := range strings.Split(s, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// freeBytes returns the space available to this user on the file system of dir.
func freeBytes(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return st.Bavail * uint64(st.Bsize), true
}
