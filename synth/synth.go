// Package synth writes DS4-layout GGUF files with random but numerically
// sane weights: the exact tensor table of model.ExpectedTensors for any
// model.Config and storage scheme, the hyperparameter and tokenizer metadata
// a real file carries, and weights whose scale keeps activations O(1) through
// the layers. They serve tests (Build: small models in memory) and
// benchmarks and loader checks on full-size layouts (WriteFile: blocks are
// generated directly at 2.4-4 GB/s per core, so writing the 81 GB q2 Flash
// layout is bound by the file system).
//
// Weights are a pure function of (Options.Seed, tensor name, chunk index):
// the output is byte-identical whatever the parallelism.
//
// Distributions (σ = 1/sqrt(row length) for matrices, so y = W·x keeps the
// scale of a unit-RMS x):
//   - projections, experts, router, indexer, compressors, hyper-connection
//     mixers, output head: zero mean, std σ (approximately normal for float
//     types; for block types random quants with scales set to give σ);
//   - token_embd: std 1 (one row per token is the hidden state);
//   - RMSNorm weights: uniform 1 ± 0.05;
//   - attn_sinks: uniform ±0.5; exp_probs_b (router bias) and
//     output_hc_base: uniform ±0.05;
//   - compressor APE: std 0.05;
//   - hc_*_scale: uniform [0.1, 0.3]; hc_*_base: ±0.1, plus 1 on the
//     diagonal of the combination part, so that pre = sigmoid(..) ≈ 0.5,
//     post = 2·sigmoid(..) ≈ 1 and the Sinkhorn-normalised comb leans
//     towards the identity;
//   - ffn_gate_tid2eid: for each token ExpertsUsed distinct expert ids.
package synth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
	"ds4go/tokenizer"
)

// Options describes a synthetic model.
type Options struct {
	// Config is the model's hyperparameters; it must pass Validate.
	Config model.Config
	// Scheme chooses the storage type per tensor role. The zero Scheme
	// means model.SchemeQ8.
	Scheme model.Scheme
	// Seed selects the weights.
	Seed uint64
	// Vocab is stored in the file's tokenizer metadata; its size must equal
	// Config.Vocab. Nil chooses the real DeepSeek V4 vocabulary when
	// Config.Vocab is RealVocabSize and SmallVocab(Config.Vocab) otherwise.
	Vocab *tokenizer.Vocab
	// Name is general.name ("DeepSeek-V4-synthetic" when empty).
	Name string
	// ExactQuant makes block-quantized tensors by quantizing random floats
	// with quant.Quantize (slow: for small models) instead of generating the
	// blocks directly.
	ExactQuant bool
	// Workers is the number of goroutines filling tensors (GOMAXPROCS when
	// ≤ 0). It does not change the output.
	Workers int
	// HeaderOnly makes WriteFile write only the header and pre-size the
	// file: a sparse file whose tensor data reads as zeros, for trying tools
	// on full-size layouts without the time or the disk space.
	HeaderOnly bool
	// MTP chooses whether the file carries the multi-token-prediction block
	// (model.MTPTensors): not at all (the zero value), beside the model's
	// tensors, or alone (a separate MTP file like ds4's, for --mtp).
	MTP MTPMode
	// Progress, if set, is called after each chunk with the tensor bytes
	// written so far and their total. Calls are serialised.
	Progress func(done, total uint64)
}

// MTPMode says whether a synthetic file carries an MTP block.
type MTPMode uint8

// MTP modes of Options.MTP.
const (
	MTPNone    MTPMode = iota // the model's tensors only
	MTPInclude                // the model's tensors and the MTP block
	MTPOnly                   // the MTP block only (a separate MTP file)
)

// Metadata keys this package adds besides the model's.
const (
	KeySeed   = "ds4go.synth.seed"
	KeyScheme = "ds4go.synth.scheme"
)

// Tiny returns a small configuration that covers every layer kind of the
// family: 6 layers with compression ratios 0, 0, 4, 128, 4, 128, the first 3
// routed by token id, the others by the learned router, and a 1024-token
// vocabulary. Every row length is a multiple of 32, so the q8, f16 and f32
// schemes fit (q2 and q4 need multiples of 256). The indexer's head width
// is 128, the width of the Hadamard transform ds4 applies to it.
func Tiny() model.Config {
	c := model.Flash()
	c.Layers, c.Embed, c.Vocab, c.ContextLen = 6, 64, 1024, 8192
	c.Heads, c.HeadDim, c.RopeDim = 4, 128, 64
	c.QLoraRank, c.OLoraRank, c.OGroups, c.Window = 64, 32, 2, 16
	c.Experts, c.ExpertsUsed, c.ExpertFF, c.HashLayers = 8, 2, 64, 3
	c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK = 4, 128, 4
	c.CompressRatios = model.FlashRatios(c.Layers)
	c.SwigluClamp = clamps(c.Layers)
	return c
}

