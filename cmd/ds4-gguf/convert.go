package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"ds4go/convert"
	"ds4go/model"
)

// runConvert implements "ds4-gguf convert": a Hugging Face DeepSeek V4
// checkpoint directory to a DS4 GGUF file.
func runConvert(args []string) error {
	stderr := os.Stderr
	fs := newFlagSet("convert", "convert --in DIR -o OUT.gguf [--scheme f32|f16|q8|q2|q4] [--tokenizer PATH|default|none] [--mtp]", stderr)
	in := fs.String("in", "", "checkpoint `DIR` (config.json + model.safetensors or model.safetensors.index.json shards)")
	out := fs.String("o", "", "output GGUF `FILE`")
	schemeName := fs.String("scheme", "f32", "storage scheme: "+schemeNames())
	tok := fs.String("tokenizer", "", "tokenizer to embed: a tokenizer.json `PATH`, \"default\" (the built-in DeepSeek V4 vocabulary) or \"none\"; by default DIR/tokenizer.json")
	name := fs.String("name", "", "general.name (default: DIR's base name)")
	workers := fs.Int("j", 0, "parallel conversion jobs (default: all cores)")
	mtp := fs.Bool("mtp", false, "also convert the checkpoint's MTP block (mtp.0.*, the draft head of speculative decoding) into OUT")
	quiet := fs.Bool("q", false, "print nothing but errors")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "convert: unexpected arguments %q", pos)
	}
	if *in == "" || *out == "" {
		return usageError(fs, "convert: --in and -o are required")
	}
	scheme, ok := model.SchemeByName(*schemeName)
	if !ok {
		return usageError(fs, "convert: unknown scheme %q (want %s)", *schemeName, schemeNames())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	start := time.Now()
	opts := convert.Options{
		InputDir: *in, Output: *out, Scheme: scheme, Tokenizer: *tok, Name: *name, Workers: *workers, MTP: *mtp,
	}
	if !*quiet {
		opts.Log = func(format string, a ...any) {
			fmt.Fprintf(stderr, "%6.1fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
		}
	}
	if err := convert.Convert(ctx, opts); err != nil {
		return trimmedError{err}
	}
	return nil
}

// trimmedError drops the package's "convert: " prefix, which the dispatcher
// already prints as "ds4-gguf convert: ".
type trimmedError struct{ err error }

func (e trimmedError) Error() string { return strings.TrimPrefix(e.err.Error(), "convert: ") }
func (e trimmedError) Unwrap() error { return e.err }

func schemeNames() string {
	names := make([]string, len(model.Schemes))
	for i, s := range model.Schemes {
		names[i] = s.Name
	}
	return strings.Join(names, "|")
}
