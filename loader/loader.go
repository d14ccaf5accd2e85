// Package loader opens a model for the commands: it resolves which file to
// use (-m, ./ds4flash.gguf, or the built-in demo model), maps and validates
// it, builds its tokenizer and the compute backend asked for, and can page
// the weights in ahead of time with a progress bar.
//
// ds4, ds4-score and the other commands share it so that "which model runs,
// and how it is checked" is decided in one place.
package loader

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"

	"ds4go/backend/cpu"
	"ds4go/backend/cuda"
	"ds4go/engine"
	"ds4go/gguf"
	"ds4go/internal/progress"
	"ds4go/model"
	"ds4go/synth"
	"ds4go/tokenizer"
)

// DefaultPath is the model used when no path is given and the file exists
// (as in ds4.c).
const DefaultPath = "ds4flash.gguf"

// GetModelHint tells a user without a model file where to get one and how
// to run the demo model instead.
const GetModelHint = "get a DS4 Flash GGUF from https://huggingface.co/antirez/deepseek-v4-gguf (save it as ./ds4flash.gguf or pass -m), or run with --demo for the built-in demo model"

// DemoName describes the demo model in messages.
const DemoName = "demo (synthetic Tiny model, real DeepSeek V4 tokenizer)"

// Backends a model can run on.
const (
	BackendNone = ""     // tokenizer and weights only (no compute)
	BackendCPU  = "cpu"  // backend/cpu
	BackendCUDA = "cuda" // backend/cuda (needs libds4cuda.so and a GPU)
)

// Options says which model to open and how.
type Options struct {
	// Path is the GGUF to open. Empty means DefaultPath when that file
	// exists, else the demo model (or ErrNoModel when NoDemoFallback).
	Path string
	// Demo forces the built-in demo model.
	Demo bool
	// NoDemoFallback makes a missing default model an error instead of
	// falling back to the demo model.
	NoDemoFallback bool
	// MTPPath is a separate MTP file (ds4's DeepSeek-V4-Flash-MTP GGUF, or
	// `ds4-gguf synth --mtp-only`) whose block is bound to the model
	// (model.LoadMTP): the draft head of speculative decoding. A model file
	// may also carry the block itself.
	MTPPath string
	// Backend is BackendCPU, BackendCUDA or BackendNone.
	Backend string
	// Threads is the CPU backend's worker count (all cores when ≤ 0).
	Threads int
	// CUDA configures the CUDA backend (fast mode, graph decode, device).
	CUDA cuda.Options
	// Warm readies the backend for the first prompt. The CPU backend: every
	// weight page is read once before it is built (so the first token does
	// not pay the disk reads), showing progress on Progress. The CUDA
	// backend, whose upload reads every weight anyway (Progress shows the
	// upload): cuda.Options.WarmUp, a prefill chunk through one layer of
	// each kind after the upload, so that the first prompt does not pay the
	// kernels' and cuBLAS's one-time costs. Ignored for in-memory models.
	Warm bool
	// Progress, when not nil, receives a progress bar while the weights
	// are paged in or uploaded (normally os.Stderr, only when it is a
	// terminal).
	Progress io.Writer
}

// ErrNoModel is returned when no model file was given, none is at
// DefaultPath, and the demo fallback is off.
var ErrNoModel = errors.New("no model: " + GetModelHint)

// Model is an opened model. Close releases the backend and the mapping.
type Model struct {
	File      *gguf.File
	MTPFile   *gguf.File // Options.MTPPath's file, or nil
	Weights   *model.Weights
	Config    model.Config
	Tokenizer *tokenizer.Tokenizer
	// Backend is nil for BackendNone.
	Backend engine.Backend
	// Name is the path, or DemoName.
	Name string
	// Demo is true for the built-in demo model.
	Demo bool
	// Timings of the load steps.
	MapTime, LoadTime, WarmTime, BackendTime time.Duration

	closeBackend func()
}

// ContextSize returns the context a session should get when want tokens
// are asked for: want capped at the model's context length, or the model's
// when want ≤ 0 (want itself when the model states none).
func (m *Model) ContextSize(want int) int {
	if l := m.Config.ContextLen; l > 0 && (want <= 0 || want > l) {
		return l
	}
	return want
}

// Close releases the backend and unmaps the file.
func (m *Model) Close() {
	if m.closeBackend != nil {
		m.closeBackend()
		m.closeBackend = nil
	}
	if m.File != nil {
		m.File.Close()
		m.File = nil
	}
	if m.MTPFile != nil {
		m.MTPFile.Close()
		m.MTPFile = nil
	}
}

