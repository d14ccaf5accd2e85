// Package convert turns a DeepSeek V4 checkpoint in the official Hugging Face
// layout (config.json + safetensors, as released or as the golden test
// models store it) into a DS4 GGUF file that model.Load accepts.
//
// The tensor names, shapes and byte layout follow antirez/ds4's converter
// (gguf-tools/deepseek4-quantize.c): every GGUF tensor is the checkpoint
// tensor with its shape reversed and its bytes in the same order — nothing
// is permuted — and routed experts are stacked along a third GGUF dimension.
// FP8 (e4m3 with 128×128 e8m0 block scales) and FP4 (e2m1 packed two per
// byte with per-32 e8m0 scales) weights are dequantized to f32 first, then
// stored in the types the chosen model.Scheme gives each role.
// docs/convert.md describes the mapping and where each fact comes from.
package convert

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/tokenizer"
)

// Tokenizer choices of Options.Tokenizer besides a path to a tokenizer.json.
const (
	// TokenizerAuto embeds the checkpoint's tokenizer.json, and fails if
	// there is none.
	TokenizerAuto = ""
	// TokenizerNone writes no tokenizer.ggml.* keys (model.Load does not
	// need them; the tiny test checkpoints have no tokenizer).
	TokenizerNone = "none"
	// TokenizerDefault embeds tokenizer.DefaultVocab(), the DeepSeek V4
	// vocabulary; vocab_size must match it.
	TokenizerDefault = "default"
)

// Options configures Convert.
type Options struct {
	InputDir string       // checkpoint directory (config.json + safetensors)
	Output   string       // GGUF file to write
	Scheme   model.Scheme // storage types; the zero value means model.SchemeF32
	// Tokenizer is TokenizerAuto, TokenizerNone, TokenizerDefault or the
	// path of a Hugging Face tokenizer.json.
	Tokenizer string
	Name      string // general.name; the input directory's base name when empty
	Workers   int    // parallel tensor jobs; GOMAXPROCS when ≤ 0
	// ChunkElems bounds the f32 values one job decodes at once (memory per
	// worker is a few times this); 4M when ≤ 0.
	ChunkElems int64
	// MTP also converts the checkpoint's multi-token-prediction block
	// (mtp.0.*, model.MTPTensors) into the output, which then carries the
	// draft head of speculative decoding.
	MTP bool
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
}

// ConvertDir converts the checkpoint in dir to outPath with the given scheme
// and no tokenizer: the quick path for tests that need a GGUF of a golden
// checkpoint.
func ConvertDir(ctx context.Context, dir, outPath string, scheme model.Scheme) error {
	return Convert(ctx, Options{InputDir: dir, Output: outPath, Scheme: scheme, Tokenizer: TokenizerNone})
}

// Convert writes the DS4 GGUF file of a checkpoint. It streams: each worker
// decodes a bounded chunk of rows, converts it and writes it at its final
// offset, so memory stays small whatever the model size. The output is
// written to a temporary file next to Output, checked with model.Load and
// then renamed into place.
func Convert(ctx context.Context, o Options) error {
	if o.InputDir == "" || o.Output == "" {
		return errors.New("convert: InputDir and Output are required")
	}
	if o.Scheme.Name == "" {
		o.Scheme = model.SchemeF32
	}
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ck, err := OpenHF(o.InputDir)
	if err != nil {
		return err
	}
	defer ck.Close()
	cfg, err := ck.Config()
	if err != nil {
		return err
	}
	specs := model.ExpectedTensors(&cfg)
	if o.MTP {
		specs = append(specs, model.MTPTensors(&cfg)...)
	}
	p, err := ck.PlanTensors(&cfg, specs, o.Scheme)
	if err != nil {
		return err
	}
	if unused := p.Unused(); len(unused) > 0 {
		logf("ignoring %d checkpoint tensors not in the GGUF (e.g. %s)", len(unused), strings.Join(unused[:min(3, len(unused))], ", "))
	}

	name := o.Name
	if name == "" {
		abs, _ := filepath.Abs(o.InputDir)
		name = filepath.Base(abs)
	}
	kvs := cfg.Metadata()
	b := &gguf.Builder{}
	b.KVs = append(b.KVs, kvs[0], gguf.KV{Key: "general.name", Value: gguf.Str(name)})
	b.KVs = append(b.KVs, kvs[1:]...)
	vocab, err := loadVocab(o.Tokenizer, o.InputDir, cfg.Vocab)
	if err != nil {
		return err
	}
	if vocab != nil {
		b.KVs = append(b.KVs, model.VocabMetadata(vocab)...)
	}
	for _, s := range p.Sources {
		b.Tensors = append(b.Tensors, gguf.TensorSpec{Name: s.spec.Name, Type: s.Type, Dims: s.spec.Dims})
	}
	lay, err := b.Layout()
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	logf("%s: %d tensors, scheme %s, %.1f MiB", o.Output, len(b.Tensors), o.Scheme.Name, float64(lay.TotalSize)/(1<<20))

	tmp := o.Output + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Truncate(int64(lay.TotalSize)); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if _, err := f.WriteAt(lay.Header, 0); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if err := p.write(ctx, f, lay, o.Workers, o.ChunkElems, logf); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	if err := verify(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, o.Output); err != nil {
		return fmt.Errorf("convert: %w", err)
	}
	done = true
	logf("wrote %s", o.Output)
	return nil
}

