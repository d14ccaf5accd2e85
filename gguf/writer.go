package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"ds4go/quant"
)

// TensorSpec declares one tensor of a file being written.
type TensorSpec struct {
	Name string
	Type quant.Type
	Dims []uint64 // Dims[0] is the row length
}

// Builder describes a GGUF file to write: its metadata (in order), its
// tensors (in order) and the data alignment. Tensor data is laid out
// sequentially, each tensor at the next multiple of the alignment, which
// is the layout ggml and the reference tools write.
type Builder struct {
	Version   uint32 // 3 when zero
	Alignment uint64 // DefaultAlignment when zero; written only as general.alignment in KVs, which any other value requires
	KVs       []KV
	Tensors   []TensorSpec
}

// Layout is the byte plan of a Builder: the encoded header (everything
// before the data section, padding included) and each tensor's absolute
// offset and size.
type Layout struct {
	Header    []byte
	Offsets   []uint64 // absolute file offsets of each tensor's data
	Sizes     []uint64
	TotalSize uint64
}

// Add appends a metadata pair.
func (b *Builder) Add(key string, v Value) { b.KVs = append(b.KVs, KV{Key: key, Value: v}) }

// AddTensor appends a tensor declaration.
func (b *Builder) AddTensor(name string, t quant.Type, dims ...uint64) {
	b.Tensors = append(b.Tensors, TensorSpec{Name: name, Type: t, Dims: append([]uint64(nil), dims...)})
}

