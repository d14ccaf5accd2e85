package cuda

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"ds4go/engine"
	"ds4go/model"
	"ds4go/quant"
)

// Options configures the CUDA backend.
type Options struct {
	// Device is the CUDA device to use.
	Device int
	// ClampSharedExpert applies the SwiGLU clamp to the shared expert too, as
	// ds4.c does (backend/cpu's option of the same name; off by default).
	ClampSharedExpert bool
	// Fast lets matrix products sum in parallel, chunks compute attention
	// and indexer scores on the f16 tensor cores (k_attn_flash,
	// k_index_flash; other shapes: TF32 terms) and their Q8_0 and F16
	// products through cuBLAS in f16 (MatMulHalf), prefill in chunks of
	// 4096 (fastChunk), and attention take
	// float exponentials and fused multiply-adds (not bit-identical to the
	// CPU backend; docs/cuda.md has the measured distances). By
	// default every product sums in backend/cpu's order,
	// and the forward pass reproduces the CPU backend's logits bit for bit
	// (but for rare last-bit differences of transcendental functions).
	Fast bool
	// GraphLayers sets graph decode (graph.go): the work of a one-token
	// chunk (Embed to Head) is captured into CUDA graphs of GraphLayers
	// layers each, each launched as one while the host captures the next
	// (GraphLayers ≥ the layer count: one graph per token). 0 means the
	// default, DefaultGraphLayers; negative launches kernel by kernel. The
	// kernels and results are the same either way.
	GraphLayers int
	// Recapture captures each decode token's work into a graph again and
	// updates the executable graph kept for its shape (cudaGraphExecUpdate),
	// instead of recording the work and setting only the kernel nodes whose
	// arguments changed (graph.go). The kernels are the same; for
	// comparison.
	Recapture bool
	// OneStream queues the work that otherwise runs on each batch's side
	// stream (the shared expert, the compressors) on its main stream, in
	// the same order; the results are the same.
	OneStream bool
	// WarmUp, after the upload, runs a prefill chunk (PreferredChunk
	// tokens) and a one-token step through one layer of each kind and the
	// head on a batch and state of its own (warm.go): the one-time costs of
	// a fresh process — kernel modules loaded at their first launch,
	// cuBLAS's set-up and its kernels for the chunk's shapes, the memory
	// pool's growth — are paid at load instead of inside the first prompt.
	// A warm-up that fails (no memory for its chunk, say) is logged and
	// skipped: the first prompt then pays them.
	WarmUp bool
	// Uploaded, when not nil, is called after each weight matrix is copied
	// to the device with its size in bytes (a progress bar for the upload
	// of a large model; small vectors are not reported).
	Uploaded func(bytes int64)
}

// DefaultGraphLayers is Options.GraphLayers when 0: one graph per layer
// (H200, full-size q2: decode 38.0 -> 40.3 tok/s at 2k against plain
// launches; cuda/NOTES.md v4).
const DefaultGraphLayers = 1