// Flash returns DeepSeek V4 Flash's hyperparameters cut to the given number of
// layers (its compression pattern and SwiGLU clamps for those layers, at most
// that many hash layers). Flash(43) is Flash itself.
func Flash(layers int) model.Config {
	c := model.Flash()
	c.Layers = layers
	c.HashLayers = min(c.HashLayers, layers)
	c.CompressRatios = model.FlashRatios(layers)
	c.SwigluClamp = clamps(layers)
	return c
}

func clamps(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = 10
	}
	return s
}

// Plan returns the file a set of options describes: its builder (metadata
// and tensor table, in the order ExpectedTensors gives) and byte layout.
func Plan(opts Options) (*gguf.Builder, *gguf.Layout, error) {
	p, err := newPlan(&opts)
	if err != nil {
		return nil, nil, err
	}
	return p.b, p.layout, nil
}

// Build returns a whole synthetic file in memory (for small test models).
func Build(opts Options) ([]byte, error) {
	p, err := newPlan(&opts)
	if err != nil {
		return nil, err
	}
	if p.layout.TotalSize > math.MaxInt {
		return nil, fmt.Errorf("synth: %d bytes do not fit in memory", p.layout.TotalSize)
	}
	buf := make([]byte, p.layout.TotalSize)
	copy(buf, p.layout.Header)
	err = p.run(context.Background(), func(j *job, gen func([]byte)) error {
		gen(buf[j.off : j.off+j.size])
		return nil
	})
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// WriteFile writes a synthetic model to path. The file is pre-sized and its
// tensors are filled concurrently in chunks; it is written under a temporary
// name and renamed into place when complete.
func WriteFile(ctx context.Context, path string, opts Options) (err error) {
	p, err := newPlan(&opts)
	if err != nil {
		return err
	}
	tmp := path + ".partial"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	defer func() {
		if f != nil {
			f.Close()
		}
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := f.Truncate(int64(p.layout.TotalSize)); err != nil {
		return fmt.Errorf("synth: pre-size %s: %w", tmp, err)
	}
	if _, err := f.WriteAt(p.layout.Header, 0); err != nil {
		return fmt.Errorf("synth: write header: %w", err)
	}
	if !opts.HeaderOnly {
		if err := p.fillFile(ctx, f); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		f = nil
		return fmt.Errorf("synth: %w", err)
	}
	f = nil
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return nil
}

// fillFile fills the tensors of the pre-sized file f: workers generate
// chunks into their own buffers and write them with WriteAt. (Generating into
// a shared mapping of the file was measured 1.5-2× slower on tmpfs: per-page
// faults cost more than the serialised pwrite path.)
func (p *plan) fillFile(ctx context.Context, f *os.File) error {
	bufs := sync.Pool{New: func() any { b := make([]byte, 0, chunkTarget); return &b }}
	return p.run(ctx, func(j *job, gen func([]byte)) error {
		bp := bufs.Get().(*[]byte)
		defer bufs.Put(bp)
		if uint64(cap(*bp)) < j.size {
			*bp = make([]byte, j.size)
		}
		b := (*bp)[:j.size]
		gen(b)
		if _, err := f.WriteAt(b, int64(j.off)); err != nil {
			return fmt.Errorf("synth: write %s: %w", p.specs[j.tensor].Name, err)
		}
		return nil
	})
}

// chunkTarget is the size of the unit of work (and of determinism): each
// tensor is cut into chunks of whole blocks of about this many bytes.
const chunkTarget = 2 << 20

type plan struct {
	opts   *Options
	cfg    *model.Config
	specs  []model.TensorSpec
	types  []quant.Type
	b      *gguf.Builder
	layout *gguf.Layout
	jobs   []job

	tables sync.Map // tableKey -> *[1 << 16]uint16
}

type job struct {
	tensor         int
	chunk          int
	first, nblocks uint64 // blocks of the tensor's type (elements for float types)
	off, size      uint64 // bytes in the file
}

func newPlan(opts *Options) (*plan, error) {
	cfg := opts.Config
	cfg.CompressRatios = append([]int(nil), cfg.CompressRatios...)
	cfg.SwigluClamp = append([]float32(nil), cfg.SwigluClamp...)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	if opts.Scheme == (model.Scheme{}) {
		opts.Scheme = model.SchemeQ8
	}
	vocab := opts.Vocab
	if vocab == nil {
		var err error
		if vocab, err = SmallVocab(cfg.Vocab); err != nil {
			return nil, err
		}
	} else if len(vocab.Tokens) != cfg.Vocab {
		return nil, fmt.Errorf("synth: vocabulary has %d tokens, Config.Vocab is %d", len(vocab.Tokens), cfg.Vocab)
	}
	var specs []model.TensorSpec
	switch opts.MTP {
	case MTPNone:
		specs = model.ExpectedTensors(&cfg)
	case MTPInclude:
		specs = append(model.ExpectedTensors(&cfg), model.MTPTensors(&cfg)...)
	case MTPOnly:
		specs = model.MTPTensors(&cfg)
	default:
		return nil, fmt.Errorf("synth: MTP mode %d", opts.MTP)
	}
	if opts.MTP != MTPNone && cfg.MTPRatio() != model.RatioNone {
		return nil, fmt.Errorf("synth: the MTP block must be uncompressed (compress_ratios[%d] = %d)", cfg.Layers, cfg.MTPRatio())
	}
	typed, err := opts.Scheme.Typed(specs)
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	for i, t := range typed {
		if !canGenerate(t.Type, specs[i].Role) {
			return nil, fmt.Errorf("%w: %s as %v", ErrUnsupported, t.Name, t.Type)
		}
	}
	name := opts.Name
	if name == "" {
		name = "DeepSeek-V4-synthetic"
	}
	kvs := cfg.Metadata()
	head := []gguf.KV{kvs[0], // general.architecture
		{Key: "general.name", Value: gguf.Str(name)},
		{Key: KeySeed, Value: gguf.U64(opts.Seed)},
		{Key: KeyScheme, Value: gguf.Str(opts.Scheme.Name)},
	}
	kvs = append(head, kvs[1:]...)
	kvs = append(kvs, model.VocabMetadata(vocab)...)
	b := &gguf.Builder{KVs: kvs, Tensors: typed}
	layout, err := b.Layout()
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	p := &plan{opts: opts, cfg: &cfg, specs: specs, b: b, layout: layout}
	for i, t := range typed {
		p.types = append(p.types, t.Type)
		bs := uint64(t.Type.BlockBytes())
		nblocks := layout.Sizes[i] / bs
		per := max(1, chunkTarget/bs)
		if classify(&specs[i]) != kindMatrix {
			per = nblocks // element-wise structured tensors: one chunk
		}
		for c, first := 0, uint64(0); first < nblocks; c, first = c+1, first+per {
			n := min(per, nblocks-first)
			p.jobs = append(p.jobs, job{tensor: i, chunk: c, first: first, nblocks: n,
				off: layout.Offsets[i] + first*bs, size: n * bs})
		}
	}
	return p, nil
}

// run fills every chunk with a pool of workers; do receives a job and the
// function that generates its bytes into a buffer of j.size bytes.
func (p *plan) run(ctx context.Context, do func(j *job, gen func([]byte)) error) error {
	workers := p.opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, len(p.jobs))
	var total uint64
	for i := range p.jobs {
		total += p.jobs[i].size
	}
	var (
		next     atomic.Int64
		failed   atomic.Bool
		errOnce  sync.Once
		firstErr error
		mu       sync.Mutex
		done     uint64
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		failed.Store(true)
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(p.jobs) {
					return
				}
				if err := ctx.Err(); err != nil {
					fail(err)
					return
				}
				j := &p.jobs[i]
				if err := do(j, func(dst []byte) { p.fill(j, dst) }); err != nil {
					fail(err)
					return
				}
				if p.opts.Progress != nil {
					mu.Lock()
					done += j.size
					p.opts.Progress(done, total)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

type kind int

const (
	kindMatrix kind = iota
	kindNorm
	kindSinks
	kindHCScale
	kindHCBase
	kindSmallBias // output_hc_base, exp_probs_b
	kindTokenMap
)

func classify(sp *model.TensorSpec) kind {
	n := sp.Name
	switch {
	case sp.Role == model.RoleTokenMap:
		return kindTokenMap
	case sp.Role != model.RoleVector:
		return kindMatrix
	case strings.HasSuffix(n, "norm.weight"):
		return kindNorm
	case strings.HasSuffix(n, "attn_sinks.weight"):
		return kindSinks
	case strings.HasSuffix(n, "_scale.weight"):
		return kindHCScale
	case strings.HasSuffix(n, "hc_attn_base.weight"), strings.HasSuffix(n, "hc_ffn_base.weight"):
		return kindHCBase
	}
	return kindSmallBias
}

// matrixStd is the standard deviation of a matrix tensor's values.
func matrixStd(sp *model.TensorSpec) float64 {
	switch {
	case sp.Name == "token_embd.weight":
		return 1
	case strings.HasSuffix(sp.Name, "_ape.weight"):
		return 0.05
	}
	return 1 / math.Sqrt(float64(sp.Dims[0]))
}

// fill generates the bytes of one chunk.
func (p *plan) fill(j *job, dst []byte) {
	sp := &p.specs[j.tensor]
	t := p.types[j.tensor]
	r := &rng{s: streamSeed(p.opts.Seed, sp.Name, j.chunk)}
	switch k := classify(sp); k {
	case kindMatrix:
		p.fillMatrix(r, t, matrixStd(sp), dst)
	case kindTokenMap:
		fillTokenMap(r, p.cfg, dst)
	default:
		x := make([]float32, j.nblocks*uint64(t.BlockSize()))
		p.vector(r, k, x)
		if err := quant.Quantize(t, x, dst); err != nil {
			panic(err) // the types were checked in newPlan
		}
	}
}

func (p *plan) vector(r *rng, k kind, x []float32) {
	u := func(lo, hi float64) float32 { return float32(r.uniform(lo, hi)) }
	hc := p.cfg.HC
	for i := range x {
		switch k {
		case kindNorm:
			x[i] = u(0.95, 1.05)
		case kindSinks:
			x[i] = u(-0.5, 0.5)
		case kindHCScale:
			x[i] = u(0.1, 0.3)
		case kindHCBase:
			x[i] = u(-0.1, 0.1)
			if c := i - 2*hc; c >= 0 && c/hc == c%hc {
				x[i]++ // diagonal of the combination matrix
			}
		default:
			x[i] = u(-0.05, 0.05)
		}
	}
}

// fillTokenMap writes, for every token, ExpertsUsed distinct expert ids.
func fillTokenMap(r *rng, c *model.Config, dst []byte) {
	perm := make([]int32, c.Experts)
	for i := range perm {
		perm[i] = int32(i)
	}
	k := c.ExpertsUsed
	for tok := 0; tok < c.Vocab; tok++ {
		for i := 0; i < k; i++ { // partial Fisher-Yates
			j := i + r.intn(c.Experts-i)
			perm[i], perm[j] = perm[j], perm[i]
			binary.LittleEndian.PutUint32(dst[4*(tok*k+i):], uint32(perm[i]))
		}
	}
}

type tableKey struct {
	t   quant.Type
	std float64
}

// halfTable returns the 16-bit encodings (F16 or BF16) of the normal table
// scaled by std; tables are shared by all tensors of the same std.
func (p *plan) halfTable(t quant.Type, std float64) *[1 << 16]uint16 {
	key := tableKey{t, std}
	if v, ok := p.tables.Load(key); ok {
		return v.(*[1 << 16]uint16)
	}
	var tab [1 << 16]uint16
	for i, x := range normalTable {
		v := float32(float64(x) * std)
		if t == quant.BF16 {
			tab[i] = quant.F32ToBF16(v)
		} else {
			tab[i] = quant.F32ToF16(v)
		}
	}
	v, _ := p.tables.LoadOrStore(key, &tab)
	return v.(*[1 << 16]uint16)
}

func (p *plan) fillMatrix(r *rng, t quant.Type, std float64, dst []byte) {
	switch t {
	case quant.F32:
		for i := 0; i+8 <= len(dst); i += 8 {
			x := r.next()
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(float32(float64(normalTable[uint16(x)])*std)))
			binary.LittleEndian.PutUint32(dst[i+4:], math.Float32bits(float32(float64(normalTable[uint16(x>>16)])*std)))
		}
		if len(dst)%8 != 0 {
			x := r.next()
			binary.LittleEndian.PutUint32(dst[len(dst)-4:], math.Float32bits(float32(float64(normalTable[uint16(x)])*std)))
		}
		return
	case quant.F16, quant.BF16:
		tab := p.halfTable(t, std)
		i := 0
		for ; i+8 <= len(dst); i += 8 {
			x := r.next()
			binary.LittleEndian.PutUint64(dst[i:], uint64(tab[uint16(x)])|uint64(tab[uint16(x>>16)])<<16|
				uint64(tab[uint16(x>>32)])<<32|uint64(tab[uint16(x>>48)])<<48)
		}
		for ; i < len(dst); i += 2 {
			binary.LittleEndian.PutUint16(dst[i:], tab[uint16(r.next())])
		}
		return
	}
	if p.opts.ExactQuant {
		n := len(dst) / t.BlockBytes() * t.BlockSize()
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(float64(normalTable[uint16(r.next())]) * std)
		}
		if err := quant.Quantize(t, x, dst); err != nil {
			panic(err)
		}
		return
	}
	g := blockGens[t]
	d := quant.F32ToF16(float32(std / g.unitStd()))
	g.fill(r, dst, d)
}

// ErrUnsupported is returned for a storage type this package cannot generate.
var ErrUnsupported = errors.New("synth: unsupported tensor type")

func canGenerate(t quant.Type, r model.Role) bool {
	switch {
	case r == model.RoleTokenMap:
		return t == quant.I32
	case t == quant.F32, t == quant.F16, t == quant.BF16:
		return true
	}
	return r != model.RoleVector && blockGens[t] != nil
}