// HasMTP reports whether the model has an MTP block (its own or
// Options.MTPPath's).
func (m *Model) HasMTP() bool { return m.Weights != nil && m.Weights.MTP != nil }

// Resolve returns the path Open would use ("" for the demo model).
func Resolve(o Options) (string, error) {
	if o.Demo {
		return "", nil
	}
	if o.Path != "" {
		return o.Path, nil
	}
	if _, err := os.Stat(DefaultPath); err == nil {
		return DefaultPath, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s: %w", DefaultPath, err)
	}
	if o.NoDemoFallback {
		return "", ErrNoModel
	}
	return "", nil
}

// Open opens the model the options ask for.
func Open(o Options) (*Model, error) {
	path, err := Resolve(o)
	if err != nil {
		return nil, err
	}
	m := &Model{Name: path}
	t0 := time.Now()
	if path == "" {
		m.Demo, m.Name = true, DemoName
		if m.File, err = synth.Demo(); err != nil {
			return nil, fmt.Errorf("demo model: %w", err)
		}
	} else {
		if m.File, err = gguf.Open(path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w\n%s", err, GetModelHint)
			}
			return nil, err
		}
	}
	m.MapTime = time.Since(t0)
	fail := func(err error) (*Model, error) {
		m.Close()
		if path != "" {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return nil, err
	}
	t0 = time.Now()
	if m.Weights, err = model.Load(m.File); err != nil {
		return fail(err)
	}
	m.Config = m.Weights.Config
	if o.MTPPath != "" {
		if m.MTPFile, err = gguf.Open(o.MTPPath); err != nil {
			return fail(fmt.Errorf("MTP file: %w", err))
		}
		if err := model.LoadMTP(m.Weights, m.MTPFile); err != nil {
			return fail(fmt.Errorf("MTP file %s: %w", o.MTPPath, err))
		}
	}
	v, err := model.VocabFromGGUF(m.File, m.Config.Vocab)
	if err != nil {
		return fail(err)
	}
	if m.Tokenizer, err = tokenizer.New(v); err != nil {
		return fail(fmt.Errorf("tokenizer: %w", err))
	}
	m.LoadTime = time.Since(t0)
	if o.Warm && !m.Demo && o.Backend == BackendCPU {
		t0 = time.Now()
		warm(m.File, o.Progress)
		m.WarmTime = time.Since(t0)
	}
	t0 = time.Now()
	switch o.Backend {
	case BackendNone:
	case BackendCPU:
		b, err := cpu.New(m.Weights, cpu.Options{Threads: o.Threads})
		if err != nil {
			return fail(fmt.Errorf("cpu backend: %w", err))
		}
		m.Backend, m.closeBackend = b, func() { b.Close() }
	case BackendCUDA:
		co := o.CUDA
		co.WarmUp = co.WarmUp || (o.Warm && !m.Demo)
		var bar *progressbar.ProgressBar
		if o.Progress != nil && !m.Demo && co.Uploaded == nil {
			bar = progress.Bytes(o.Progress, tensorBytes(m.File), "uploading weights")
			co.Uploaded = func(n int64) { bar.Add64(n) }
		}
		b, err := cuda.New(m.Weights, co)
		if bar != nil {
			bar.Finish()
		}
		if err != nil {
			return fail(fmt.Errorf("cuda backend: %w", err))
		}
		m.Backend, m.closeBackend = b, func() { b.Close() }
	default:
		return fail(fmt.Errorf("unknown backend %q (want cpu or cuda)", o.Backend))
	}
	m.BackendTime = time.Since(t0)
	return m, nil
}

// warm reads one byte of every page of every tensor's data, in parallel,
// reporting bytes done on a progress bar when w is not nil.
func warm(f *gguf.File, w io.Writer) {
	const page = 4096
	var bar *progressbar.ProgressBar
	if w != nil {
		bar = progress.Bytes(w, tensorBytes(f), "loading weights")
	}
	var next atomic.Int64
	var sink atomic.Uint32
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var acc byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(f.Tensors) {
					break
				}
				d := f.TensorData(&f.Tensors[i])
				const step = 64 << 20 // report every 64 MiB
				for off := 0; off < len(d); off += step {
					end := min(off+step, len(d))
					for p := off; p < end; p += page {
						acc ^= d[p]
					}
					if bar != nil {
						bar.Add64(int64(end - off))
					}
				}
			}
			sink.Add(uint32(acc))
		}()
	}
	wg.Wait()
	if bar != nil {
		bar.Finish()
	}
}

// tensorBytes is the size of all tensor data in f.
func tensorBytes(f *gguf.File) int64 {
	var total int64
	for i := range f.Tensors {
		total += int64(len(f.TensorData(&f.Tensors[i])))
	}
	return total
}
