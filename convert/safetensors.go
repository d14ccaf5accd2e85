package convert

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
	"strings"
)

// DType is a safetensors element type, as spelled in the header ("BF16", ...).
type DType string

// The safetensors dtypes this package knows. F8_E8M0 is the power-of-two
// scale type (torch.float8_e8m0fnu) of the FP8 and FP4 block scales; F4 is a
// packed e2m1 type (two values per byte, the shape counting values).
const (
	F64     DType = "F64"
	F32     DType = "F32"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I64     DType = "I64"
	I32     DType = "I32"
	I16     DType = "I16"
	I8      DType = "I8"
	U64     DType = "U64"
	U32     DType = "U32"
	U16     DType = "U16"
	U8      DType = "U8"
	Bool    DType = "BOOL"
	F8E4M3  DType = "F8_E4M3"
	F8E5M2  DType = "F8_E5M2"
	F8E8M0  DType = "F8_E8M0"
	F4E2M1  DType = "F4"
	maxDims       = 8
)

// bitsPerElem is each known dtype's element width in bits.
var bitsPerElem = map[DType]int{
	F64: 64, I64: 64, U64: 64,
	F32: 32, I32: 32, U32: 32,
	F16: 16, BF16: 16, I16: 16, U16: 16,
	I8: 8, U8: 8, Bool: 8, F8E4M3: 8, F8E5M2: 8, F8E8M0: 8,
	F4E2M1: 4,
}

// Bits returns the element width in bits, or 0 for an unknown dtype.
func (d DType) Bits() int { return bitsPerElem[d] }

// Limits on a safetensors header. The official implementation caps the
// header at 100 MB; a Flash shard's header is a few hundred KB.
const (
	MaxHeaderLen = 100 << 20
	maxTensorEls = 1 << 50
)

// TensorInfo is one tensor entry of a safetensors header.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	// Begin and End are byte offsets relative to the start of the data
	// section (just after the header).
	Begin, End uint64
}

