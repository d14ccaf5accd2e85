package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// DSV4 session payload: the session state as the disk KV cache stores it
// (package kvdisk wraps it in a KVC file). The layout follows the payload
// antirez/ds4 describes for its disk cache (ds4 README, "Disk KV Cache"):
// thirteen little-endian u32 header fields, then the tokens, the logits,
// per-layer row counts and the per-layer tensors. All values little-endian:
//
//	 0 magic "DSV4" (bytes 'D' 'S' 'V' '4')
//	 1 payload version (PayloadVersion)
//	 2 saved context size (the session's MaxContext)
//	 3 prefill chunk size (ChunkSize; informational)
//	 4 raw KV ring capacity (window ring slots: Window + rewind slack; informational)
//	 5 raw sliding-window length (Config.Window)
//	 6 compressed KV capacity (MaxContext / 4: rows of a ratio-4 table)
//	 7 checkpoint token count n
//	 8 layer count
//	 9 raw/head KV dimension (HeadDim)
//	10 indexer head dimension (IndexerHeadDim)
//	11 vocabulary size
//	12 live raw rows serialized per layer (min(n, Window+1): the rows the
//	   window attention of positions n−2 … n reads)
//
// then
//
//	u32[n]            tokens
//	f32[vocab]        logits for the token after them
//	u32[layers]       compressed attention rows per layer (n / ratio, 0 for ratio-0 layers)
//	u32[layers]       indexer rows per layer (n / 4 on ratio-4 layers, else 0)
//	per layer:        raw window rows, positions [n − raw, n) in position
//	                  order (not ring order), HeadDim f32 each
//	per ratio>0 layer: compressed rows [0, rows) (HeadDim f32 each), then the
//	                  compressor frontier: comp_kv then comp_score entries of
//	                  positions [Need(n−2), n) (coff·HeadDim f32 each)
//	per ratio-4 layer: indexer rows [0, rows) (IndexerHeadDim f32 each), then
//	                  index_kv then index_score entries of positions
//	                  [Need(n−2), n) (2·IndexerHeadDim f32 each)
//
// where Need is StateLayout.Need: the frontier positions the compressor
// still pools (the current block, at ratio 4 also the previous one). The
// payload stores exactly what continuing at positions n−2 … n needs (a
// restored session can continue, or rewind one token cheaply), so its size
// is fixed by n and the model; the frontier counts are not stored but
// recomputed by the reader from its layout, and the row counts are checked
// against it (this is what catches another model's ratios). The payload
// has no checksum of its own: the KVC file around it carries one.
const (
	payloadMagic = "DSV4"
	// PayloadVersion is the DSV4 payload version this build writes and reads.
	PayloadVersion = 1
	payloadHeader  = 13
)

// stateSections lists the payload's tensors for a session at pos, in
// file order.
func (l *StateLayout) stateSections(pos int) []stateSection {
	// Ring parts keep what position pos−2 needs: a restored session can
	// continue, or rewind by one token (Rewind(pos−1) re-runs the token at
	// pos−2), without re-deriving its prefix.
	at := max(pos-2, 0)
	var secs []stateSection
	for layer := 0; layer < l.Config.Layers; layer++ {
		need := l.Need(layer, PartWindow, at)
		secs = append(secs, stateSection{layer: layer, part: PartWindow, first: need, n: pos - need})
	}
	for layer := 0; layer < l.Config.Layers; layer++ {
		for _, grp := range [][3]StatePart{{PartComp, PartCompKV, PartCompScore}, {PartIndex, PartIndexKV, PartIndexScore}} {
			if !l.Has(layer, grp[0]) {
				continue
			}
			secs = append(secs, stateSection{layer: layer, part: grp[0], n: l.Rows(layer, grp[0], pos)})
			for _, p := range grp[1:] {
				need := l.Need(layer, p, at)
				secs = append(secs, stateSection{layer: layer, part: p, first: need, n: pos - need})
			}
		}
	}
	return secs
}

// rawRows is header field 12: the window rows stored per layer.
func (l *StateLayout) rawRows(pos int) int { return pos - l.Need(0, PartWindow, max(pos-2, 0)) }

// PayloadSize returns the byte length WritePayload will write for the
// session's current state.
func (s *Session) PayloadSize() int64 { return s.PayloadSizeAt(len(s.tokens)) }