// Backend runs the DeepSeek V4 forward pass on one GPU: every weight, the KV
// state of each session and the activations of each batch live in device
// memory; the host only queues work. It implements engine.Backend,
// engine.Inspector and engine.Fingerprinter, op by op the same computation
// as backend/cpu (docs/cuda.md).
type Backend struct {
	dev  *Device
	cfg  model.Config
	opts Options

	layers []dlayer

	embd, out *Weight
	head      dhead // the hyper-connection head and final norm
	mtp       *dmtp // the MTP block (nil without one)

	weights []*Weight
	vecs    []Ptr
	// hcEarly: the hc mixes product is queued late (MatMulLate) so that
	// hc_pre sums the streams' squares before its wait (off with
	// DS4_CUDA_HC_EARLY=0, for comparison; the same results)
	hcEarly bool
	// moeStats (env DS4_CUDA_MOE_STATS=1): log each chunk's routing per
	// layer (selections per expert and the product tiles they make), a
	// diagnostic that synchronises the stream.
	moeStats bool
	// sameRoute (env DS4_CUDA_BENCH_SAME_ROUTE=1; a measurement, never on
	// by default: it changes the model's output): a two-token chunk's second
	// token takes the first token's routed experts and weights, the case
	// where real routing repeats all six experts between adjacent tokens —
	// what the routed products' bytes cost a speculative pass's
	// verification beside random routing's twelve experts (cuda/NOTES.md v48).
	sameRoute bool
	// wgMinTok (env DS4_CUDA_WG_MIN_TOK, default 32; 0: any chunk the
	// library takes): fast chunks multiply the routed experts on the wgmma
	// tensor cores (OptWGMoE) only when their selections average at least
	// this many an expert; smaller chunks take the int8 kernels, as exact
	// mode does. wgmma's tiles decode each expert's weights once per tile
	// of up to 256 rows × 64 tokens, which a chunk of a few selections an
	// expert mostly wastes (cuda/NOTES.md v48, H200 at 25k: a 256-token
	// chunk 110 ms on the int8 kernels against 147, 1024 tokens 186
	// against 203, 2048 tokens 302 against 289).
	wgMinTok int
	// halfChain (fast chunks; off with DS4_CUDA_HALF_CHAIN=0, for
	// comparison): wo_a's cuBLAS product writes f16 (MatMulHalfH) for wo_b,
	// and the shared expert's SwiGLU writes its down product's f16 rows,
	// instead of float outputs converted by ToHalf after them.
	halfChain bool
	// pairs: the routed gate and up products through MatMulGroupedPair
	// (one launch for a decode step's; the same results; off with
	// DS4_CUDA_PAIRS=0, for comparison)
	pairs bool
	// ixSideMax: the indexer's query path of batches of fewer tokens than
	// this runs on the side stream beside q_b (Attention; the same
	// results). DS4_CUDA_IX_SIDE: 0 never, 1 decode steps (fewer than 8
	// tokens; the default), 2 every batch.
	ixSideMax int
	// ixPar: that path on a third stream (side2), beside the compressors,
	// the indexer's compressor first (the same results; off with
	// DS4_CUDA_IX_PAR=0, for comparison)
	ixPar bool
	// ixMarkAll: with ixPar, the scores wait for the indexer's compressor
	// in every batch, not only in those that complete a compressed row
	// (the scores read no other of its writes; DS4_CUDA_IX_MARK=1, for
	// comparison)
	ixMarkAll bool
	// topkRows: the indexer's picks come in row order, the CPU backend's
	// (TopKRowOrder: the top-k skips its sort); off with
	// DS4_CUDA_TOPK_ANY=0, for timing only: best first, the sort kept
	// (exact mode then no longer adds the picked rows in the CPU
	// backend's order, so its bits differ)
	topkRows bool
	// qbRoom: a scoring decode step's q_b runs one CTA an SM and leaves
	// part of each SM's shared memory free (MatVecF32's room), so that the
	// indexer's path (side2: its query product, scores and top-k) runs
	// beside it instead of after it (off with DS4_CUDA_QB_ROOM=0, for
	// comparison; the same results)
	qbRoom bool
	// hcPostMix: fast mode's decode steps form the next HCPre's mixing
	// products in HCPost (HCPostMix) instead of a product kernel between
	// them (off with DS4_CUDA_HC_POST_MIX=0, for comparison; float sums in
	// another order)
	hcPostMix bool
	// hcPostMixEx: exact mode's decode steps do the same in the products'
	// float-weight order (HCPostMixEx: the same bits as the product kernel;
	// off with DS4_CUDA_HC_POST_MIX_EX=0, for comparison)
	hcPostMixEx bool
	// postMixMax: the most tokens of a chunk whose HCPost forms the mixing
	// products (hcPostMix): speculative decoding's passes of up to
	// HCPostMixMaxTokens too (DS4_CUDA_POST_MIX_MAX=1: decode steps only,
	// 2: one draft's passes, for comparison; fast mode's three-token passes
	// +16 % with them, cuda/NOTES.md v70)
	postMixMax int
	// stepMax: the most tokens of a chunk that take a decode step's
	// layer-chain shortcuts (kvSide with ropeTable, ringNorm, moeFold):
	// speculative decoding's two-token passes too (DS4_CUDA_STEP_MAX=1:
	// decode steps only, for comparison; the same results either way)
	stepMax int
	// mtpGraph: the MTP block's draft chunk (MTPEmbedDraft … MTPHeadDraft)
	// records its layer and head as a graph; off by default
	// (DS4_CUDA_MTP_GRAPH=1 turns it on): the GPU then waits for the
	// whole recording after the host's round trip, where plain launches
	// start it at once (cuda/NOTES.md v46)
	mtpGraph bool
	// routerAct: a decode step's routed-expert Q8_K activation is formed by
	// the router's launch (RouterQ8K) instead of a quantize launch after it
	// (the same bytes; off with DS4_CUDA_ROUTER_ACT=0, for comparison)
	routerAct bool
	// downGLU: a decode step's routed down product forms its Q8_K
	// activation from the gate and up outputs itself (MatMulGroupedSwiGLU)
	// instead of a SwiGLU launch before it (the same bytes; off with
	// DS4_CUDA_DOWN_GLU=0, for comparison)
	downGLU bool
	// nrPair: the query heads' and the KV row's norm and rotation through
	// NormRopePair (one launch for a decode step's; the same results; off
	// with DS4_CUDA_NR_PAIR=0, for comparison)
	nrPair bool
	// ropeTable: a decode step's rotation (cosine, sine) per pair is
	// computed once a layer on the side stream (RopeTable, before the KV
	// product) and read by the norms and the attention's inverse rotation
	// instead of computed in each (the same values; off with
	// DS4_CUDA_ROPE_TABLE=0, for comparison)
	ropeTable bool
	// ringNorm: a decode step's KV row goes into the window ring from
	// NormRopePair's launch (its slot holds none of the step's window keys)
	// instead of a RingWrite after the output projection, on the layer's
	// chain (the same state; off with DS4_CUDA_RING_NORM=0, for comparison)
	ringNorm bool
	// kvSide: a decode step's KV product runs on the side stream, ahead
	// of the compressors, beside q_a and q_b, instead of between them on
	// the main stream, which waits for it (evKV) before the norms; actSide:
	// a decode step's routed-expert activation is quantized on the side
	// stream ahead of the shared expert, beside the router, and the routed
	// products wait for it (evAct). The same results; kvSide is on (off
	// with DS4_CUDA_KV_SIDE=0), actSide off (on with DS4_CUDA_ACT_SIDE=1:
	// −1 % at 8k on the H200, cuda/NOTES.md v26).
	kvSide, actSide bool
	// moeFold: a decode step's MoE sum is formed by the HCPost after it
	// (HCPostMixMoE) instead of a MoECombine launch between them, where
	// that HCPost forms the next mixes (the same results; off with
	// DS4_CUDA_MOE_FOLD=0, for comparison)
	moeFold bool
	// woQ8: a decode step's wo_a quantizes its output for wo_b in its own
	// launch (MatMulQ8Out: each CTA one block of 32 rows; exact mode too
	// since v57), and wo_b copies that Q8_0 row instead of every CTA
	// reading wo_a's floats and quantizing them (the same bits; off with
	// DS4_CUDA_WO_Q8=0)
	woQ8        bool
	fingerprint []byte
	gstats      graphCounters

	// profileAt is the one-token chunk (counted from 1) whose work runs
	// between cudaProfilerStart and Stop, for `ncu --profile-from-start off`
	// on any command (env DS4_CUDA_PROFILE_DECODE); decoded counts them.
	profileAt int
	// pickTimeout, when positive, replaces pickTimeout (picked.go; tests).
	pickTimeout time.Duration
	decoded     atomic.Int64
}