// Elements returns the number of elements (1 for a scalar).
func (t *TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes returns the size of the tensor's data.
func (t *TensorInfo) Bytes() uint64 { return t.End - t.Begin }

// HeaderError reports a malformed safetensors header.
type HeaderError struct {
	Path string // file, when known
	Msg  string
}

func (e *HeaderError) Error() string {
	if e.Path != "" {
		return "safetensors " + e.Path + ": " + e.Msg
	}
	return "safetensors: " + e.Msg
}

func herr(format string, args ...any) error { return &HeaderError{Msg: fmt.Sprintf(format, args...)} }

// Header is a parsed and validated safetensors header.
type Header struct {
	Tensors  []TensorInfo // sorted by Begin
	Metadata map[string]string
	byName   map[string]int
}

// Tensor looks a tensor up by name.
func (h *Header) Tensor(name string) (*TensorInfo, bool) {
	i, ok := h.byName[name]
	if !ok {
		return nil, false
	}
	return &h.Tensors[i], true
}

// ParseHeader parses the JSON header of a safetensors file (the bytes after
// the u64 length) and checks it against a data section of dataLen bytes:
// every entry must have a known dtype, a shape of at most 8 non-negative
// dimensions, and data_offsets [begin, end] inside the data section whose
// length is exactly the shape's byte size; entries must not overlap, and
// names must be unique and non-empty. __metadata__ must map strings to strings.
func ParseHeader(hdr []byte, dataLen uint64) (*Header, error) {
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, herr("header is not JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, herr("header is not a JSON object")
	}
	h := &Header{byName: map[string]int{}}
	seenMeta := false
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, herr("header JSON: %v", err)
		}
		name, ok := kt.(string)
		if !ok {
			return nil, herr("header JSON: expected a key")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, herr("header JSON: value of %q: %v", name, err)
		}
		if name == "__metadata__" {
			if seenMeta {
				return nil, herr("duplicate __metadata__")
			}
			seenMeta = true
			if err := json.Unmarshal(raw, &h.Metadata); err != nil {
				return nil, herr("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		if name == "" {
			return nil, herr("tensor with an empty name")
		}
		if _, dup := h.byName[name]; dup {
			return nil, herr("duplicate tensor %q", name)
		}
		t, err := parseEntry(name, raw, dataLen)
		if err != nil {
			return nil, err
		}
		h.byName[name] = len(h.Tensors)
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, herr("header JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, herr("trailing data after the header object")
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := &h.Tensors[i], &h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	for i := range h.Tensors {
		h.byName[h.Tensors[i].Name] = i
		if i > 0 && h.Tensors[i].Begin < h.Tensors[i-1].End {
			return nil, herr("tensors %q [%d, %d) and %q [%d, %d) overlap",
				h.Tensors[i-1].Name, h.Tensors[i-1].Begin, h.Tensors[i-1].End,
				h.Tensors[i].Name, h.Tensors[i].Begin, h.Tensors[i].End)
		}
	}
	return h, nil
}

type rawEntry struct {
	DType       *string           `json:"dtype"`
	Shape       []json.RawMessage `json:"shape"`
	DataOffsets []json.RawMessage `json:"data_offsets"`
}

func parseEntry(name string, raw json.RawMessage, dataLen uint64) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	var e rawEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return t, herr("tensor %q: bad entry: %v", name, err)
	}
	if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
		return t, herr("tensor %q: entry needs dtype, shape and data_offsets", name)
	}
	t.DType = DType(*e.DType)
	nbits := t.DType.Bits()
	if nbits == 0 {
		return t, herr("tensor %q: unknown dtype %q", name, *e.DType)
	}
	if len(e.Shape) > maxDims {
		return t, herr("tensor %q: %d dimensions (at most %d)", name, len(e.Shape), maxDims)
	}
	n := uint64(1)
	t.Shape = make([]int64, len(e.Shape))
	for i, s := range e.Shape {
		d, err := strictUint(s)
		if err != nil {
			return t, herr("tensor %q: shape[%d] %s: %v", name, i, s, err)
		}
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > maxTensorEls {
			return t, herr("tensor %q: shape has too many elements", name)
		}
		n = lo
		t.Shape[i] = int64(d)
	}
	if len(e.DataOffsets) != 2 {
		return t, herr("tensor %q: data_offsets has %d entries, want 2", name, len(e.DataOffsets))
	}
	var err error
	if t.Begin, err = strictUint(e.DataOffsets[0]); err != nil {
		return t, herr("tensor %q: data_offsets[0] %s: %v", name, e.DataOffsets[0], err)
	}
	if t.End, err = strictUint(e.DataOffsets[1]); err != nil {
		return t, herr("tensor %q: data_offsets[1] %s: %v", name, e.DataOffsets[1], err)
	}
	if t.Begin > t.End {
		return t, herr("tensor %q: data_offsets [%d, %d] are reversed", name, t.Begin, t.End)
	}
	if t.End > dataLen {
		return t, herr("tensor %q: data_offsets end %d is past the data section (%d bytes)", name, t.End, dataLen)
	}
	want := n * uint64(nbits)
	if want%8 != 0 {
		return t, herr("tensor %q: %d elements of %s are not a whole number of bytes", name, n, t.DType)
	}
	if want /= 8; t.End-t.Begin != want {
		return t, herr("tensor %q: %s %v needs %d bytes, data_offsets span %d", name, t.DType, t.Shape, want, t.End-t.Begin)
	}
	return t, nil
}

// strictUint parses a JSON value that must be a non-negative integer
// below 2^53 written as plain digits (no fraction, exponent, sign or quotes).
func strictUint(n json.RawMessage) (uint64, error) {
	s := string(bytes.TrimSpace(n))
	if s == "" || len(s) > 16 {
		return 0, errors.New("not a non-negative integer < 2^53")
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errors.New("not a non-negative integer")
		}
		v = v*10 + uint64(c-'0')
	}
	if v >= 1<<53 {
		return 0, errors.New("too large")
	}
	return v, nil
}

// SafeFile is an open safetensors file. Its methods are safe for
// concurrent use (reads use ReadAt).
type SafeFile struct {
	Path     string
	Header   *Header
	f        *os.File
	dataBase int64 // file offset of the data section
	size     int64
}