// payloadHeaderFields returns the 13 header fields for a session at pos.
func (s *Session) payloadHeaderFields(pos int) [payloadHeader]uint32 {
	l := s.layout
	return [payloadHeader]uint32{
		binary.LittleEndian.Uint32([]byte(payloadMagic)),
		PayloadVersion,
		uint32(s.opts.MaxContext),
		uint32(s.opts.ChunkSize),
		uint32(l.Capacity(0, PartWindow)),
		uint32(s.cfg.Window),
		uint32(l.MaxContext / 4),
		uint32(pos),
		uint32(s.cfg.Layers),
		uint32(s.cfg.HeadDim),
		uint32(s.cfg.IndexerHeadDim),
		uint32(s.cfg.Vocab),
		uint32(l.rawRows(pos)),
	}
}

// WritePayload writes the session's state as a DSV4 payload (see the
// layout above; PayloadSize bytes). The session must have logits and its
// rings must hold what continuing needs (true after any successful
// Prefill, Decode or Rewind).
func (s *Session) WritePayload(w io.Writer) error {
	if s.closed {
		return ErrClosed
	}
	pos := len(s.tokens)
	if pos == 0 || !s.logitsOK {
		return fmt.Errorf("engine: payload: %w", ErrNoLogits)
	}
	secs := s.layout.stateSections(pos)
	for _, sc := range secs {
		if sc.part.ByPosition() && sc.n > 0 && s.ret.first(sc.layer, sc.part, pos) > sc.first {
			return fmt.Errorf("engine: payload: layer %d %s no longer holds position %d", sc.layer, sc.part, sc.first)
		}
	}
	le := binary.LittleEndian
	bw := &errWriter{w: w}
	hdr := s.payloadHeaderFields(pos)
	buf := make([]byte, 0, 4*max(payloadHeader, pos, s.cfg.Vocab, 2*s.cfg.Layers))
	for _, v := range hdr {
		buf = le.AppendUint32(buf, v)
	}
	bw.write(buf)
	buf = buf[:0]
	for _, t := range s.tokens {
		buf = le.AppendUint32(buf, uint32(t))
	}
	bw.write(buf)
	bw.write(appendF32s(buf[:0], s.logits))
	buf = buf[:0]
	for _, p := range []StatePart{PartComp, PartIndex} {
		for layer := 0; layer < s.cfg.Layers; layer++ {
			buf = le.AppendUint32(buf, uint32(s.layout.rowsIfAny(layer, p, pos)))
		}
	}
	bw.write(buf)
	for _, sc := range secs {
		if bw.err != nil {
			break
		}
		if err := s.emitSection(sc, bw.write); err != nil {
			return fmt.Errorf("engine: payload: %w", err)
		}
	}
	if bw.err != nil {
		return fmt.Errorf("engine: payload: %w", bw.err)
	}
	return nil
}

// rowsIfAny is Rows for a layer that has the part, else 0.
func (l *StateLayout) rowsIfAny(layer int, p StatePart, pos int) int {
	if !l.Has(layer, p) {
		return 0
	}
	return l.Rows(layer, p, pos)
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) write(p []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(p)
	}
}

// PayloadInfo is what a DSV4 payload header says.
type PayloadInfo struct {
	Version, Context, ChunkSize, RawCapacity, Window, CompCapacity uint32
	Tokens, Layers, HeadDim, IndexerHeadDim, Vocab, RawRows        uint32
}

// ReadPayloadInfo decodes the 13-field header at the start of a payload.
func ReadPayloadInfo(p []byte) (PayloadInfo, error) {
	if len(p) < 4*payloadHeader {
		return PayloadInfo{}, fmt.Errorf("%w: payload of %d bytes is shorter than its header", ErrSnapshot, len(p))
	}
	if string(p[:4]) != payloadMagic {
		return PayloadInfo{}, fmt.Errorf("%w: payload magic %q, want %q", ErrSnapshot, p[:4], payloadMagic)
	}
	f := func(i int) uint32 { return binary.LittleEndian.Uint32(p[4*i:]) }
	return PayloadInfo{Version: f(1), Context: f(2), ChunkSize: f(3), RawCapacity: f(4), Window: f(5),
		CompCapacity: f(6), Tokens: f(7), Layers: f(8), HeadDim: f(9), IndexerHeadDim: f(10),
		Vocab: f(11), RawRows: f(12)}, nil
}

