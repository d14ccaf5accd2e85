package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"ds4go/chat"
	"ds4go/kvdisk"
)

// KV disk cache defaults (ds4-server's).
const (
	DefaultKVCacheMinTokens          = 512
	DefaultKVCacheColdMaxTokens      = 30000
	DefaultKVCacheContinuedInterval  = 10000
	DefaultKVCacheBoundaryTrimTokens = 32
	DefaultKVCacheBoundaryAlign      = 2048
)

// KVCacheConfig configures the disk KV cache (docs/kvdisk.md). It is off
// when Dir is empty.
type KVCacheConfig struct {
	// Dir holds the checkpoint files.
	Dir string
	// SpaceMB is the disk budget (kvdisk.DefaultBudgetMB when ≤ 0).
	SpaceMB int
	// MinTokens: checkpoints shorter than this are neither saved nor loaded.
	MinTokens int
	// ColdMaxTokens: first prompts of [MinTokens, ColdMaxTokens] tokens get
	// a cold checkpoint before generation (0 disables cold saves).
	ColdMaxTokens int
	// ContinuedIntervalTokens: checkpoints at absolute frontiers spaced this
	// far apart (rounded up to BoundaryAlignTokens; 0 disables).
	ContinuedIntervalTokens int
	// BoundaryTrimTokens are cut from the tail of a cold checkpoint before
	// aligning, so that text a client appends later does not re-tokenize
	// across the boundary.
	BoundaryTrimTokens int
	// BoundaryAlignTokens aligns cold checkpoints down to a multiple of it
	// (0 disables alignment).
	BoundaryAlignTokens int
	// RejectDifferentQuant refuses checkpoints written by a model with
	// other routed-expert quant bits.
	RejectDifferentQuant bool
}

// DefaultKVCacheConfig returns ds4's defaults (Dir empty: off).
func DefaultKVCacheConfig() KVCacheConfig {
	return KVCacheConfig{
		MinTokens:               DefaultKVCacheMinTokens,
		ColdMaxTokens:           DefaultKVCacheColdMaxTokens,
		ContinuedIntervalTokens: DefaultKVCacheContinuedInterval,
		BoundaryTrimTokens:      DefaultKVCacheBoundaryTrimTokens,
		BoundaryAlignTokens:     DefaultKVCacheBoundaryAlign,
	}
}

// PayloadSession is implemented by sessions whose state the disk KV cache
// can save and restore (type-asserted on Engine.NewSession's result).
type PayloadSession interface {
	// PayloadSize is the byte length WritePayload writes now.
	PayloadSize() int64
	// WritePayload writes the session's tokens, logits and KV state.
	WritePayload(w io.Writer) error
	// ReadPayload replaces the session's state with a payload of n bytes.
	// It checks that the payload fits this model; on error the session
	// holds a prefix of what it had (possibly nothing; Tokens tells).
	ReadPayload(r io.Reader, n int64) error
}

// CacheModel is optionally implemented by an Engine to describe its model
// in checkpoint headers.
type CacheModel interface {
	// QuantBits is the routed experts' quantization (2, 4, 8; 0 unknown).
	QuantBits() uint8
}

// kvCache is the scheduler's disk cache state.
type kvCache struct {
	store     *kvdisk.Store
	cfg       KVCacheConfig
	quant     uint8
	lastStore int // the last frontier a continued (or cold) save covered
}

func newKVCache(s *Server, cfg KVCacheConfig, sess Session) (*kvCache, error) {
	if cfg.Dir == "" {
		return nil, nil
	}
	if _, ok := sess.(PayloadSession); !ok {
		return nil, errors.New("server: the engine's sessions cannot be saved (no PayloadSession): the disk KV cache needs them")
	}
	if cfg.ColdMaxTokens > 0 && cfg.ColdMaxTokens < cfg.MinTokens {
		return nil, fmt.Errorf("server: kv cache cold max tokens %d must be 0 or ≥ min tokens %d", cfg.ColdMaxTokens, cfg.MinTokens)
	}
	cfg.MinTokens = max(cfg.MinTokens, 1)
	st, err := kvdisk.Open(kvdisk.Options{Dir: cfg.Dir, BudgetBytes: int64(cfg.SpaceMB) << 20, Logger: s.log})
	if err != nil {
		return nil, err
	}
	kc := &kvCache{store: st, cfg: cfg}
	if cm, ok := s.eng.(CacheModel); ok {
		kc.quant = cm.QuantBits()
	}
	s.log.Info("kv cache: policy", "min", cfg.MinTokens, "cold_max", cfg.ColdMaxTokens,
		"continued", kc.step(), "trim", cfg.BoundaryTrimTokens, "align", cfg.BoundaryAlignTokens,
		"cross_quant", !cfg.RejectDifferentQuant)
	kc.loadAllToolMaps(s)
	return kc, nil
}

