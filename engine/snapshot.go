package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Snapshot format (all integers little-endian):
//
//	magic        8 bytes "DS4GOSS\n"
//	version      u32 (SnapshotVersion)
//	fingerprint  32 bytes: sha256 of the model config (JSON) and the
//	             backend's weights fingerprint, if it has one
//	pos          u64: tokens processed
//	tokens       pos × i32
//	has_logits   u8, then Vocab × f32 when 1
//	sections     u32 count, then per section:
//	               layer u32, part u8, first u64, n u64, width u32,
//	               n×width f32 values
//	crc32c       u32 of every byte before it (Castagnoli)
//
// Sections hold, for every layer and part, the entries the state retains:
// by-row parts rows [0, Rows(pos)), by-position parts positions
// [first retained, pos). Values are stored as the backend's f32 state, so a
// restore reproduces the logits bit for bit; the format does not depend on
// the backend (a snapshot taken on one backend restores on another with the
// same model, if their fingerprints agree).
const (
	snapshotMagic = "DS4GOSS\n"
	// SnapshotVersion is the current snapshot format version.
	SnapshotVersion = 1
)

// ErrSnapshot reports a snapshot that cannot be restored (wrapped, with
// the reason).
var ErrSnapshot = errors.New("engine: bad snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Fingerprint identifies the session's model: the config and, when the
// backend implements Fingerprinter, its weights.
func (s *Session) Fingerprint() [32]byte {
	h := sha256.New()
	cj, _ := json.Marshal(s.cfg)
	h.Write(cj)
	if fp, ok := s.be.(Fingerprinter); ok {
		h.Write(fp.WeightsFingerprint())
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Snapshot serialises the session (tokens, KV state, logits) to bytes.
func (s *Session) Snapshot() ([]byte, error) {
	if s.closed {
		return nil, ErrClosed
	}
	pos := len(s.tokens)
	var buf bytes.Buffer
	le := binary.LittleEndian
	buf.WriteString(snapshotMagic)
	buf.Write(le.AppendUint32(nil, SnapshotVersion))
	fp := s.Fingerprint()
	buf.Write(fp[:])
	buf.Write(le.AppendUint64(nil, uint64(pos)))
	tb := make([]byte, 0, 4*pos)
	for _, t := range s.tokens {
		tb = le.AppendUint32(tb, uint32(t))
	}
	buf.Write(tb)
	if s.logitsOK {
		buf.WriteByte(1)
		buf.Write(appendF32s(nil, s.logits))
	} else {
		buf.WriteByte(0)
	}
	var secs []stateSection
	for l := 0; l < s.cfg.Layers; l++ {
		for _, p := range s.layout.Parts(l) {
			first, end := 0, s.layout.Rows(l, p, pos)
			if p.ByPosition() {
				first, end = s.ret.first(l, p, pos), pos
			}
			secs = append(secs, stateSection{layer: l, part: p, first: first, n: end - first})
		}
	}
	buf.Write(le.AppendUint32(nil, uint32(len(secs))))
	for _, sc := range secs {
		w := s.layout.Width(sc.layer, sc.part)
		hdr := le.AppendUint32(nil, uint32(sc.layer))
		hdr = append(hdr, byte(sc.part))
		hdr = le.AppendUint64(hdr, uint64(sc.first))
		hdr = le.AppendUint64(hdr, uint64(sc.n))
		hdr = le.AppendUint32(hdr, uint32(w))
		buf.Write(hdr)
		if err := s.emitSection(sc, func(b []byte) { buf.Write(b) }); err != nil {
			return nil, fmt.Errorf("engine: snapshot: %w", err)
		}
	}
	buf.Write(le.AppendUint32(nil, crc32.Checksum(buf.Bytes(), castagnoli)))
	return buf.Bytes(), nil
}

// stateSection is one tensor of a saved state: entries [first, first+n) of
// a layer's part, with their values (little-endian f32) when restoring.
// Snapshots and DSV4 payloads are both sequences of them.
type stateSection struct {
	layer    int
	part     StatePart
	first, n int
	data     []byte
}

// emitSection reads a section's values from the backend, in pieces of at
// most about 4 MiB, and passes their little-endian bytes to out.
func (s *Session) emitSection(sc stateSection, out func([]byte)) error {
	w := s.layout.Width(sc.layer, sc.part)
	step := max(1, min(sc.n, (1<<20)/max(1, w)))
	var vals []float32
	var raw []byte
	for off := 0; off < sc.n; off += step {
		k := min(step, sc.n-off)
		if cap(vals) < k*w {
			vals = make([]float32, k*w)
		}
		vals = vals[:k*w]
		if err := s.be.ReadState(s.st, sc.layer, sc.part, sc.first+off, k, vals); err != nil {
			return fmt.Errorf("layer %d %s: %w", sc.layer, sc.part, err)
		}
		raw = appendF32s(raw[:0], vals)
		out(raw)
	}
	return nil
}

// writeSections writes saved sections (with their data) into the
// session's state and returns the retention they leave. A ring section
// longer than this session's ring (a session with less rewind slack) keeps
// its newest entries. On error the session is left empty.
func (s *Session) writeSections(secs []stateSection) (*retention, error) {
	ret := newRetention(s.layout)
	var vals []float32
	for _, sc := range secs {
		w := s.layout.Width(sc.layer, sc.part)
		first, n, d := sc.first, sc.n, sc.data
		if sc.part.ByPosition() {
			if c := s.layout.Capacity(sc.layer, sc.part); n > c {
				d = d[(n-c)*w*4:]
				first, n = first+n-c, c
			}
			ret.lo[sc.layer][sc.part] = first
		}
		if n == 0 {
			continue
		}
		if cap(vals) < n*w {
			vals = make([]float32, n*w)
		}
		vals = vals[:n*w]
		for i := range vals {
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		}
		if err := s.be.WriteState(s.st, sc.layer, sc.part, first, n, vals); err != nil {
			s.tokens, s.logitsOK = s.tokens[:0], false
			s.ret.reset()
			return nil, fmt.Errorf("layer %d %s: %w", sc.layer, sc.part, err)
		}
	}
	return ret, nil
}

func appendF32s(dst []byte, xs []float32) []byte {
	for _, x := range xs {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

// snapReader decodes a snapshot, remembering the first error.
type snapReader struct {
	b   []byte
	off int
	err error
}

func (r *snapReader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = fmt.Errorf("%w: truncated at %s", ErrSnapshot, what)
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *snapReader) u32(what string) uint32 {
	if p := r.take(4, what); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *snapReader) u64(what string) uint64 {
	if p := r.take(8, what); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// Restore replaces the session's tokens, KV state and logits with a
// snapshot's. The snapshot must come from the same model (fingerprint);
// its tokens must fit the session's maximum context. The session's chunk
// size and rewind slack may differ from the saving session's. On error the
// session is unchanged unless the error came from the backend while writing
// the state, in which case it is left empty.
func (s *Session) Restore(data []byte) error {
	if s.closed {
		return ErrClosed
	}
	if len(data) < len(snapshotMagic)+4+4 {
		return fmt.Errorf("%w: %d bytes is too short", ErrSnapshot, len(data))
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if string(body[:len(snapshotMagic)]) != snapshotMagic {
		return fmt.Errorf("%w: not a ds4go session snapshot", ErrSnapshot)
	}
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", ErrSnapshot, sum, got)
	}
	r := &snapReader{b: body, off: len(snapshotMagic)}
	if v := r.u32("version"); v != SnapshotVersion {
		return fmt.Errorf("%w: version %d, this build reads version %d", ErrSnapshot, v, SnapshotVersion)
	}
	fp := s.Fingerprint()
	if got := r.take(32, "fingerprint"); r.err == nil && !bytes.Equal(got, fp[:]) {
		return fmt.Errorf("%w: taken with a different model (fingerprint %x, this model %x)", ErrSnapshot, got[:8], fp[:8])
	}
	pos64 := r.u64("pos")
	if r.err != nil {
		return r.err
	}
	if pos64 > uint64(s.opts.MaxContext) {
		return fmt.Errorf("%w: %d tokens do not fit max context %d", ErrSnapshot, pos64, s.opts.MaxContext)
	}
	pos := int(pos64)
	tb := r.take(4*pos, "tokens")
	tokens := make([]int32, pos)
	for i := range tokens {
		if r.err != nil {
			break
		}
		tokens[i] = int32(binary.LittleEndian.Uint32(tb[4*i:]))
		if tokens[i] < 0 || int(tokens[i]) >= s.cfg.Vocab {
			return fmt.Errorf("%w: token %d at %d is outside the vocabulary", ErrSnapshot, tokens[i], i)
		}
	}
	hasLogits := r.take(1, "logits flag")
	var logits []float32
	if r.err == nil && hasLogits[0] == 1 {
		lb := r.take(4*s.cfg.Vocab, "logits")
		if r.err == nil {
			logits = make([]float32, s.cfg.Vocab)
			for i := range logits {
				logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(lb[4*i:]))
			}
		}
	}
	nsec := r.u32("section count")
	if r.err != nil {
		return r.err
	}
	var secs []stateSection
	for i := uint32(0); i < nsec && r.err == nil; i++ {
		layer, part := int(r.u32("section layer")), r.take(1, "section part")
		first, n, w := r.u64("section first"), r.u64("section length"), r.u32("section width")
		if r.err != nil {
			break
		}
		p := StatePart(part[0])
		if layer >= s.cfg.Layers || p >= numParts || !s.layout.Has(layer, p) {
			return fmt.Errorf("%w: section %d: layer %d has no part %s", ErrSnapshot, i, layer, p)
		}
		if int(w) != s.layout.Width(layer, p) || first > pos64 || n > pos64 {
			return fmt.Errorf("%w: section %d (layer %d %s): bad shape (first %d, n %d, width %d)", ErrSnapshot, i, layer, p, first, n, w)
		}
		d := r.take(int(n)*int(w)*4, "section data")
		secs = append(secs, stateSection{layer, p, int(first), int(n), d})
	}
	if r.err != nil {
		return r.err
	}
	if r.off != len(body) {
		return fmt.Errorf("%w: %d trailing bytes", ErrSnapshot, len(body)-r.off)
	}
	// Check the sections' coverage.
	have := map[[2]int]stateSection{}
	for _, sc := range secs {
		have[[2]int{sc.layer, int(sc.part)}] = sc
	}
	for l := 0; l < s.cfg.Layers; l++ {
		for _, p := range s.layout.Parts(l) {
			sc, ok := have[[2]int{l, int(p)}]
			if !ok {
				return fmt.Errorf("%w: layer %d %s is missing", ErrSnapshot, l, p)
			}
			if !p.ByPosition() {
				if sc.first != 0 || sc.n != s.layout.Rows(l, p, pos) {
					return fmt.Errorf("%w: layer %d %s: rows [%d, %d), want [0, %d)", ErrSnapshot, l, p, sc.first, sc.first+sc.n, s.layout.Rows(l, p, pos))
				}
				continue
			}
			// Rings hold positions up to pos; if they do not reach back to
			// what pos needs (a snapshot taken after a cancelled chunk), the
			// next forward call re-derives the state.
			if sc.first+sc.n != pos {
				return fmt.Errorf("%w: layer %d %s: positions [%d, %d) do not end at %d", ErrSnapshot, l, p, sc.first, sc.first+sc.n, pos)
			}
		}
	}
	ret, err := s.writeSections(secs)
	if err != nil {
		return fmt.Errorf("engine: restore: %w", err)
	}
	s.forgetStaged()
	s.tokens = append(s.tokens[:0], tokens...)
	s.ret = ret
	s.logitsOK = logits != nil
	if logits != nil {
		copy(s.logits, logits)
	}
	return nil
}
