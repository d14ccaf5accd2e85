// Package kvdisk is ds4-server's disk KV cache: checkpoint files of a
// session's state keyed by the rendered text they cover, so a prompt prefix
// survives session switches and server restarts.
//
// # File format
//
// The layout is antirez/ds4's (ds4 README, "Disk KV Cache", the seed spec
// of issue 7), so `hexdump -C FILE | head` shows the header and then the
// cached prompt verbatim. All integers are little-endian.
//
//	offset size  field
//	     0    3  magic "KVC"
//	     3    1  version = 1
//	     4    1  routed-expert quant bits (2, 4; 8 for the Q8 demo model, 0 unknown)
//	     5    1  save reason: 0 unknown, 1 cold, 2 continued, 3 evict, 4 shutdown
//	     6    1  extension flags: bit 0 = KTM tool-id map appended,
//	             bit 1 = CRC32C present at bytes 20..23 (ds4go always sets it)
//	     7    1  reserved (0)
//	     8    4  cached token count
//	    12    4  hit count                       (mutable)
//	    16    4  context size the snapshot was written for
//	    20    4  CRC32C (Castagnoli) of the whole file, computed with bytes
//	             12..15, 20..23 and 32..39 taken as zero (ds4: reserved)
//	    24    8  creation Unix time (seconds)
//	    32    8  last-used Unix time (seconds)   (mutable)
//	    40    8  DSV4 session payload byte count P
//	    48    4  rendered text byte count T
//	    52    T  rendered text: the decoded bytes of the cached tokens
//	  52+T    P  DSV4 session payload (layout: engine.Session.WritePayload)
//	52+T+P       optional KTM section when flag bit 0 is set:
//	               "KTM", u8 version 1, u32 entry count, then per entry
//	               u32 id length, u32 DSML length, id bytes, DSML bytes
//
// The file name is the lowercase hex SHA1 of the rendered text plus ".kv";
// a file is reusable for a prompt whose rendered text starts with those
// bytes. The hit count and last-used time are rewritten in place (two
// WriteAt calls) on every hit, which is why the checksum leaves them out.
//
// # Crash safety
//
// Files are written to a temporary file in the same directory
// (".tmp-PID-RANDOM"), synced, renamed to their final name and the
// directory synced, so a file under a final name is complete or absent.
// Temporary files left by a crash are removed when a store opens. A file
// that is truncated or bit-flipped is skipped with one log line and
// removed. A file of another format version, or (checked by the engine when
// restoring) of another model shape, is skipped with one log line and left
// on disk, where it may serve the build or model that wrote it (a file of
// another shape stays in the index, marked unusable, so the space budget
// still counts it and may evict it). Parsing never panics (fuzzed:
// FuzzParse).
//
// # Facts taken from ds4 (antirez/ds4 ds4_kvstore.c, ds4_server.c; read, not copied)
//
// The header layout and save-reason codes, the SHA1-of-rendered-text key,
// the KTM section, the knob defaults (min 512 tokens, cold max 30000,
// continued interval 10000 rounded up to the alignment, trim 32, align
// 2048, budget 4096 MiB when enabled), the cold store length (trim the
// tail, align down, keep it if still ≥ min; else the whole prompt), the
// chat anchor (the last user marker before the first assistant marker),
// continued saves at absolute multiples of the step, the evict save before
// the live session is replaced, the shutdown save, lookup by the longest
// cached text that is a byte prefix of the prompt (skipping entries shorter
// than min tokens, written for a larger context, or of another quant when
// strict), and hit-count/last-used updates on a hit. Differences: the
// CRC32C (ds4 has no checksum), eviction by least recent use (ds4 scores
// entries by decayed hits × tokens per byte), and a corrupt file is
// removed.
package kvdisk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Format constants.
const (
	// Version is the KVC file version.
	Version = 1
	// HeaderSize is the fixed header's size.
	HeaderSize = 48
	// FlagToolMap marks an appended KTM section.
	FlagToolMap = 1 << 0
	// FlagCRC marks the CRC32C at header bytes 20..23.
	FlagCRC = 1 << 1

	magic    = "KVC"
	ktmMagic = "KTM"
	// maxText bounds the rendered text (u32 in the format).
	maxText = 1<<32 - 1
)