// ReadPayload replaces the session's tokens, KV state and logits with a
// DSV4 payload of exactly n bytes read from r. The payload must describe
// this model (layers, dimensions, vocabulary, window and compression
// ratios are checked) and fit the session's maximum context; the saving
// session's chunk size, slack and context may differ. Errors wrap
// ErrSnapshot; on error the session is left empty (Pos 0) if the state had
// already been touched, else unchanged.
func (s *Session) ReadPayload(r io.Reader, n int64) error {
	if s.closed {
		return ErrClosed
	}
	if n < 4*payloadHeader {
		return fmt.Errorf("%w: payload of %d bytes is shorter than its header", ErrSnapshot, n)
	}
	hb := make([]byte, 4*payloadHeader)
	if _, err := io.ReadFull(r, hb); err != nil {
		return fmt.Errorf("%w: payload header: %w", ErrSnapshot, err)
	}
	info, err := ReadPayloadInfo(hb)
	if err != nil {
		return err
	}
	c := s.cfg
	switch {
	case info.Version != PayloadVersion:
		return fmt.Errorf("%w: payload version %d, this build reads %d", ErrSnapshot, info.Version, PayloadVersion)
	case int(info.Layers) != c.Layers || int(info.HeadDim) != c.HeadDim || int(info.IndexerHeadDim) != c.IndexerHeadDim ||
		int(info.Vocab) != c.Vocab || int(info.Window) != c.Window:
		return fmt.Errorf("%w: payload for another model shape (layers %d, head dim %d, indexer dim %d, vocab %d, window %d; this model %d, %d, %d, %d, %d)",
			ErrSnapshot, info.Layers, info.HeadDim, info.IndexerHeadDim, info.Vocab, info.Window,
			c.Layers, c.HeadDim, c.IndexerHeadDim, c.Vocab, c.Window)
	case info.Tokens == 0:
		return fmt.Errorf("%w: payload has no tokens", ErrSnapshot)
	case uint64(info.Tokens) > uint64(s.opts.MaxContext):
		return fmt.Errorf("%w: %d tokens do not fit max context %d", ErrSnapshot, info.Tokens, s.opts.MaxContext)
	}
	pos := int(info.Tokens)
	if int(info.RawRows) != s.layout.rawRows(pos) {
		return fmt.Errorf("%w: %d raw rows, want %d", ErrSnapshot, info.RawRows, s.layout.rawRows(pos))
	}
	if want := s.PayloadSizeAt(pos); want != n {
		return fmt.Errorf("%w: payload is %d bytes, %d tokens of this model need %d", ErrSnapshot, n, pos, want)
	}
	body := make([]byte, n-4*payloadHeader)
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("%w: payload body: %w", ErrSnapshot, err)
	}
	le := binary.LittleEndian
	off := 0
	take := func(k int) []byte { p := body[off : off+k]; off += k; return p }
	tb := take(4 * pos)
	tokens := make([]int32, pos)
	for i := range tokens {
		t := le.Uint32(tb[4*i:])
		if t >= uint32(c.Vocab) {
			return fmt.Errorf("%w: token %d at %d is outside the vocabulary", ErrSnapshot, t, i)
		}
		tokens[i] = int32(t)
	}
	logitsRaw := take(4 * c.Vocab)
	counts := take(8 * c.Layers)
	for i, p := range []StatePart{PartComp, PartIndex} {
		for layer := 0; layer < c.Layers; layer++ {
			got := le.Uint32(counts[4*(i*c.Layers+layer):])
			want := s.layout.rowsIfAny(layer, p, pos)
			if int(got) != want {
				return fmt.Errorf("%w: layer %d has %d %s rows, this model has %d at %d tokens (another compression ratio?)",
					ErrSnapshot, layer, got, p, want, pos)
			}
		}
	}
	secs := s.layout.stateSections(pos)
	for i := range secs {
		secs[i].data = take(4 * secs[i].n * s.layout.Width(secs[i].layer, secs[i].part))
	}
	// From here on the state is written: a failure leaves the session empty.
	s.tokens, s.logitsOK = s.tokens[:0], false
	s.ret.reset()
	ret, err := s.writeSections(secs)
	if err != nil {
		return fmt.Errorf("engine: payload restore: %w", err)
	}
	for i := range s.logits {
		s.logits[i] = math.Float32frombits(le.Uint32(logitsRaw[4*i:]))
	}
	s.forgetStaged()
	s.tokens = append(s.tokens, tokens...)
	s.ret = ret
	s.logitsOK = true
	return nil
}

// PayloadSizeAt returns the payload size of this session's model and
// layout at pos tokens.
func (s *Session) PayloadSizeAt(pos int) int64 {
	n := int64(4*payloadHeader + 4*pos + 4*s.cfg.Vocab + 8*s.cfg.Layers)
	for _, sc := range s.layout.stateSections(pos) {
		n += int64(4 * sc.n * s.layout.Width(sc.layer, sc.part))
	}
	return n
}
