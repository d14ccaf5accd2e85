// Package gguf reads and writes GGUF model files (versions 2 and 3,
// little-endian), the container the DeepSeek V4 weights are published in.
//
// A GGUF file is, in order:
//
//	magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//	kv_count × (string key | u32 value_type | value)
//	tensor_count × (string name | u32 n_dims | n_dims × u64 ne | u32 ggml_type | u64 offset)
//	padding to the alignment | tensor data
//
// Strings are a u64 byte length followed by the bytes (no terminator).
// Arrays are a u32 element type, a u64 count and the elements. Tensor
// offsets are relative to the start of the data section, which begins at the
// first multiple of the alignment (the u32 key general.alignment, default
// 32) after the tensor directory; every offset must itself be aligned.
// ne[0] is the row length (the fastest-varying dimension).
//
// The reader never trusts a count or a length: every one is checked against
// the bytes that remain before anything is allocated, so a hostile file
// costs at most memory proportional to its size, and every failure is a
// *FormatError naming the field and its byte offset.
package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"syscall"

	"ds4go/quant"
)

// Magic is the four bytes every GGUF file starts with.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// MaxDims is the most dimensions a tensor may have (ggml's GGML_MAX_DIMS).
const MaxDims = 4

// Limits that keep a hostile header from making the reader do absurd work.
const (
	maxKeyLen     = 1 << 16 // bytes in a metadata key
	maxNameLen    = 1 << 12 // bytes in a tensor name
	maxNestDepth  = 4       // arrays of arrays
	maxDimProduct = 1 << 50 // elements in one tensor

	// maxPrealloc caps the capacity reserved up front from a count in the
	// file. A count is only checked against the bytes that remain, which for
	// a mapped model file include gigabytes of tensor data; reserving that
	// much from a corrupt count could exhaust memory before the count is
	// found false. Beyond the cap, slices grow as entries actually parse.
	maxPrealloc = 1 << 12
)

// FormatError reports a malformed GGUF file: which field was wrong, at
// which byte offset, and why.
type FormatError struct {
	Offset int64  // byte offset of the field in the file
	Field  string // e.g. `kv[3] "general.alignment" value` or `tensor[17] "blk.0.attn_q_a.weight" offset`
	Err    error
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("gguf: %s (at byte %d): %v", e.Field, e.Offset, e.Err)
}

func (e *FormatError) Unwrap() error { return e.Err }

// ErrTruncated is wrapped by FormatErrors for fields that run past the end of the file.
var ErrTruncated = errors.New("file is truncated")

// TensorInfo describes one tensor of the directory.
type TensorInfo struct {
	Name   string
	Dims   []uint64   // Dims[0] is the row length (ggml ne[0])
	Type   quant.Type // element/block type
	Offset uint64     // relative to the start of the data section
	Size   uint64     // bytes of data
	Index  int        // position in the directory
}

// Elements returns the number of values the tensor holds.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// ShapeString formats the dimensions as "4096×129280".
func (t *TensorInfo) ShapeString() string {
	parts := make([]string, len(t.Dims))
	for i, d := range t.Dims {
		parts[i] = fmt.Sprint(d)
	}
	return strings.Join(parts, "×")
}

// File is a parsed GGUF file. Tensor data is a view into the underlying
// bytes (an mmap for files from Open), valid until Close.
type File struct {
	Version    uint32
	KVs        []KV
	Tensors    []TensorInfo
	Alignment  uint64
	DataOffset uint64 // absolute offset of the data section

	data    []byte // the whole file
	kvIndex map[string]int
	tIndex  map[string]int
	unmap   func() error
}

// Open maps the file at path read-only and parses its header and tensor
// directory. Tensor bytes are not touched until they are used.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: open: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: stat %s: %w", path, err)
	}
	size := st.Size()
	if size < 24 {
		return nil, fmt.Errorf("gguf: %s: %w", path, &FormatError{Offset: 0, Field: "header", Err: fmt.Errorf("file is %d bytes, a GGUF header needs 24: %w", size, ErrTruncated)})
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("gguf: %s: file of %d bytes cannot be mapped on this platform", path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gguf: mmap %s: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		_ = syscall.Munmap(data)
		return nil, fmt.Errorf("gguf: %s: %w", path, err)
	}
	f.unmap = func() error { return syscall.Munmap(data) }
	return f, nil
}

// Close releases the mapping of a file from Open. Tensor views must not be
// used afterwards. Close on a File from Parse does nothing.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap = nil
	f.data = nil
	if err != nil {
		return fmt.Errorf("gguf: munmap: %w", err)
	}
	return nil
}

// Bytes returns the whole file's bytes.
func (f *File) Bytes() []byte { return f.data }