// Reason is why a checkpoint was written.
type Reason uint8

// Save reasons (header byte 5).
const (
	ReasonUnknown Reason = iota
	ReasonCold
	ReasonContinued
	ReasonEvict
	ReasonShutdown
)

func (r Reason) String() string {
	switch r {
	case ReasonCold:
		return "cold"
	case ReasonContinued:
		return "continued"
	case ReasonEvict:
		return "evict"
	case ReasonShutdown:
		return "shutdown"
	}
	return "unknown"
}

// ErrCorrupt reports a file that is not a valid cache file (wrapped, with
// the reason).
var ErrCorrupt = errors.New("kvdisk: invalid cache file")

// ErrVersion reports a cache file of another format version (wrapped in
// ErrCorrupt too). Such a file may belong to another build of the server:
// it is ignored, never loaded, and left on disk.
var ErrVersion = errors.New("kvdisk: other format version")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is the fixed 48-byte header.
type Header struct {
	Quant        uint8
	Reason       Reason
	Flags        uint8
	Tokens       uint32
	Hits         uint32
	Context      uint32
	CRC          uint32
	Created      uint64
	LastUsed     uint64
	PayloadBytes uint64
}

// put encodes the header into h (HeaderSize bytes).
func (h *Header) put(b []byte) {
	clear(b[:HeaderSize])
	copy(b, magic)
	b[3] = Version
	b[4], b[5], b[6] = h.Quant, byte(h.Reason), h.Flags
	le := binary.LittleEndian
	le.PutUint32(b[8:], h.Tokens)
	le.PutUint32(b[12:], h.Hits)
	le.PutUint32(b[16:], h.Context)
	le.PutUint32(b[20:], h.CRC)
	le.PutUint64(b[24:], h.Created)
	le.PutUint64(b[32:], h.LastUsed)
	le.PutUint64(b[40:], h.PayloadBytes)
}

// parseHeader decodes and checks the fixed header (not the checksum).
func parseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes is shorter than the header", ErrCorrupt, len(b))
	}
	if string(b[:3]) != magic {
		return Header{}, fmt.Errorf("%w: magic %q", ErrCorrupt, b[:3])
	}
	if b[3] != Version {
		return Header{}, fmt.Errorf("%w: %w %d, this build reads %d", ErrCorrupt, ErrVersion, b[3], Version)
	}
	le := binary.LittleEndian
	h := Header{Quant: b[4], Reason: Reason(b[5]), Flags: b[6],
		Tokens: le.Uint32(b[8:]), Hits: le.Uint32(b[12:]), Context: le.Uint32(b[16:]), CRC: le.Uint32(b[20:]),
		Created: le.Uint64(b[24:]), LastUsed: le.Uint64(b[32:]), PayloadBytes: le.Uint64(b[40:])}
	if h.Flags&FlagCRC == 0 {
		return h, fmt.Errorf("%w: no checksum (extension bit 1 clear)", ErrCorrupt)
	}
	if h.Flags&^(FlagToolMap|FlagCRC) != 0 || b[7] != 0 {
		return h, fmt.Errorf("%w: unknown extension flags %#x", ErrCorrupt, h.Flags)
	}
	return h, nil
}

// crcHeader folds the header into a CRC32C with the mutable fields and the
// CRC itself taken as zero.
func crcHeader(b []byte) uint32 {
	var z [HeaderSize]byte
	copy(z[:], b[:HeaderSize])
	clear(z[12:16])
	clear(z[20:24])
	clear(z[32:40])
	return crc32.Update(0, castagnoli, z[:])
}