type dhc struct {
	fn          *Weight // [HCMixes][HC·Embed]
	scale, base Ptr     // 3 and HCMixes floats
}

type dcomp struct {
	ratio, coff, width int
	ape                Ptr // [ratio][coff·width]
	kv, gate           *Weight
	norm               Ptr
}

type dindexer struct {
	qb, proj *Weight
	comp     dcomp
	hadScale float32
}

type dlayer struct {
	index, ratio int
	hash         bool
	freqs        Ptr
	clamp        float32

	hcAttn, hcFFN     dhc
	attnNorm, ffnNorm Ptr

	qa, qb, kv *Weight
	qNorm      Ptr
	kvNorm     Ptr
	sinks      Ptr
	outA, outB *Weight // outA: OGroups matrices of OLoraRank rows
	comp       *dcomp
	idx        *dindexer

	gate                       *Weight
	bias                       Ptr // 0 on hash layers or without exp_probs_b
	tid2eid                    Ptr // [Vocab][ExpertsUsed] on hash layers
	gateExps, upExps, downExps *Weight
	gateSh, upSh, downSh       *Weight
}

// New opens the CUDA device and uploads the weights. The host copies (w's
// tensor bytes) are not needed afterwards.
func New(w *model.Weights, opts Options) (*Backend, error) {
	switch {
	case opts.GraphLayers == 0:
		opts.GraphLayers = DefaultGraphLayers
	case opts.GraphLayers < 0:
		opts.GraphLayers = 0 // plain launches
	}
	c := w.Config
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if (c.HeadDim-c.RopeDim)%64 != 0 {
		return nil, fmt.Errorf("cuda: head_dim %d − rope dims %d is not a multiple of the FP8 block 64", c.HeadDim, c.RopeDim)
	}
	if c.HC > 16 {
		return nil, fmt.Errorf("cuda: %d hyper-connection streams (at most 16)", c.HC)
	}
	for l := 0; l < c.Layers; l++ {
		if c.Ratio(l) == model.RatioIndexed {
			ihd := c.IndexerHeadDim
			if ihd&(ihd-1) != 0 || ihd%32 != 0 || ihd > 4096 {
				return nil, fmt.Errorf("cuda: indexer head dim %d must be a power of two, a multiple of 32, at most 4096", ihd)
			}
		}
	}
	profileAt := 0
	if v := os.Getenv("DS4_CUDA_PROFILE_DECODE"); v != "" {
		var err error
		if profileAt, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("cuda: DS4_CUDA_PROFILE_DECODE=%q: %w", v, err)
		}
	}
	dev, err := Open(opts.Device)
	if err != nil {
		return nil, err
	}
	if err := fitsDevice(w.Bytes(), dev.Info()); err != nil {
		return nil, err
	}
	be := &Backend{dev: dev, cfg: c, opts: opts, profileAt: profileAt, hcEarly: os.Getenv("DS4_CUDA_HC_EARLY") != "0",
		moeStats: os.Getenv("DS4_CUDA_MOE_STATS") == "1", sameRoute: os.Getenv("DS4_CUDA_BENCH_SAME_ROUTE") == "1",
		halfChain: os.Getenv("DS4_CUDA_HALF_CHAIN") != "0",
		pairs:     os.Getenv("DS4_CUDA_PAIRS") != "0", ixSideMax: 8,
		nrPair:    os.Getenv("DS4_CUDA_NR_PAIR") != "0",
		ixPar:     os.Getenv("DS4_CUDA_IX_PAR") != "0",
		ixMarkAll: os.Getenv("DS4_CUDA_IX_MARK") == "1", topkRows: os.Getenv("DS4_CUDA_TOPK_ANY") != "0",
		qbRoom:    os.Getenv("DS4_CUDA_QB_ROOM") != "0",
		hcPostMix: os.Getenv("DS4_CUDA_HC_POST_MIX") != "0", hcPostMixEx: os.Getenv("DS4_CUDA_HC_POST_MIX_EX") != "0",
		mtpGraph: os.Getenv("DS4_CUDA_MTP_GRAPH") == "1"}
	for _, sw := range be.goSwitches() { // on unless "0"; off by default unless "1"
		v := os.Getenv(sw.env)
		*sw.v = v == "1" || (sw.on && v != "0")
	}
	be.postMixMax, be.stepMax = HCPostMixMaxTokens, 2
	for _, l := range be.goLimits() {
		if v, ok := parseLimit(os.Getenv(l.env)); ok {
			*l.v = v
		}
	}
	if be.wgMinTok, err = envCount("DS4_CUDA_WG_MIN_TOK", 32, "a count of selections an expert, 0 or more"); err != nil {
		be.Close()
		return nil, err
	}
	switch os.Getenv("DS4_CUDA_IX_SIDE") {
	case "0":
		be.ixSideMax = 0
	case "2":
		be.ixSideMax = math.MaxInt
	}
	if err := be.prepare(w); err != nil {
		be.Close()
		return nil, err
	}
	if opts.Fast {
		// cuBLAS (fast mode's chunk products) loads and initialises now,
		// not inside the first prompt; without it, nothing changes
		be.dev.HalfWarm()
	}
	if opts.Fast {
		if err := be.halfCopies(); err != nil {
			be.Close()
			return nil, err
		}
	}
	if opts.WarmUp {
		if err := be.warmUp(be.PreferredChunk()); err != nil {
			slog.Warn("cuda: warm-up skipped; the first prompt pays the one-time costs", "err", err)
		}
	}
	return be, nil
}

