package convert

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// WriteSpec declares one tensor of a safetensors file being written.
type WriteSpec struct {
	Name  string
	DType DType
	Shape []int64
}

// Bytes returns the size of the tensor's data, or an error for an unknown
// dtype, a negative dimension, too many elements or a size that is not a
// whole number of bytes.
func (s *WriteSpec) Bytes() (uint64, error) {
	nbits := s.DType.Bits()
	if nbits == 0 {
		return 0, fmt.Errorf("tensor %q: unknown dtype %q", s.Name, s.DType)
	}
	if len(s.Shape) > maxDims {
		return 0, fmt.Errorf("tensor %q: %d dimensions (at most %d)", s.Name, len(s.Shape), maxDims)
	}
	n := uint64(1)
	for _, d := range s.Shape {
		if d < 0 {
			return 0, fmt.Errorf("tensor %q: negative dimension in %v", s.Name, s.Shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > maxTensorEls {
			return 0, fmt.Errorf("tensor %q: shape %v has too many elements", s.Name, s.Shape)
		}
		n = lo
	}
	if n*uint64(nbits)%8 != 0 {
		return 0, fmt.Errorf("tensor %q: %d elements of %s are not a whole number of bytes", s.Name, n, s.DType)
	}
	return n * uint64(nbits) / 8, nil
}

// SafeWriter streams a safetensors file: NewSafeWriter writes the header
// (every tensor's dtype, shape and offsets are known up front), then Write
// takes the tensors' data in the order of the specs, in pieces of any size,
// so a file larger than memory (e.g. logits over a long text) can be written
// row by row. Close checks that every byte was written; it does not close
// the underlying writer.
type SafeWriter struct {
	w     io.Writer
	total uint64 // bytes of data the header promises
	done  uint64
	err   error
}

// NewSafeWriter writes the header of a safetensors file holding the given
// tensors, laid out in order, with optional metadata (__metadata__). Names
// must be unique, non-empty and not "__metadata__". The header is padded
// with spaces to a multiple of 8 bytes, as the reference implementation
// does, so that the data section is aligned.
func NewSafeWriter(w io.Writer, specs []WriteSpec, metadata map[string]string) (*SafeWriter, error) {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			b.WriteByte(',')
		}
		first = false
	}
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		sep()
		b.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonString(k))
			b.WriteByte(':')
			b.WriteString(jsonString(metadata[k]))
		}
		b.WriteByte('}')
	}
	seen := map[string]bool{}
	var off uint64
	for i := range specs {
		s := &specs[i]
		if s.Name == "" || s.Name == "__metadata__" {
			return nil, fmt.Errorf("safetensors: tensor %d: invalid name %q", i, s.Name)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("safetensors: duplicate tensor %q", s.Name)
		}
		seen[s.Name] = true
		n, err := s.Bytes()
		if err != nil {
			return nil, fmt.Errorf("safetensors: %w", err)
		}
		sep()
		b.WriteString(jsonString(s.Name))
		b.WriteString(`:{"dtype":`)
		b.WriteString(jsonString(string(s.DType)))
		b.WriteString(`,"shape":[`)
		for j, d := range s.Shape {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, off, off+n)
		off += n
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	if b.Len() > MaxHeaderLen {
		return nil, fmt.Errorf("safetensors: header of %d bytes exceeds %d", b.Len(), MaxHeaderLen)
	}
	hdr := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+b.Len()), uint64(b.Len()))
	hdr = append(hdr, b.String()...)
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("safetensors: write header: %w", err)
	}
	return &SafeWriter{w: w, total: off}, nil
}

func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// ErrSafeWriterOverflow is returned by SafeWriter.Write past the data the
// header declared.
var ErrSafeWriterOverflow = errors.New("safetensors: more data than the header declares")

// Write appends tensor data (the tensors' bytes concatenated in the order
// of the specs).
func (s *SafeWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if uint64(len(p)) > s.total-s.done {
		s.err = fmt.Errorf("%w (%d bytes declared, %d written, %d more given)", ErrSafeWriterOverflow, s.total, s.done, len(p))
		return 0, s.err
	}
	n, err := s.w.Write(p)
	s.done += uint64(n)
	if err != nil {
		s.err = fmt.Errorf("safetensors: write data: %w", err)
		return n, s.err
	}
	return n, nil
}

// WriteF32 appends float32 values, little-endian.
func (s *SafeWriter) WriteF32(xs []float32) error {
	buf := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
	}
	_, err := s.Write(buf)
	return err
}

// WriteI32 appends int32 values, little-endian.
func (s *SafeWriter) WriteI32(xs []int32) error {
	buf := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(x))
	}
	_, err := s.Write(buf)
	return err
}

// Remaining returns how many bytes of data are still to be written.
func (s *SafeWriter) Remaining() uint64 { return s.total - s.done }

// Close reports an earlier write error, or an error if less data was
// written than the header declares.
func (s *SafeWriter) Close() error {
	if s.err != nil {
		return s.err
	}
	if s.done != s.total {
		return fmt.Errorf("safetensors: %d of %d data bytes written", s.done, s.total)
	}
	return nil
}

// WriteTensor is a tensor with its data, for WriteSafetensors.
type WriteTensor struct {
	WriteSpec
	Data []byte
}

// WriteSafetensors writes a whole safetensors file from in-memory tensors.
func WriteSafetensors(w io.Writer, tensors []WriteTensor, metadata map[string]string) error {
	specs := make([]WriteSpec, len(tensors))
	for i := range tensors {
		specs[i] = tensors[i].WriteSpec
		n, err := specs[i].Bytes()
		if err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
		if uint64(len(tensors[i].Data)) != n {
			return fmt.Errorf("safetensors: tensor %q: %d bytes of data, shape %v of %s needs %d",
				specs[i].Name, len(tensors[i].Data), specs[i].Shape, specs[i].DType, n)
		}
	}
	sw, err := NewSafeWriter(w, specs, metadata)
	if err != nil {
		return err
	}
	for i := range tensors {
		if _, err := sw.Write(tensors[i].Data); err != nil {
			return err
		}
	}
	return sw.Close()
}
