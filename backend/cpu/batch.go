package cpu

import (
	"fmt"

	"ds4go/engine"
	"ds4go/quant"
)

// batch holds the activations of one chunk of up to cap tokens, all f32,
// token-major.
type batch struct {
	be     *Backend
	cap    int
	n      int // tokens of the current chunk
	pos    int // position of the first token
	tokens []int32

	h      []float32 // [cap][HC·Embed] hyper-connection streams
	x      []float32 // [cap][Embed] sub-block input (after hc_pre and the norm)
	out    []float32 // [cap][Embed] sub-block output
	post   []float32 // [cap][HC] hc_post weights of the current sub-block
	comb   []float32 // [cap][HC·HC] hc_post combination matrix, comb[j·HC+k]
	headIn []float32 // [cap][Embed] head input

	// MTP batches only (engine.Drafter): main-model streams waiting for
	// MTPEmbed, oldest first, [cap][HC·Embed].
	staged  []float32
	nStaged int

	sc scratch
}

// scratch is per-batch working memory: named f32 buffers and quantized
// activations, grown on demand and reused across ops.
type scratch struct {
	bufs map[string][]float32
	ints map[string][]int32
	acts map[actKey][]*quant.Activation
}

type actKey struct {
	t quant.Type
	k int
}

// f32 returns a scratch buffer of n values (contents undefined).
func (s *scratch) f32(name string, n int) []float32 {
	if s.bufs == nil {
		s.bufs = map[string][]float32{}
	}
	b := s.bufs[name]
	if cap(b) < n {
		b = make([]float32, n)
		s.bufs[name] = b
	}
	return b[:n]
}

// i32 returns a scratch buffer of n int32 values (contents undefined).
func (s *scratch) i32(name string, n int) []int32 {
	if s.ints == nil {
		s.ints = map[string][]int32{}
	}
	b := s.ints[name]
	if cap(b) < n {
		b = make([]int32, n)
		s.ints[name] = b
	}
	return b[:n]
}

// activations returns n activations of format t and length k.
func (s *scratch) activations(t quant.Type, k, n int) []*quant.Activation {
	if s.acts == nil {
		s.acts = map[actKey][]*quant.Activation{}
	}
	key := actKey{t, k}
	as := s.acts[key]
	for len(as) < n {
		a, err := quant.NewActivation(t, k)
		if err != nil {
			panic(fmt.Sprintf("cpu: activation %s×%d: %v", t, k, err))
		}
		as = append(as, a)
	}
	s.acts[key] = as
	return as[:n]
}

// NewBatch allocates the activations of a chunk of up to maxTokens tokens.
func (be *Backend) NewBatch(maxTokens int) (engine.Batch, error) {
	if maxTokens <= 0 || maxTokens > 1<<20 {
		return nil, fmt.Errorf("cpu: batch of %d tokens", maxTokens)
	}
	c := &be.cfg
	D, HC := c.Embed, c.HC
	return &batch{
		be: be, cap: maxTokens,
		tokens: make([]int32, maxTokens),
		h:      make([]float32, maxTokens*HC*D),
		x:      make([]float32, maxTokens*D),
		out:    make([]float32, maxTokens*D),
		post:   make([]float32, maxTokens*HC),
		comb:   make([]float32, maxTokens*HC*HC),
		headIn: make([]float32, maxTokens*D),
	}, nil
}

func (b *batch) Release() { *b = batch{} }

func (be *Backend) batchOf(bi engine.Batch) (*batch, error) {
	b, ok := bi.(*batch)
	if !ok || b.be != be {
		return nil, fmt.Errorf("cpu: batch %T does not belong to this backend", bi)
	}
	return b, nil
}

// ReadActivation copies an activation of the current chunk (engine.Inspector).
func (be *Backend) ReadActivation(bi engine.Batch, a engine.Activation, dst []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	D := be.cfg.Embed
	var src []float32
	switch a {
	case engine.ActStreams:
		src = b.h[:b.n*be.cfg.HC*D]
	case engine.ActSubIn:
		src = b.x[:b.n*D]
	case engine.ActSubOut:
		src = b.out[:b.n*D]
	case engine.ActHeadIn:
		src = b.headIn[:b.n*D]
	default:
		return fmt.Errorf("cpu: unknown activation %d", a)
	}
	if len(dst) < len(src) {
		return fmt.Errorf("cpu: activation needs %d values, dst has %d", len(src), len(dst))
	}
	copy(dst, src)
	return nil
}