// Size returns the file size in bytes.
func (f *File) Size() int64 { return int64(len(f.data)) }

// KV returns the metadata value under key.
func (f *File) KV(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

// Tensor returns the directory entry of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the tensor's bytes, a zero-copy view into the file.
func (f *File) TensorData(t *TensorInfo) []byte {
	start := f.DataOffset + t.Offset
	return f.data[start : start+t.Size : start+t.Size]
}

// cursor reads little-endian fields with bounds checks.
type cursor struct {
	b   []byte
	pos int64
}

func (c *cursor) remaining() int64 { return int64(len(c.b)) - c.pos }

func (c *cursor) need(n int64, field string) error {
	if n < 0 || c.remaining() < n {
		return &FormatError{Offset: c.pos, Field: field, Err: fmt.Errorf("needs %d bytes, %d remain: %w", n, c.remaining(), ErrTruncated)}
	}
	return nil
}

func (c *cursor) u32(field string) (uint32, error) {
	if err := c.need(4, field); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(c.b[c.pos:])
	c.pos += 4
	return v, nil
}

func (c *cursor) u64(field string) (uint64, error) {
	if err := c.need(8, field); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(c.b[c.pos:])
	c.pos += 8
	return v, nil
}

func (c *cursor) str(field string, maxLen uint64) (string, error) {
	start := c.pos
	n, err := c.u64(field + " length")
	if err != nil {
		return "", err
	}
	if n > maxLen {
		return "", &FormatError{Offset: start, Field: field + " length", Err: fmt.Errorf("%d bytes exceeds the limit of %d", n, maxLen)}
	}
	if uint64(c.remaining()) < n {
		return "", &FormatError{Offset: start, Field: field + " length", Err: fmt.Errorf("%d bytes but only %d remain: %w", n, c.remaining(), ErrTruncated)}
	}
	s := string(c.b[c.pos : c.pos+int64(n)])
	c.pos += int64(n)
	return s, nil
}

// Parse parses a GGUF file held in memory. The File keeps references into data.
func Parse(data []byte) (*File, error) {
	c := &cursor{b: data}
	if err := c.need(4, "magic"); err != nil {
		return nil, err
	}
	if string(data[:4]) != Magic {
		return nil, &FormatError{Offset: 0, Field: "magic", Err: fmt.Errorf("got %q, want %q (not a GGUF file)", data[:4], Magic)}
	}
	c.pos = 4
	version, err := c.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version&0xffff == 0 && version>>16 != 0:
		return nil, &FormatError{Offset: 4, Field: "version", Err: fmt.Errorf("0x%08x looks byte-swapped: big-endian GGUF files are not supported", version)}
	default:
		return nil, &FormatError{Offset: 4, Field: "version", Err: fmt.Errorf("unsupported version %d (supported: 2, 3)", version)}
	}
	nTensors, err := c.u64("tensor_count")
	if err != nil {
		return nil, err
	}
	nKV, err := c.u64("kv_count")
	if err != nil {
		return nil, err
	}
	// Every kv needs at least 8+4+1 bytes and every tensor 8+4+8+4+8.
	if nKV > uint64(c.remaining())/13 {
		return nil, &FormatError{Offset: 16, Field: "kv_count", Err: fmt.Errorf("%d entries cannot fit in the %d bytes that remain: %w", nKV, c.remaining(), ErrTruncated)}
	}
	if nTensors > uint64(c.remaining())/32 {
		return nil, &FormatError{Offset: 8, Field: "tensor_count", Err: fmt.Errorf("%d tensors cannot fit in the %d bytes that remain: %w", nTensors, c.remaining(), ErrTruncated)}
	}

	f := &File{
		Version:   version,
		KVs:       make([]KV, 0, min(nKV, maxPrealloc)),
		Tensors:   make([]TensorInfo, 0, min(nTensors, maxPrealloc)),
		Alignment: DefaultAlignment,
		data:      data,
		kvIndex:   make(map[string]int, min(nKV, maxPrealloc)),
		tIndex:    make(map[string]int, min(nTensors, maxPrealloc)),
	}
	alignOff := int64(0) // offset of the general.alignment value
	for i := uint64(0); i < nKV; i++ {
		keyOff := c.pos
		key, err := c.str(fmt.Sprintf("kv[%d] key", i), maxKeyLen)
		if err != nil {
			return nil, err
		}
		field := fmt.Sprintf("kv[%d] %q", i, key)
		if _, dup := f.kvIndex[key]; dup {
			return nil, &FormatError{Offset: keyOff, Field: field, Err: errors.New("duplicate key")}
		}
		vt, err := c.u32(field + " type")
		if err != nil {
			return nil, err
		}
		if t := ValueType(vt); t.scalarSize() == 0 && t != TypeString && t != TypeArray {
			return nil, &FormatError{Offset: c.pos - 4, Field: field + " type", Err: fmt.Errorf("unknown value type %d", vt)}
		}
		if key == "general.alignment" {
			alignOff = c.pos
		}
		v, err := c.value(ValueType(vt), field+" value", 0)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}
	if v, ok := f.KV("general.alignment"); ok {
		a, err := v.AsUint64()
		if err != nil || v.Type != TypeUint32 {
			return nil, &FormatError{Offset: alignOff, Field: "general.alignment", Err: fmt.Errorf("must be a u32, got %s", v.describe())}
		}
		if a == 0 || a&(a-1) != 0 {
			return nil, &FormatError{Offset: alignOff, Field: "general.alignment", Err: fmt.Errorf("%d is not a power of two", a)}
		}
		f.Alignment = a
	}

	for i := uint64(0); i < nTensors; i++ {
		start := c.pos
		t, err := c.tensorInfo(int(i))
		if err != nil {
			return nil, err
		}
		if _, dup := f.tIndex[t.Name]; dup {
			return nil, &FormatError{Offset: start, Field: fmt.Sprintf("tensor[%d] %q", i, t.Name), Err: errors.New("duplicate tensor name")}
		}
		f.tIndex[t.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}

	dataOff := alignUp(uint64(c.pos), f.Alignment)
	if len(f.Tensors) > 0 && dataOff > uint64(len(data)) {
		return nil, &FormatError{Offset: c.pos, Field: "data section", Err: fmt.Errorf("starts at %d, past the end of the %d-byte file: %w", dataOff, len(data), ErrTruncated)}
	}
	f.DataOffset = dataOff
	if err := f.checkTensorRanges(); err != nil {
		return nil, err
	}
	return f, nil
}

func alignUp(x, a uint64) uint64 {
	if r := x % a; r != 0 {
		return x + a - r
	}
	return x
}

func (c *cursor) tensorInfo(i int) (TensorInfo, error) {
	name, err := c.str(fmt.Sprintf("tensor[%d] name", i), maxNameLen)
	if err != nil {
		return TensorInfo{}, err
	}
	field := fmt.Sprintf("tensor[%d] %q", i, name)
	nd, err := c.u32(field + " n_dims")
	if err != nil {
		return TensorInfo{}, err
	}
	if nd == 0 || nd > MaxDims {
		return TensorInfo{}, &FormatError{Offset: c.pos - 4, Field: field + " n_dims", Err: fmt.Errorf("%d dimensions (must be 1..%d)", nd, MaxDims)}
	}
	dims := make([]uint64, nd)
	prod := uint64(1)
	for d := range dims {
		off := c.pos
		ne, err := c.u64(fmt.Sprintf("%s ne[%d]", field, d))
		if err != nil {
			return TensorInfo{}, err
		}
		if ne == 0 {
			return TensorInfo{}, &FormatError{Offset: off, Field: fmt.Sprintf("%s ne[%d]", field, d), Err: errors.New("dimension is zero")}
		}
		if ne > maxDimProduct || prod > maxDimProduct/ne {
			return TensorInfo{}, &FormatError{Offset: off, Field: fmt.Sprintf("%s ne[%d]", field, d), Err: fmt.Errorf("dimension %d makes the tensor absurdly large", ne)}
		}
		prod *= ne
		dims[d] = ne
	}
	typOff := c.pos
	typ, err := c.u32(field + " type")
	if err != nil {
		return TensorInfo{}, err
	}
	qt := quant.Type(typ)
	if !qt.Known() {
		return TensorInfo{}, &FormatError{Offset: typOff, Field: field + " type", Err: fmt.Errorf("unknown ggml type %d", typ)}
	}
	size, err := qt.TensorBytes(dims)
	if err != nil {
		return TensorInfo{}, &FormatError{Offset: typOff, Field: field + " type", Err: err}
	}
	off, err := c.u64(field + " offset")
	if err != nil {
		return TensorInfo{}, err
	}
	return TensorInfo{Name: name, Dims: dims, Type: qt, Offset: off, Size: size, Index: i}, nil
}

// checkTensorRanges verifies alignment, bounds and non-overlap of tensor data.
func (f *File) checkTensorRanges() error {
	avail := uint64(len(f.data)) - min(f.DataOffset, uint64(len(f.data)))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		field := fmt.Sprintf("tensor[%d] %q offset", i, t.Name)
		if t.Offset%f.Alignment != 0 {
			return &FormatError{Offset: int64(f.DataOffset), Field: field, Err: fmt.Errorf("%d is not a multiple of the alignment %d", t.Offset, f.Alignment)}
		}
		if t.Offset > avail || t.Size > avail-t.Offset {
			return &FormatError{Offset: int64(f.DataOffset), Field: field, Err: fmt.Errorf("data [%d, %d+%d) runs past the end of the data section (%d bytes): %w", t.Offset, t.Offset, t.Size, avail, ErrTruncated)}
		}
	}
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	for k := 1; k < len(order); k++ {
		prev, cur := &f.Tensors[order[k-1]], &f.Tensors[order[k]]
		if prev.Offset+prev.Size > cur.Offset {
			return &FormatError{Offset: int64(f.DataOffset), Field: fmt.Sprintf("tensor[%d] %q offset", cur.Index, cur.Name),
				Err: fmt.Errorf("data at %d overlaps tensor[%d] %q at [%d, %d)", cur.Offset, prev.Index, prev.Name, prev.Offset, prev.Offset+prev.Size)}
		}
	}
	return nil
}