// fitsDevice refuses, before anything is uploaded, a model whose weights
// (need bytes, all resident) and the upload's staging buffer do not fit
// the device's free memory — Flash q2's 80.8 GiB on an 80 GB H100, which
// would otherwise fail after copying most of it. A device that reports
// no free memory (an older library) is not checked.
func fitsDevice(need int64, info Info) error {
	free := int64(info.FreeMem)
	if free <= 0 || need+stagingBytes <= free {
		return nil
	}
	const gib = 1 << 30
	return fmt.Errorf("cuda: the model's weights need %.1f GiB of device memory, and %s has %.1f GiB free of %.1f GiB: "+
		"use a smaller quantization, a GPU with more memory, or the CPU backend",
		float64(need)/gib, info.Name, float64(free)/gib, float64(info.TotalMem)/gib)
}

// Close frees the backend's device memory. Sessions must be closed first.
func (be *Backend) Close() error {
	for _, w := range be.weights {
		be.dev.FreeWeight(w)
	}
	for _, p := range be.vecs {
		be.dev.Free(p)
	}
	be.weights, be.vecs = nil, nil
	return nil
}

func (be *Backend) exact() bool { return !be.opts.Fast }

// Name returns "cuda".
func (be *Backend) Name() string { return "cuda" }

// PreferredChunk is the prefill chunk size sessions use by default
// (engine.ChunkSizer): tensor-core products read a weight row once per 32
// tokens of a chunk and the routed experts see more tokens each, so long
// chunks pay (H200, full-size q2: prefill at 8k 1310 tok/s with chunks of
// 512, 1619 with 2048; cuda/NOTES.md v4). Fast mode takes fastChunk.
func (be *Backend) PreferredChunk() int {
	if be.opts.Fast {
		return fastChunk
	}
	return 2048
}