// ToolMapping is one KTM entry: a tool-call id and the exact DSML block the
// model sampled for it.
type ToolMapping struct {
	ID, DSML string
}

// appendKTM encodes a KTM section.
func appendKTM(dst []byte, m []ToolMapping) []byte {
	le := binary.LittleEndian
	dst = append(dst, ktmMagic...)
	dst = append(dst, 1)
	dst = le.AppendUint32(dst, uint32(len(m)))
	for _, e := range m {
		dst = le.AppendUint32(dst, uint32(len(e.ID)))
		dst = le.AppendUint32(dst, uint32(len(e.DSML)))
		dst = append(dst, e.ID...)
		dst = append(dst, e.DSML...)
	}
	return dst
}

// parseKTM decodes a KTM section that must fill b exactly.
func parseKTM(b []byte) ([]ToolMapping, error) {
	if len(b) < 8 || string(b[:3]) != ktmMagic || b[3] != 1 {
		return nil, fmt.Errorf("%w: bad tool-id map header", ErrCorrupt)
	}
	le := binary.LittleEndian
	n := le.Uint32(b[4:])
	b = b[8:]
	if uint64(n) > uint64(len(b))/8 {
		return nil, fmt.Errorf("%w: tool-id map claims %d entries in %d bytes", ErrCorrupt, n, len(b))
	}
	out := make([]ToolMapping, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(b) < 8 {
			return nil, fmt.Errorf("%w: tool-id map truncated at entry %d", ErrCorrupt, i)
		}
		il, dl := uint64(le.Uint32(b)), uint64(le.Uint32(b[4:]))
		b = b[8:]
		if il+dl > uint64(len(b)) {
			return nil, fmt.Errorf("%w: tool-id map entry %d overruns the file", ErrCorrupt, i)
		}
		out = append(out, ToolMapping{ID: string(b[:il]), DSML: string(b[il : il+dl])})
		b = b[il+dl:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the tool-id map", ErrCorrupt, len(b))
	}
	return out, nil
}

// File is a parsed cache file.
type File struct {
	Header Header
	// Text is the rendered text the checkpoint covers.
	Text string
	// Payload is the DSV4 session payload (engine.Session.ReadPayload).
	Payload []byte
	// Tools is the KTM map, if the file has one.
	Tools []ToolMapping
}

// Parse decodes and verifies a whole cache file: magic, version, flags,
// checksum, section lengths. It never panics on any input.
func Parse(b []byte) (*File, error) {
	h, err := parseHeader(b)
	if err != nil {
		return nil, err
	}
	sum := crc32.Update(crcHeader(b), castagnoli, b[HeaderSize:])
	if sum != h.CRC {
		return nil, fmt.Errorf("%w: checksum mismatch (stored %08x, computed %08x)", ErrCorrupt, h.CRC, sum)
	}
	rest := b[HeaderSize:]
	if len(rest) < 4 {
		return nil, fmt.Errorf("%w: truncated before the text length", ErrCorrupt)
	}
	tl := uint64(binary.LittleEndian.Uint32(rest))
	rest = rest[4:]
	if tl > uint64(len(rest)) {
		return nil, fmt.Errorf("%w: text of %d bytes overruns the file", ErrCorrupt, tl)
	}
	f := &File{Header: h, Text: string(rest[:tl])}
	rest = rest[tl:]
	if h.PayloadBytes > uint64(len(rest)) {
		return nil, fmt.Errorf("%w: payload of %d bytes overruns the file", ErrCorrupt, h.PayloadBytes)
	}
	f.Payload = rest[:h.PayloadBytes]
	rest = rest[h.PayloadBytes:]
	if h.Flags&FlagToolMap != 0 {
		if f.Tools, err = parseKTM(rest); err != nil {
			return nil, err
		}
	} else if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(rest))
	}
	if h.Tokens == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrCorrupt)
	}
	return f, nil
}
