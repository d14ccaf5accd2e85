package cli

import (
	"errors"
	"fmt"
	"io"
	"os"

	"ds4go/backend/cpu"
	"ds4go/backend/cuda"
	"ds4go/engine"
	"ds4go/gguf"
	"ds4go/model"
	"ds4go/synth"
	"ds4go/tokenizer"
)

// DefaultModelPath is the model used when -m is not given (as in ds4.c).
const DefaultModelPath = "ds4flash.gguf"

// DemoWarning is printed on stderr when the built-in demo model runs.
const DemoWarning = "ds4: warning: running the built-in demo model (synthetic, random weights): its text is meaningless; use -m MODEL.gguf for real output"

// loaded is an opened model: its backend, tokenizer and config.
type loaded struct {
	be      engine.Backend
	tok     *tokenizer.Tokenizer
	cfg     model.Config
	name    string
	demo    bool
	closeFn func()
}

func (l *loaded) Close() {
	if l.closeFn != nil {
		l.closeFn()
	}
}

// openModel opens the model the flags ask for: -m PATH, else ./ds4flash.gguf
// if present, else (or with --demo) the built-in demo model.
func openModel(o *Options, stderr io.Writer) (*loaded, error) {
	var f *gguf.File
	var name string
	demo := false
	path := o.Model
	if path == "" && !o.Demo {
		if _, err := os.Stat(DefaultModelPath); err == nil {
			path = DefaultModelPath
		}
	}
	switch {
	case path != "":
		var err error
		f, err = gguf.Open(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w\nds4: get a DS4 Flash GGUF from https://huggingface.co/antirez/deepseek-v4-gguf (save it as ./ds4flash.gguf or pass -m), or run `ds4 --demo` for the built-in demo model", err)
			}
			return nil, err
		}
		name = path
	default:
		var err error
		if f, err = synth.Demo(); err != nil {
			return nil, err
		}
		name, demo = "demo (synth.Tiny)", true
		fmt.Fprintln(stderr, DemoWarning)
	}
	fail := func(err error) (*loaded, error) {
		f.Close()
		return nil, err
	}
	w, err := model.Load(f)
	if err != nil {
		return fail(err)
	}
	v, err := model.VocabFromGGUF(f, w.Config.Vocab)
	if err != nil {
		return fail(err)
	}
	tok, err := tokenizer.New(v)
	if err != nil {
		return fail(err)
	}
	var be engine.Backend
	beClose := func() error { return nil }
	switch {
	case o.DumpTokens:
		// The tokenizer is all --dump-tokens needs.
	case o.Backend == "cpu":
		b, err := cpu.New(w, cpu.Options{Threads: o.Threads})
		if err != nil {
			return fail(err)
		}
		be, beClose = b, b.Close
	case o.Backend == "cuda":
		b, err := cuda.New(w, cuda.Options{})
		if err != nil {
			return fail(fmt.Errorf("cuda backend: %w", err))
		}
		be, beClose = b, b.Close
	}
	if be == nil && !o.DumpTokens {
		return fail(fmt.Errorf("unknown backend %q", o.Backend))
	}
	return &loaded{be: be, tok: tok, cfg: w.Config, name: name, demo: demo, closeFn: func() {
		beClose()
		f.Close()
	}}, nil
}