// fastChunk is fast mode's prefill chunk: with the flash attention its
// chunks keep no per-key buffer, and the routed experts' tiles fill better
// (H200, full-size q2, an 8k prompt: 5945 tok/s in chunks of 2048, 6416 in
// chunks of 4096; cuda/NOTES.md v16).
const fastChunk = 4096

// Config returns the model's hyperparameters.
func (be *Backend) Config() *model.Config { return &be.cfg }

// Device returns the device the backend runs on.
func (be *Backend) Device() *Device { return be.dev }

// goSwitch is one of the backend's own switches, read from its environment
// variable at New, that keep a step's results: flipped between decode runs
// it changes which kernels a step queues, not their bits
// (TestFastDecodeSwitches flips each), so an in-process A/B may switch it
// (SetOptionEnv). on is its default: "0" turns a switch on by default off,
// and only "1" turns one off by default on.
type goSwitch struct {
	env string
	v   *bool
	on  bool
}

func (be *Backend) goSwitches() []goSwitch {
	return []goSwitch{
		{"DS4_CUDA_MOE_FOLD", &be.moeFold, true},
		{"DS4_CUDA_KV_SIDE", &be.kvSide, true},
		{"DS4_CUDA_ACT_SIDE", &be.actSide, false},
		{"DS4_CUDA_ROUTER_ACT", &be.routerAct, true},
		{"DS4_CUDA_DOWN_GLU", &be.downGLU, true},
		{"DS4_CUDA_ROPE_TABLE", &be.ropeTable, true},
		{"DS4_CUDA_RING_NORM", &be.ringNorm, true},
		{"DS4_CUDA_WO_Q8", &be.woQ8, true},
	}
}

// goLimit is one of the backend's own token-count limits (1 to
// HCPostMixMaxTokens), read from its environment variable at New, which an
// in-process A/B may set (SetOptionEnv) between decode runs: they pick
// which kernels a chunk of that many tokens queues (stepMax keeps the
// results; postMixMax moves fast mode's float order, not exact mode's).
type goLimit struct {
	env string
	v   *int
}

func (be *Backend) goLimits() []goLimit {
	return []goLimit{{"DS4_CUDA_STEP_MAX", &be.stepMax}, {"DS4_CUDA_POST_MIX_MAX", &be.postMixMax}}
}

// parseLimit reads a goLimit's value: 1 to HCPostMixMaxTokens tokens.
func parseLimit(val string) (int, bool) {
	v, err := strconv.Atoi(val)
	return v, err == nil && v >= 1 && v <= HCPostMixMaxTokens
}

// goLimitOf returns the goLimit whose environment variable is name.
func (be *Backend) goLimitOf(name string) (goLimit, bool) {
	for _, l := range be.goLimits() {
		if l.env == name {
			return l, true
		}
	}
	return goLimit{}, false
}

// goSwitchOf returns the goSwitch whose environment variable is name.
func (be *Backend) goSwitchOf(name string) (goSwitch, bool) {
	for _, sw := range be.goSwitches() {
		if sw.env == name {
			return sw, true
		}
	}
	return goSwitch{}, false
}