// step is the continued-save spacing: the interval rounded up to the
// alignment (0: no continued saves).
func (kc *kvCache) step() int {
	st := kc.cfg.ContinuedIntervalTokens
	if st <= 0 {
		return 0
	}
	if a := kc.cfg.BoundaryAlignTokens; a > 0 {
		st = (st + a - 1) / a * a
	}
	return st
}

// storeLen is the cold checkpoint length for a prompt of n tokens: trim the
// tail, align down, if that still leaves MinTokens; else all n.
func (kc *kvCache) storeLen(n int) int {
	trim, align := kc.cfg.BoundaryTrimTokens, kc.cfg.BoundaryAlignTokens
	if n > kc.cfg.MinTokens+trim {
		st := n - trim
		if align > 0 {
			st -= st % align
		}
		if st >= kc.cfg.MinTokens {
			return st
		}
	}
	return n
}

// anchor returns the position of the last user marker before the first
// assistant marker (the stable part of a chat prompt ends there), or -1
// when that is shorter than MinTokens.
func (kc *kvCache) anchor(toks []int32, user, assistant int32) int {
	last := -1
	for i, t := range toks {
		if t == assistant {
			break
		}
		if t == user {
			last = i
		}
	}
	if last < kc.cfg.MinTokens {
		return -1
	}
	return last
}

// coldLen returns where a cold checkpoint of the prompt goes (0: none).
func (kc *kvCache) coldLen(s *Server, eff []int32, cached int) int {
	n := len(eff)
	if kc.cfg.ColdMaxTokens <= 0 || cached >= kc.cfg.MinTokens || n < kc.cfg.MinTokens || n > kc.cfg.ColdMaxTokens {
		return 0
	}
	user, _ := s.tok.Lookup(chat.UserToken)
	asst, _ := s.tok.Lookup(chat.AssistantToken)
	if a := kc.anchor(eff, user, asst); a > 0 {
		return a
	}
	return kc.storeLen(n)
}

// renderText returns the decoded bytes of tokens (the cache key text).
func (s *Server) renderText(toks []int32) (string, error) {
	var sb strings.Builder
	for _, t := range toks {
		b, err := s.tok.TokenBytes(t)
		if err != nil {
			return "", err
		}
		sb.Write(b)
	}
	return sb.String(), nil
}

// save writes a checkpoint of the live session, which must hold exactly
// the tokens to save. Errors are logged; saving never fails a request.
func (sc *scheduler) kvSave(reason kvdisk.Reason) {
	s, kc := sc.s, sc.kv
	toks := sc.sess.Tokens()
	if kc == nil || len(toks) < kc.cfg.MinTokens || sc.sess.Logits() == nil {
		return
	}
	text, err := s.renderText(toks)
	if err != nil {
		s.log.Warn("kv cache: cannot render the checkpoint text", "err", err)
		return
	}
	if kc.store.Has(text) {
		return
	}
	ps := sc.sess.(PayloadSession)
	h := kvdisk.Header{Quant: kc.quant, Reason: reason, Tokens: uint32(len(toks)), Context: uint32(s.ctxSize)}
	e, err := kc.store.Save(h, text, ps.PayloadSize(), ps.WritePayload, s.toolMem.mappingsIn(text))
	if err != nil {
		s.log.Error("kv cache: save failed", "reason", reason.String(), "tokens", len(toks), "err", err)
		s.metrics.kvDisk.WithLabelValues("save_error").Inc()
		return
	}
	if e != nil {
		s.metrics.kvDisk.WithLabelValues("save_" + reason.String()).Inc()
		s.metrics.kvDiskBytes.Set(float64(kc.store.Usage()))
	}
}

// kvMaybeContinued saves a continued checkpoint when the live session sits
// on an absolute frontier it has not saved yet.
func (sc *scheduler) kvMaybeContinued() {
	if !sc.kvContinuedDue() {
		return
	}
	sc.kvSave(kvdisk.ReasonContinued)
	sc.kv.lastStore = len(sc.sess.Tokens())
}