// Layout validates the builder and computes the file's byte plan.
func (b *Builder) Layout() (*Layout, error) {
	version := b.Version
	if version == 0 {
		version = 3
	}
	if version != 2 && version != 3 {
		return nil, fmt.Errorf("gguf: cannot write version %d", version)
	}
	align := b.Alignment
	if align == 0 {
		align = DefaultAlignment
	}
	keys := make(map[string]bool, len(b.KVs))
	alignKV := false
	for _, kv := range b.KVs {
		if keys[kv.Key] {
			return nil, fmt.Errorf("gguf: duplicate metadata key %q", kv.Key)
		}
		keys[kv.Key] = true
		if len(kv.Key) > maxKeyLen {
			return nil, fmt.Errorf("gguf: metadata key of %d bytes exceeds the limit of %d", len(kv.Key), maxKeyLen)
		}
		if kv.Key == "general.alignment" {
			alignKV = true
			a, err := kv.Value.AsUint64()
			if err != nil || kv.Value.Type != TypeUint32 {
				return nil, fmt.Errorf("gguf: general.alignment must be a u32")
			}
			if b.Alignment != 0 && a != b.Alignment {
				return nil, fmt.Errorf("gguf: general.alignment %d disagrees with Builder.Alignment %d", a, b.Alignment)
			}
			align = a
		}
	}
	if align == 0 || align&(align-1) != 0 {
		return nil, fmt.Errorf("gguf: alignment %d is not a power of two", align)
	}
	if !alignKV && align != DefaultAlignment {
		// Readers take the alignment from general.alignment, 32 without it,
		// and would look for the tensor data in the wrong place.
		return nil, fmt.Errorf("gguf: Builder.Alignment %d needs a u32 general.alignment key (readers assume %d without one)", align, DefaultAlignment)
	}

	h := make([]byte, 0, 1<<16)
	h = append(h, Magic...)
	h = binary.LittleEndian.AppendUint32(h, version)
	h = binary.LittleEndian.AppendUint64(h, uint64(len(b.Tensors)))
	h = binary.LittleEndian.AppendUint64(h, uint64(len(b.KVs)))
	var err error
	for _, kv := range b.KVs {
		h = appendString(h, kv.Key)
		h = binary.LittleEndian.AppendUint32(h, uint32(kv.Value.Type))
		if h, err = appendValue(h, kv.Value, 0); err != nil {
			return nil, fmt.Errorf("gguf: metadata %q: %w", kv.Key, err)
		}
	}
	l := &Layout{Offsets: make([]uint64, len(b.Tensors)), Sizes: make([]uint64, len(b.Tensors))}
	names := make(map[string]bool, len(b.Tensors))
	rel := uint64(0)
	for i, t := range b.Tensors {
		if names[t.Name] {
			return nil, fmt.Errorf("gguf: duplicate tensor name %q", t.Name)
		}
		names[t.Name] = true
		if len(t.Name) > maxNameLen {
			return nil, fmt.Errorf("gguf: tensor name of %d bytes exceeds the limit of %d", len(t.Name), maxNameLen)
		}
		if len(t.Dims) == 0 || len(t.Dims) > MaxDims {
			return nil, fmt.Errorf("gguf: tensor %q has %d dimensions (must be 1..%d)", t.Name, len(t.Dims), MaxDims)
		}
		prod := uint64(1)
		for d, ne := range t.Dims {
			if ne == 0 {
				return nil, fmt.Errorf("gguf: tensor %q dimension %d is zero", t.Name, d)
			}
			if ne > maxDimProduct || prod > maxDimProduct/ne {
				return nil, fmt.Errorf("gguf: tensor %q has more than 2^50 elements", t.Name)
			}
			prod *= ne
		}
		size, err := t.Type.TensorBytes(t.Dims)
		if err != nil {
			return nil, fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
		}
		h = appendString(h, t.Name)
		h = binary.LittleEndian.AppendUint32(h, uint32(len(t.Dims)))
		for _, ne := range t.Dims {
			h = binary.LittleEndian.AppendUint64(h, ne)
		}
		h = binary.LittleEndian.AppendUint32(h, uint32(t.Type))
		h = binary.LittleEndian.AppendUint64(h, rel)
		l.Offsets[i] = rel
		l.Sizes[i] = size
		if size > maxDataSize-rel {
			return nil, fmt.Errorf("gguf: tensor %q: the data section would exceed 2^62 bytes", t.Name)
		}
		rel = alignUp(rel+size, align)
	}
	dataOff := alignUp(uint64(len(h)), align)
	h = append(h, make([]byte, dataOff-uint64(len(h)))...)
	l.Header = h
	for i := range l.Offsets {
		l.Offsets[i] += dataOff
	}
	// Like ggml's writer, pad after every tensor, the last one included.
	l.TotalSize = dataOff + rel
	return l, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// maxDataSize bounds the data section a Builder lays out, far above any real
// file, so that offset arithmetic cannot overflow.
const maxDataSize = 1 << 62

// checkScalar reports an integer scalar whose value does not fit its type,
// which appendScalar would otherwise silently truncate.
func checkScalar(v Value) error {
	ok := true
	switch v.Type {
	case TypeUint8:
		ok = v.U <= math.MaxUint8
	case TypeUint16:
		ok = v.U <= math.MaxUint16
	case TypeUint32:
		ok = v.U <= math.MaxUint32
	case TypeInt8:
		ok = v.I >= math.MinInt8 && v.I <= math.MaxInt8
	case TypeInt16:
		ok = v.I >= math.MinInt16 && v.I <= math.MaxInt16
	case TypeInt32:
		ok = v.I >= math.MinInt32 && v.I <= math.MaxInt32
	}
	if !ok {
		return fmt.Errorf("value %s does not fit in %s", v.Format(0), v.Type)
	}
	return nil
}

// appendValue appends the encoding of v, an element of an array nested depth
// deep (0 at top level). It refuses every value the reader would reject.
func appendValue(b []byte, v Value, depth int) ([]byte, error) {
	if v.Type.scalarSize() > 0 {
		if err := checkScalar(v); err != nil {
			return nil, err
		}
		return appendScalar(b, v), nil
	}
	switch v.Type {
	case TypeString:
		return appendString(b, v.S), nil
	case TypeArray:
		if depth >= maxNestDepth {
			return nil, fmt.Errorf("arrays nested deeper than %d", maxNestDepth)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(v.ElemType))
		b = binary.LittleEndian.AppendUint64(b, v.Count)
		switch {
		case v.ElemType == TypeString:
			if uint64(len(v.Strings)) != v.Count {
				return nil, fmt.Errorf("string array count %d but %d strings", v.Count, len(v.Strings))
			}
			for _, s := range v.Strings {
				b = appendString(b, s)
			}
		case v.ElemType == TypeArray:
			if uint64(len(v.Elems)) != v.Count {
				return nil, fmt.Errorf("nested array count %d but %d elements", v.Count, len(v.Elems))
			}
			for i, e := range v.Elems {
				if e.Type != TypeArray {
					return nil, fmt.Errorf("element %d of an array of arrays is a %s", i, e.Type)
				}
				var err error
				if b, err = appendValue(b, e, depth+1); err != nil {
					return nil, err
				}
			}
		case v.ElemType.scalarSize() > 0:
			sz := v.ElemType.scalarSize()
			if len(v.Raw)%sz != 0 || uint64(len(v.Raw)/sz) != v.Count {
				return nil, fmt.Errorf("array of %d %s holds %d bytes", v.Count, v.ElemType, len(v.Raw))
			}
			if v.ElemType == TypeBool {
				for i, x := range v.Raw {
					if x > 1 {
						return nil, fmt.Errorf("bool element %d is %d (must be 0 or 1)", i, x)
					}
				}
			}
			b = append(b, v.Raw...)
		default:
			return nil, fmt.Errorf("unknown array element type %d", uint32(v.ElemType))
		}
		return b, nil
	}
	return nil, fmt.Errorf("unknown value type %d", uint32(v.Type))
}

// Write streams the whole file to w: the header, then each tensor's bytes
// as returned by data(i), with the alignment padding between tensors.
// data must return exactly the tensor's size; the returned slice is not
// retained.
func (b *Builder) Write(w io.Writer, data func(i int) ([]byte, error)) error {
	l, err := b.Layout()
	if err != nil {
		return err
	}
	if _, err := w.Write(l.Header); err != nil {
		return fmt.Errorf("gguf: write header: %w", err)
	}
	pos := uint64(len(l.Header))
	var zeros [256]byte
	pad := func(to uint64) error {
		for pos < to {
			n := min(to-pos, uint64(len(zeros)))
			if _, err := w.Write(zeros[:n]); err != nil {
				return fmt.Errorf("gguf: write padding: %w", err)
			}
			pos += n
		}
		return nil
	}
	for i := range b.Tensors {
		if err := pad(l.Offsets[i]); err != nil {
			return err
		}
		buf, err := data(i)
		if err != nil {
			return fmt.Errorf("gguf: tensor %q: %w", b.Tensors[i].Name, err)
		}
		if uint64(len(buf)) != l.Sizes[i] {
			return fmt.Errorf("gguf: tensor %q: got %d bytes of data, want %d", b.Tensors[i].Name, len(buf), l.Sizes[i])
		}
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("gguf: write tensor %q: %w", b.Tensors[i].Name, err)
		}
		pos += l.Sizes[i]
	}
	return pad(l.TotalSize)
}