// OpenSafetensors opens and validates a safetensors file.
func OpenSafetensors(path string) (*SafeFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sf, err := newSafeFile(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

func newSafeFile(path string, f *os.File) (*SafeFile, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	h, base, err := readHeader(f, st.Size())
	if err != nil {
		var he *HeaderError
		if errors.As(err, &he) && he.Path == "" {
			he.Path = path
		}
		return nil, err
	}
	return &SafeFile{Path: path, Header: h, f: f, dataBase: base, size: st.Size()}, nil
}

// readHeader reads and validates the header of a safetensors file of the
// given size, returning it and the file offset of the data section.
func readHeader(r io.ReaderAt, size int64) (*Header, int64, error) {
	var lb [8]byte
	if size < 8 {
		return nil, 0, herr("file is %d bytes, too short for the header length", size)
	}
	if _, err := r.ReadAt(lb[:], 0); err != nil {
		return nil, 0, fmt.Errorf("safetensors: reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n < 2 || n > MaxHeaderLen {
		return nil, 0, herr("header length %d outside 2..%d", n, MaxHeaderLen)
	}
	if n > uint64(size-8) {
		return nil, 0, herr("header length %d exceeds the file (%d bytes after the length)", n, size-8)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, 0, fmt.Errorf("safetensors: reading header: %w", err)
	}
	h, err := ParseHeader(hdr, uint64(size-8)-n)
	if err != nil {
		return nil, 0, err
	}
	return h, int64(8 + n), nil
}

// Close closes the file.
func (s *SafeFile) Close() error { return s.f.Close() }

// ReadRange reads bytes [off, off+len(dst)) of a tensor's data.
func (s *SafeFile) ReadRange(t *TensorInfo, off uint64, dst []byte) error {
	if off > t.Bytes() || uint64(len(dst)) > t.Bytes()-off {
		return fmt.Errorf("safetensors %s: read of %d bytes at %d is outside tensor %q (%d bytes)", s.Path, len(dst), off, t.Name, t.Bytes())
	}
	if len(dst) == 0 {
		return nil
	}
	_, err := s.f.ReadAt(dst, s.dataBase+int64(t.Begin+off))
	if err != nil {
		return fmt.Errorf("safetensors %s: reading %q: %w", s.Path, t.Name, err)
	}
	return nil
}

// ReadAll reads a tensor's whole data.
func (s *SafeFile) ReadAll(t *TensorInfo) ([]byte, error) {
	b := make([]byte, t.Bytes())
	return b, s.ReadRange(t, 0, b)
}

// shapeString formats a shape as [a, b, c].
func shapeString(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Element decoders of the floating-point formats.

// E4M3ToF32 decodes an OCP FP8 e4m3fn value (torch.float8_e4m3fn): bias 7,
// no infinities, 0x7f/0xff are NaN, subnormals m·2^-9.
func E4M3ToF32(x uint8) float32 {
	e := int(x>>3) & 0xf
	m := int(x & 7)
	var v float32
	switch {
	case e == 0xf && m == 7:
		return float32(math.NaN())
	case e == 0:
		v = float32(m) * (1.0 / 512)
	default:
		v = float32(math.Ldexp(1+float64(m)/8, e-7))
	}
	if x&0x80 != 0 {
		v = -v
	}
	return v
}

// E8M0ToF32 decodes an unsigned power-of-two scale (torch.float8_e8m0fnu):
// 2^(e-127); 0xff is NaN. e = 0 is 2^-127, a float32 subnormal.
func E8M0ToF32(e uint8) float32 {
	if e == 0xff {
		return float32(math.NaN())
	}
	if e == 0 {
		return math.Float32frombits(0x00400000)
	}
	return math.Float32frombits(uint32(e) << 23)
}

// fp4Table is e2m1: sign bit 3, then the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
var fp4Table = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}

// E2M1ToF32 decodes the low four bits of x as an FP4 e2m1 value.
func E2M1ToF32(x uint8) float32 { return fp4Table[x&0xf] }