// SetOptionEnv sets an option by its environment variable ("NAME=VALUE"):
// one of the backend's own result-keeping switches (goSwitches; 0 off, 1
// on) or token-count limits (goLimits), else the library's
// (Device.SetOptionEnv). ds4-bench --ab switches all of them through it
// (bench.OptionSetter).
func (be *Backend) SetOptionEnv(assign string) error {
	name, val, _ := strings.Cut(assign, "=")
	name, val = strings.TrimSpace(name), strings.TrimSpace(val)
	if l, ok := be.goLimitOf(name); ok {
		v, ok := parseLimit(val)
		if !ok {
			return fmt.Errorf("cuda: %s=%q: the limit takes 1 to %d tokens", name, val, HCPostMixMaxTokens)
		}
		*l.v = v
		return nil
	}
	if sw, ok := be.goSwitchOf(name); ok {
		switch val {
		case "0":
			*sw.v = false
		case "1":
			*sw.v = true
		default:
			return fmt.Errorf("cuda: %s=%q: the switch takes 0 or 1", name, val)
		}
		return nil
	}
	if be.dev == nil {
		return fmt.Errorf("cuda: option %q: no device", name)
	}
	return be.dev.SetOptionEnv(assign)
}

// OptionEnv returns the current value of the option whose environment
// variable is name: a goSwitch's 0 or 1, a goLimit's count, else the
// library's.
func (be *Backend) OptionEnv(name string) (int, error) {
	if l, ok := be.goLimitOf(name); ok {
		return *l.v, nil
	}
	if sw, ok := be.goSwitchOf(name); ok {
		if *sw.v {
			return 1, nil
		}
		return 0, nil
	}
	if be.dev == nil {
		return 0, fmt.Errorf("cuda: option %q: no device", name)
	}
	return be.dev.OptionEnv(name)
}

// WeightsFingerprint identifies the weights (engine.Fingerprinter), computed
// exactly as backend/cpu computes it, so snapshots move between the two.
func (be *Backend) WeightsFingerprint() []byte { return be.fingerprint }

// hostVec decodes a small tensor to f32, checking its length.
func hostVec(t *model.Tensor, n int) ([]float32, error) {
	if t == nil {
		return nil, fmt.Errorf("missing tensor")
	}
	if total := t.RowLen() * t.Rows(); total != n {
		return nil, fmt.Errorf("%s: %d values, want %d", t.Name, total, n)
	}
	out := make([]float32, n)
	if err := quant.Dequantize(t.Type, t.Data, out); err != nil {
		return nil, fmt.Errorf("%s: %w", t.Name, err)
	}
	return out, nil
}

func (be *Backend) upF32(v []float32) (Ptr, error) {
	p, err := be.dev.Malloc(int64(4 * max(1, len(v))))
	if err != nil {
		return 0, err
	}
	be.vecs = append(be.vecs, p)
	return p, UploadSlice(be.dev, p, v)
}

func (be *Backend) upI32(v []int32) (Ptr, error) {
	p, err := be.dev.Malloc(int64(4 * max(1, len(v))))
	if err != nil {
		return 0, err
	}
	be.vecs = append(be.vecs, p)
	return p, UploadSlice(be.dev, p, v)
}

// vec uploads a small tensor as f32 values.
func (be *Backend) vec(t *model.Tensor, n int) (Ptr, []float32, error) {
	v, err := hostVec(t, n)
	if err != nil {
		return 0, nil, err
	}
	p, err := be.upF32(v)
	return p, v, err
}

// mat uploads a weight tensor as mats matrices of rows × k values.
func (be *Backend) mat(t *model.Tensor, mats, rows, k int) (*Weight, error) {
	if t == nil {
		return nil, fmt.Errorf("missing tensor")
	}
	if t.RowLen() != k || t.Rows() != mats*rows {
		return nil, fmt.Errorf("%s: shape %v, want %d rows of %d", t.Name, t.Dims, mats*rows, k)
	}
	if _, err := quant.ActivationType(t.Type); err != nil {
		return nil, fmt.Errorf("%s: %w", t.Name, err)
	}
	w, err := be.dev.UploadWeight(t.Type, rows, k, mats, t.Data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Name, err)
	}
	be.weights = append(be.weights, w)
	if be.opts.Uploaded != nil {
		be.opts.Uploaded(int64(len(t.Data)))
	}
	return w, nil
}