// verify opens the written file as model.Load would.
func verify(path string) error {
	gf, err := gguf.Open(path)
	if err != nil {
		return fmt.Errorf("convert: written file does not parse: %w", err)
	}
	defer gf.Close()
	if _, err := model.Load(gf); err != nil {
		return fmt.Errorf("convert: written file does not load: %w", err)
	}
	return nil
}

// loadVocab resolves Options.Tokenizer.
func loadVocab(choice, dir string, vocabSize int) (*tokenizer.Vocab, error) {
	var v *tokenizer.Vocab
	var err error
	var what string
	switch choice {
	case TokenizerNone:
		return nil, nil
	case TokenizerDefault:
		what = "the embedded DeepSeek V4 vocabulary"
		v, err = tokenizer.DefaultVocab()
	default:
		path := choice
		if choice == TokenizerAuto {
			path = filepath.Join(dir, "tokenizer.json")
			if _, serr := os.Stat(path); serr != nil {
				return nil, fmt.Errorf("convert: %s has no tokenizer.json; choose a tokenizer (a path, %q or %q)", dir, TokenizerDefault, TokenizerNone)
			}
		}
		what = path
		var fh *os.File
		if fh, err = os.Open(path); err == nil {
			v, err = tokenizer.LoadHFJSON(fh)
			fh.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("convert: tokenizer: %w", err)
	}
	if len(v.Tokens) > vocabSize {
		return nil, fmt.Errorf("convert: tokenizer %s has %d tokens, more than vocab_size %d", what, len(v.Tokens), vocabSize)
	}
	if choice == TokenizerDefault && len(v.Tokens) != vocabSize {
		return nil, fmt.Errorf("convert: %s has %d tokens, vocab_size is %d", what, len(v.Tokens), vocabSize)
	}
	// Pad a shorter tokenizer to the embedding's rows, as LoadHFJSON
	// fills id holes: unused tokens that are never produced.
	for id := len(v.Tokens); id < vocabSize; id++ {
		if v.Types == nil {
			v.Types = make([]int32, len(v.Tokens))
			for i := range v.Types {
				v.Types[i] = tokenizer.TypeNormal
			}
		}
		v.Tokens = append(v.Tokens, fmt.Sprintf("[PAD%d]", id))
		v.Types = append(v.Types, tokenizer.TypeUnused)
	}
	return v, nil
}

// Plan is the conversion of a checkpoint: one source per GGUF tensor, in
// model.ExpectedTensors order, with the storage type the scheme gives it.
type Plan struct {
	Sources []PlannedTensor
	ck      *HFCheckpoint
}

// PlannedTensor is one GGUF tensor of a Plan.
type PlannedTensor struct {
	*source
	Type quant.Type
}

// Name returns the GGUF tensor name.
func (t PlannedTensor) Name() string { return t.spec.Name }

// HFNames returns the checkpoint tensors it is made from.
func (t PlannedTensor) HFNames() []string {
	out := make([]string, len(t.parts))
	for i, m := range t.parts {
		out[i] = m.name
	}
	return out
}

// Plan maps every tensor model.ExpectedTensors(c) lists to the checkpoint,
// checking names, shapes and dtypes, and picks each one's storage type.
// Every problem is reported in the one error.
func (ck *HFCheckpoint) Plan(c *model.Config, scheme model.Scheme) (*Plan, error) {
	return ck.PlanTensors(c, model.ExpectedTensors(c), scheme)
}

// PlanTensors is Plan for the given tensors (ExpectedTensors, with or
// without MTPTensors).
func (ck *HFCheckpoint) PlanTensors(c *model.Config, specs []model.TensorSpec, scheme model.Scheme) (*Plan, error) {
	p := &Plan{ck: ck}
	var errs []string
	for _, sp := range specs {
		src, err := ck.source(c, sp)
		if err != nil {
			errs = append(errs, strings.TrimPrefix(err.Error(), "convert: "))
			continue
		}
		if src == nil {
			continue
		}
		t := scheme.TypeFor(sp.Role)
		if bs := uint64(t.BlockSize()); sp.Dims[0]%bs != 0 {
			errs = append(errs, fmt.Sprintf("scheme %s stores %s as %v, but its row length %d is not a multiple of the %v block size %d",
				scheme.Name, sp.Name, t, sp.Dims[0], t, bs))
			continue
		}
		p.Sources = append(p.Sources, PlannedTensor{source: src, Type: t})
	}
	if len(errs) > 0 {
		const show = 20
		total, more := len(errs), ""
		if len(errs) > show {
			more = fmt.Sprintf("\n  ... and %d more", len(errs)-show)
			errs = errs[:show]
		}
		return nil, fmt.Errorf("convert: %d problem(s) mapping %s to GGUF:\n  %s%s", total, ck.Dir, strings.Join(errs, "\n  "), more)
	}
	return p, nil
}

// Unused returns the checkpoint tensors no GGUF tensor reads, other than
// the scales of quantized weights (MTP layers, for instance).
func (p *Plan) Unused() []string {
	used := map[string]bool{}
	for _, s := range p.Sources {
		for _, m := range s.parts {
			used[m.name] = true
			if m.s.info != nil {
				used[strings.TrimPrefix(m.s.info.Name, "model.")] = true
			}
		}
	}
	var out []string
	for _, n := range p.ck.Names() {
		if !used[n] {
			out = append(out, n)
		}
	}
	return out
}

// job is a run of rows of one checkpoint matrix and where they go.
type job struct {
	src    *PlannedTensor
	m      *matrix
	r0, r1 int64
	off    int64 // file offset of row r0
}

// write converts every tensor into f at the layout's offsets.
func (p *Plan) write(ctx context.Context, f *os.File, lay *gguf.Layout, workers int, chunk int64, logf func(string, ...any)) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if chunk <= 0 {
		chunk = 4 << 20
	}
	var jobs []job
	for i := range p.Sources {
		s := &p.Sources[i]
		off := int64(lay.Offsets[i])
		for _, m := range s.parts {
			rb, err := s.Type.RowBytes(m.cols)
			if err != nil {
				return fmt.Errorf("convert: %s: %w", s.spec.Name, err)
			}
			step := max(1, chunk/m.cols)
			if m.kind == kindInt {
				step = m.rows
			}
			for r := int64(0); r < m.rows; r += step {
				jobs = append(jobs, job{src: s, m: m, r0: r, r1: min(m.rows, r+step), off: off + r*rb})
			}
			off += m.rows * rb
		}
		if uint64(off) != lay.Offsets[i]+lay.Sizes[i] {
			return fmt.Errorf("convert: %s: planned %d bytes, layout has %d", s.spec.Name, off-int64(lay.Offsets[i]), lay.Sizes[i])
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
		next     int
		wg       sync.WaitGroup
		lastName string
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for w := 0; w < min(workers, len(jobs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				if next >= len(jobs) {
					mu.Unlock()
					return
				}
				j := &jobs[next]
				next++
				if n := j.src.spec.Name; n != lastName && j.r0 == 0 {
					lastName = n
					logf("[%d/%d jobs] %s -> %v", next, len(jobs), n, j.src.Type)
				}
				mu.Unlock()
				if err := j.run(f); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// run decodes the job's rows, converts them and writes them.
func (j *job) run(f *os.File) error {
	m := j.m
	n := (j.r1 - j.r0) * m.cols
	var out []byte
	if m.kind == kindInt {
		vals, err := m.ints(j.r0, n)
		if err != nil {
			return fmt.Errorf("convert: %w", err)
		}
		out = make([]byte, 4*n)
		for i, v := range vals {
			if v < 0 || v >= int64(j.src.experts) {
				return fmt.Errorf("convert: %s: expert id %d at entry %d is outside 0..%d", m.name, v, i, j.src.experts-1)
			}
			binary.LittleEndian.PutUint32(out[4*i:], uint32(v))
		}
	} else {
		vals := make([]float32, n)
		if err := m.read(j.r0, j.r1, vals); err != nil {
			return fmt.Errorf("convert: %w", err)
		}
		rb, _ := j.src.Type.RowBytes(m.cols)
		out = make([]byte, (j.r1-j.r0)*rb)
		for r := int64(0); r < j.r1-j.r0; r++ {
			if err := quant.Quantize(j.src.Type, vals[r*m.cols:(r+1)*m.cols], out[r*rb:(r+1)*rb]); err != nil {
				return fmt.Errorf("convert: %s: %w", j.src.spec.Name, err)
			}
		}
	}
	if _, err := f.WriteAt(out, j.off); err != nil {
		return fmt.Errorf("convert: writing %s: %w", j.src.spec.Name, err)
	}
	return nil
}