func (c *cursor) value(t ValueType, field string, depth int) (Value, error) {
	start := c.pos
	if sz := t.scalarSize(); sz > 0 {
		if err := c.need(int64(sz), field); err != nil {
			return Value{}, err
		}
		v := decodeScalar(t, c.b[c.pos:c.pos+int64(sz)])
		c.pos += int64(sz)
		if t == TypeBool && v.U > 1 {
			return Value{}, &FormatError{Offset: start, Field: field, Err: fmt.Errorf("bool byte is %d (must be 0 or 1)", v.U)}
		}
		return v, nil
	}
	switch t {
	case TypeString:
		s, err := c.str(field, math.MaxUint64)
		if err != nil {
			return Value{}, err
		}
		return Str(s), nil
	case TypeArray:
		if depth >= maxNestDepth {
			return Value{}, &FormatError{Offset: start, Field: field, Err: fmt.Errorf("arrays nested deeper than %d", maxNestDepth)}
		}
		et, err := c.u32(field + " element type")
		if err != nil {
			return Value{}, err
		}
		elem := ValueType(et)
		// Minimum encoded size of one element, to bound n before allocating.
		minSize := uint64(elem.scalarSize())
		switch elem {
		case TypeString:
			minSize = 8
		case TypeArray:
			minSize = 12
		}
		if minSize == 0 {
			return Value{}, &FormatError{Offset: start, Field: field + " element type", Err: fmt.Errorf("unknown value type %d", et)}
		}
		n, err := c.u64(field + " count")
		if err != nil {
			return Value{}, err
		}
		v := Value{Type: TypeArray, ElemType: elem, Count: n}
		if n > uint64(c.remaining())/minSize {
			return Value{}, &FormatError{Offset: start + 4, Field: field + " count", Err: fmt.Errorf("%d elements cannot fit in the %d bytes that remain: %w", n, c.remaining(), ErrTruncated)}
		}
		switch elem {
		case TypeString:
			v.Strings = make([]string, 0, min(n, maxPrealloc))
			for i := uint64(0); i < n; i++ {
				// Fast path without formatting a field name per element
				// (vocabularies have 10^5 of them); c.str reports errors.
				if c.remaining() >= 8 {
					if l := binary.LittleEndian.Uint64(c.b[c.pos:]); l <= uint64(c.remaining()-8) {
						p := c.pos + 8
						v.Strings = append(v.Strings, string(c.b[p:p+int64(l)]))
						c.pos = p + int64(l)
						continue
					}
				}
				s, err := c.str(fmt.Sprintf("%s[%d]", field, i), math.MaxUint64)
				if err != nil {
					return Value{}, err
				}
				v.Strings = append(v.Strings, s)
			}
		case TypeArray:
			v.Elems = make([]Value, 0, min(n, maxPrealloc))
			for i := uint64(0); i < n; i++ {
				e, err := c.value(TypeArray, fmt.Sprintf("%s[%d]", field, i), depth+1)
				if err != nil {
					return Value{}, err
				}
				v.Elems = append(v.Elems, e)
			}
		default:
			nb := int64(n) * int64(minSize)
			v.Raw = c.b[c.pos : c.pos+nb : c.pos+nb]
			if elem == TypeBool {
				for i, b := range v.Raw {
					if b > 1 {
						return Value{}, &FormatError{Offset: c.pos + int64(i), Field: fmt.Sprintf("%s[%d]", field, i), Err: fmt.Errorf("bool byte is %d (must be 0 or 1)", b)}
					}
				}
			}
			c.pos += nb
		}
		return v, nil
	}
	return Value{}, &FormatError{Offset: start - 4, Field: field + " type", Err: fmt.Errorf("unknown value type %d", uint32(t))}
}