func (be *Backend) prepare(w *model.Weights) error {
	c := &be.cfg
	D, HC, mixes := c.Embed, c.HC, c.HCMixes()
	var err error
	wrap := func(what string, e error) error {
		if e == nil {
			return nil
		}
		return fmt.Errorf("cuda: %s: %w", what, e)
	}
	switch w.TokenEmbd.Type {
	case quant.F32, quant.F16, quant.BF16, quant.Q8_0:
	default:
		return fmt.Errorf("cuda: token_embd of type %s is not supported", w.TokenEmbd.Type)
	}
	if be.embd, err = be.mat(w.TokenEmbd, 1, c.Vocab, D); err != nil {
		return wrap("token_embd", err)
	}
	if be.out, err = be.mat(w.Output, 1, c.Vocab, D); err != nil {
		return wrap("output", err)
	}
	var outNorm, headBase, sinks0, normLast []float32
	if be.head.norm, outNorm, err = be.vec(w.OutputNorm, D); err != nil {
		return wrap("output_norm", err)
	}
	if be.head.fn, err = be.mat(w.OutputHCFn, 1, HC, HC*D); err != nil {
		return wrap("output_hc_fn", err)
	}
	if be.head.base, headBase, err = be.vec(w.OutputHCBase, HC); err != nil {
		return wrap("output_hc_base", err)
	}
	if be.head.scale, _, err = be.vec(w.OutputHCScal, 1); err != nil {
		return wrap("output_hc_scale", err)
	}
	hc := func(fn, scale, base *model.Tensor) (dhc, error) {
		var h dhc
		var err error
		if h.fn, err = be.mat(fn, 1, mixes, HC*D); err != nil {
			return h, err
		}
		if h.scale, _, err = be.vec(scale, 3); err != nil {
			return h, err
		}
		h.base, _, err = be.vec(base, mixes)
		return h, err
	}
	comp := func(cw *model.Compressor, ratio, width int) (dcomp, error) {
		cp := dcomp{ratio: ratio, coff: 1, width: width}
		if ratio == model.RatioIndexed {
			cp.coff = 2
		}
		var err error
		if cp.ape, _, err = be.vec(cw.APE, ratio*cp.coff*width); err != nil {
			return cp, err
		}
		if cp.kv, err = be.mat(cw.KV, 1, cp.coff*width, D); err != nil {
			return cp, err
		}
		if cp.gate, err = be.mat(cw.Gate, 1, cp.coff*width, D); err != nil {
			return cp, err
		}
		cp.norm, _, err = be.vec(cw.Norm, width)
		return cp, err
	}
	be.layers = make([]dlayer, c.Layers)
	for l := range be.layers {
		attnNorm, sinks, err := be.prepareLayer(&be.layers[l], &w.Layers[l], hc, comp)
		if err != nil {
			return err
		}
		if l == 0 {
			sinks0 = sinks
		}
		if l == len(be.layers)-1 {
			normLast = attnNorm
		}
	}
	if w.MTP != nil {
		if err := be.prepareMTP(w.MTP, hc, comp); err != nil {
			return err
		}
	}
	if err := be.dev.Synchronize(); err != nil {
		return err
	}
	// The same fingerprint as backend/cpu.
	h := sha256.New()
	h.Write([]byte(w.Scheme))
	for _, v := range [][]float32{outNorm, headBase, sinks0, normLast} {
		for _, x := range v {
			h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(x)))
		}
	}
	h.Write(w.TokenEmbd.Row(0))
	be.fingerprint = h.Sum(nil)
	return nil
}

type (
	hcPrep   func(fn, scale, base *model.Tensor) (dhc, error)
	compPrep func(cw *model.Compressor, ratio, width int) (dcomp, error)
)