// kvContinuedDue reports whether kvMaybeContinued would save now.
func (sc *scheduler) kvContinuedDue() bool {
	kc := sc.kv
	if kc == nil {
		return false
	}
	n, st := len(sc.sess.Tokens()), kc.step()
	return st > 0 && n >= kc.cfg.MinTokens && n%st == 0 && n > kc.lastStore
}

// kvLookup tries the disk cache for a prompt the live session covers only
// up to cached tokens. On a hit the session holds the checkpoint and the
// effective prompt (checkpoint tokens + the tokenized text suffix) is
// returned with the loaded token count.
func (sc *scheduler) kvLookup(r *genRequest, cached int) ([]int32, int, bool) {
	s, kc := sc.s, sc.kv
	accept := func(e *kvdisk.Entry) bool {
		t := int(e.Header.Tokens)
		return t >= kc.cfg.MinTokens && t > cached && t < s.ctxSize &&
			(!kc.cfg.RejectDifferentQuant || e.Header.Quant == kc.quant)
	}
	cands := kc.store.Lookup(r.promptText, accept)
	if len(cands) == 0 {
		s.metrics.kvDisk.WithLabelValues("miss").Inc()
		return nil, 0, false
	}
	// The live session is about to be replaced: keep it on disk first
	// (unless all of it is a prefix of the prompt, hence of the checkpoint).
	if cached < len(sc.sess.Tokens()) {
		sc.kvSave(kvdisk.ReasonEvict)
	}
	ps := sc.sess.(PayloadSession)
	for _, e := range cands {
		f, err := kc.store.Load(e)
		if err != nil {
			s.metrics.kvDisk.WithLabelValues("corrupt").Inc()
			continue
		}
		if err := ps.ReadPayload(bytes.NewReader(f.Payload), int64(len(f.Payload))); err != nil {
			kc.store.Reject(e, err)
			s.metrics.kvDisk.WithLabelValues("rejected").Inc()
			continue
		}
		loaded := sc.sess.Tokens()
		if len(loaded) != int(f.Header.Tokens) {
			kc.store.Discard(e, fmt.Errorf("payload has %d tokens, header %d", len(loaded), f.Header.Tokens))
			_ = sc.sess.Rewind(context.Background(), 0)
			continue
		}
		if err := kc.store.Touch(e); err != nil {
			s.log.Warn("kv cache: cannot update hit count", "err", err)
		}
		for _, m := range f.Tools {
			s.toolMem.put(m.ID, m.DSML, dsmlCalls(m.DSML))
		}
		kc.lastStore = len(loaded)
		s.metrics.kvDisk.WithLabelValues("hit").Inc()
		s.log.Info("kv cache: hit", "tokens", len(loaded), "text_bytes", len(f.Text), "prompt_bytes", len(r.promptText),
			"reason", f.Header.Reason.String(), "hits", e.Header.Hits+1, "tools", len(f.Tools), "file", e.Path)
		eff := append(append([]int32(nil), loaded...), s.tok.EncodeWithSpecial(r.promptText[len(f.Text):])...)
		return eff, len(loaded), true
	}
	return nil, 0, false
}

// dsmlCalls counts the calls of a DSML tool-call block.
func dsmlCalls(block string) int {
	return max(1, strings.Count(block, "</"+chat.DSMLToken+"invoke>"))
}

// loadAllToolMaps reads the KTM sections of every cache file into the tool
// memory at startup, so a restarted server renders client tool history
// with the exact sampled DSML before any checkpoint is loaded.
func (kc *kvCache) loadAllToolMaps(s *Server) {
	n := 0
	for _, e := range kc.store.Entries() {
		if e.Header.Flags&kvdisk.FlagToolMap == 0 {
			continue
		}
		ms, err := kvdisk.ReadToolMap(e)
		if err != nil {
			s.log.Warn("kv cache: unreadable tool-id map", "file", e.Path, "err", err)
			continue
		}
		for _, m := range ms {
			s.toolMem.put(m.ID, m.DSML, dsmlCalls(m.DSML))
			n++
		}
	}
	if n > 0 {
		s.log.Info("kv cache: tool-id mappings restored", "ids", n)
	}
}