// FromFile returns a Builder that reproduces f's metadata, tensor order and
// alignment. Writing it with f's tensor data yields a byte-identical file
// when f used the standard sequential layout.
func FromFile(f *File) *Builder {
	b := &Builder{Version: f.Version, KVs: append([]KV(nil), f.KVs...)}
	if _, ok := f.KV("general.alignment"); !ok {
		b.Alignment = f.Alignment
	}
	for _, t := range f.Tensors {
		b.Tensors = append(b.Tensors, TensorSpec{Name: t.Name, Type: t.Type, Dims: append([]uint64(nil), t.Dims...)})
	}
	return b
}

// ErrLayoutMismatch is returned by Rewrite when the source file does not use
// the standard sequential layout, so a byte-identical copy is impossible.
var ErrLayoutMismatch = errors.New("gguf: source tensor offsets differ from the sequential layout")

// Rewrite writes f back out through a Builder. It fails with
// ErrLayoutMismatch when f's tensors are not laid out sequentially.
func Rewrite(f *File, w io.Writer) error {
	// A file without tensors may end before its (padded) data section
	// starts; the sequential layout never does, and laying it out would pad
	// the header to an alignment of up to 2 GiB.
	if f.DataOffset > uint64(f.Size()) {
		return fmt.Errorf("%w: data section starts at %d, past the end of the %d-byte file", ErrLayoutMismatch, f.DataOffset, f.Size())
	}
	b := FromFile(f)
	l, err := b.Layout()
	if err != nil {
		return err
	}
	for i := range f.Tensors {
		if l.Offsets[i] != f.DataOffset+f.Tensors[i].Offset {
			return fmt.Errorf("%w: tensor %q at %d, sequential layout puts it at %d", ErrLayoutMismatch, f.Tensors[i].Name, f.DataOffset+f.Tensors[i].Offset, l.Offsets[i])
		}
	}
	if l.TotalSize != uint64(f.Size()) {
		return fmt.Errorf("%w: file is %d bytes, sequential layout gives %d", ErrLayoutMismatch, f.Size(), l.TotalSize)
	}
	return b.Write(w, func(i int) ([]byte, error) { return f.TensorData(&f.Tensors[i]), nil })
}