// prepareLayer uploads block wl (a layer or the MTP block) into L and
// returns its attention norm and sinks (for the fingerprint).
func (be *Backend) prepareLayer(L *dlayer, wl *model.Layer, hc hcPrep, comp compPrep) (attnNorm, sinks []float32, err error) {
	c := &be.cfg
	D, H, HD, QL := c.Embed, c.Heads, c.HeadDim, c.QLoraRank
	E, FF := c.Experts, c.ExpertFF
	l := wl.Index
	L.index, L.ratio, L.hash = l, c.Ratio(l), c.IsHashLayer(l)
	L.clamp = c.Clamp(l)
	if L.freqs, err = be.upF32(engine.RopeFrequencies(c, l)); err != nil {
		return nil, nil, err
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"hc_attn", func() (e error) { L.hcAttn, e = hc(wl.HCAttnFn, wl.HCAttnScale, wl.HCAttnBase); return }},
		{"hc_ffn", func() (e error) { L.hcFFN, e = hc(wl.HCFFNFn, wl.HCFFNScale, wl.HCFFNBase); return }},
		{"attn_norm", func() (e error) { L.attnNorm, attnNorm, e = be.vec(wl.AttnNorm, D); return }},
		{"ffn_norm", func() (e error) { L.ffnNorm, _, e = be.vec(wl.FFNNorm, D); return }},
		{"attn_q_a", func() (e error) { L.qa, e = be.mat(wl.QA, 1, QL, D); return }},
		{"attn_q_a_norm", func() (e error) { L.qNorm, _, e = be.vec(wl.QANorm, QL); return }},
		{"attn_q_b", func() (e error) { L.qb, e = be.mat(wl.QB, 1, H*HD, QL); return }},
		{"attn_kv", func() (e error) { L.kv, e = be.mat(wl.KV, 1, HD, D); return }},
		{"attn_kv_a_norm", func() (e error) { L.kvNorm, _, e = be.vec(wl.KVNorm, HD); return }},
		{"attn_sinks", func() (e error) { L.sinks, sinks, e = be.vec(wl.Sinks, H); return }},
		{"attn_output_a", func() (e error) { L.outA, e = be.mat(wl.OutA, c.OGroups, c.OLoraRank, H*HD/c.OGroups); return }},
		{"attn_output_b", func() (e error) { L.outB, e = be.mat(wl.OutB, 1, D, c.OGroups*c.OLoraRank); return }},
		{"ffn_gate_inp", func() (e error) { L.gate, e = be.mat(wl.GateInp, 1, E, D); return }},
		{"ffn_gate_exps", func() (e error) { L.gateExps, e = be.mat(wl.GateExps, E, FF, D); return }},
		{"ffn_up_exps", func() (e error) { L.upExps, e = be.mat(wl.UpExps, E, FF, D); return }},
		{"ffn_down_exps", func() (e error) { L.downExps, e = be.mat(wl.DownExps, E, D, FF); return }},
		{"ffn_gate_shexp", func() (e error) { L.gateSh, e = be.mat(wl.GateShexp, 1, FF, D); return }},
		{"ffn_up_shexp", func() (e error) { L.upSh, e = be.mat(wl.UpShexp, 1, FF, D); return }},
		{"ffn_down_shexp", func() (e error) { L.downSh, e = be.mat(wl.DownShexp, 1, D, FF); return }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return nil, nil, fmt.Errorf("cuda: layer %d %s: %w", l, s.what, err)
		}
	}
	if L.ratio != model.RatioNone {
		if wl.Compressor == nil {
			return nil, nil, fmt.Errorf("cuda: layer %d: no compressor", l)
		}
		cp, err := comp(wl.Compressor, L.ratio, HD)
		if err != nil {
			return nil, nil, fmt.Errorf("cuda: layer %d attention compressor: %w", l, err)
		}
		L.comp = &cp
	}
	if L.ratio == model.RatioIndexed {
		if wl.Indexer == nil {
			return nil, nil, fmt.Errorf("cuda: layer %d: no indexer", l)
		}
		ix := &dindexer{}
		IH, IHD := c.IndexerHeads, c.IndexerHeadDim
		ix.hadScale = float32(math.Pow(float64(IHD), -0.5))
		if ix.qb, err = be.mat(wl.Indexer.QB, 1, IH*IHD, QL); err != nil {
			return nil, nil, fmt.Errorf("cuda: layer %d indexer q_b: %w", l, err)
		}
		if ix.proj, err = be.mat(wl.Indexer.Proj, 1, IH, D); err != nil {
			return nil, nil, fmt.Errorf("cuda: layer %d indexer proj: %w", l, err)
		}
		if ix.comp, err = comp(&wl.Indexer.Compressor, L.ratio, IHD); err != nil {
			return nil, nil, fmt.Errorf("cuda: layer %d indexer compressor: %w", l, err)
		}
		L.idx = ix
	}
	if L.hash {
		t := wl.Tid2Eid
		if t == nil || t.Type != quant.I32 || t.RowLen() != c.ExpertsUsed || t.Rows() != c.Vocab {
			return nil, nil, fmt.Errorf("cuda: layer %d: tid2eid must be I32 [%d][%d]", l, c.Vocab, c.ExpertsUsed)
		}
		ids := make([]int32, c.Vocab*c.ExpertsUsed)
		for i := range ids {
			e := int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
			if e < 0 || int(e) >= E {
				return nil, nil, fmt.Errorf("cuda: layer %d: tid2eid[%d] = %d is not an expert", l, i, e)
			}
			ids[i] = e
		}
		if L.tid2eid, err = be.upI32(ids); err != nil {
			return nil, nil, err
		}
	} else if wl.ExpProbsBias != nil {
		if L.bias, _, err = be.vec(wl.ExpProbsBias, E); err != nil {
			return nil, nil, fmt.Errorf("cuda: layer %d exp_probs_b: %w", l, err)
		}
	}
	return attnNorm, sinks, nil
}

var _ engine.Backend = (*Backend)(nil)
var _ engine.Inspector = (*Backend)(nil)
var _ engine.Fingerprinter = (*Backend)(nil)
