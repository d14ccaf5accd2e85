package score

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"ds4go/convert"
)

// The tensors of a logits file.
const (
	// TensorLogits is F32 [rows, vocab]: the next-token logits of each row.
	TensorLogits = "logits"
	// TensorPositions is I32 [rows]: the index of the last token consumed
	// before each row.
	TensorPositions = "positions"
)

// LogitsFile is an open logits file (a reference): its positions are read
// at open, its rows on demand, so a file larger than memory can be compared
// row by row.
type LogitsFile struct {
	Path      string
	Rows      int
	Vocab     int
	Positions []int32
	Metadata  map[string]string

	sf     *convert.SafeFile
	logits *convert.TensorInfo
	buf    []byte
}

// OpenLogits opens and validates a logits file: a "logits" tensor of F32
// [rows, vocab] with rows, vocab ≥ 1 and a "positions" tensor of I32
// [rows]. Other tensors are ignored.
func OpenLogits(path string) (*LogitsFile, error) {
	sf, err := convert.OpenSafetensors(path)
	if err != nil {
		var he *convert.HeaderError
		if errors.As(err, &he) {
			return nil, fmt.Errorf("%w: %v", ErrInput, err)
		}
		return nil, fmt.Errorf("logits file: %w", err)
	}
	f, err := newLogitsFile(path, sf)
	if err != nil {
		sf.Close()
		return nil, err
	}
	return f, nil
}

func newLogitsFile(path string, sf *convert.SafeFile) (*LogitsFile, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("logits file %s: %w", path, inputErr(format, args...))
	}
	lt, ok := sf.Header.Tensor(TensorLogits)
	if !ok {
		return nil, bad("no %q tensor", TensorLogits)
	}
	if lt.DType != convert.F32 || len(lt.Shape) != 2 || lt.Shape[0] < 1 || lt.Shape[1] < 1 {
		return nil, bad("%q is %s %v, want F32 [rows ≥ 1, vocab ≥ 1]", TensorLogits, lt.DType, lt.Shape)
	}
	if lt.Shape[0] > math.MaxInt32 || lt.Shape[1] > math.MaxInt32 {
		return nil, bad("%q shape %v is too large", TensorLogits, lt.Shape)
	}
	rows, vocab := int(lt.Shape[0]), int(lt.Shape[1])
	pt, ok := sf.Header.Tensor(TensorPositions)
	if !ok {
		return nil, bad("no %q tensor", TensorPositions)
	}
	if pt.DType != convert.I32 || len(pt.Shape) != 1 || pt.Shape[0] != int64(rows) {
		return nil, bad("%q is %s %v, want I32 [%d] (one per logits row)", TensorPositions, pt.DType, pt.Shape, rows)
	}
	pb, err := sf.ReadAll(pt)
	if err != nil {
		return nil, fmt.Errorf("logits file %s: %w", path, err)
	}
	pos := make([]int32, rows)
	for i := range pos {
		pos[i] = int32(binary.LittleEndian.Uint32(pb[4*i:]))
		if pos[i] < 0 {
			return nil, bad("position %d of row %d is negative", pos[i], i)
		}
	}
	return &LogitsFile{Path: path, Rows: rows, Vocab: vocab, Positions: pos, Metadata: sf.Header.Metadata,
		sf: sf, logits: lt}, nil
}

// Match checks that the file has the given vocabulary size and exactly the
// given positions (so its rows pair with a run's rows one to one).
func (f *LogitsFile) Match(vocab int, positions []int32) error {
	if f.Vocab != vocab {
		return fmt.Errorf("reference %s: %w", f.Path, inputErr("vocabulary of %d logits, the model has %d", f.Vocab, vocab))
	}
	if f.Rows != len(positions) {
		return fmt.Errorf("reference %s: %w", f.Path, inputErr("%d rows, this run produces %d (positions %s)", f.Rows, len(positions), posRange(positions)))
	}
	for i, p := range positions {
		if f.Positions[i] != p {
			return fmt.Errorf("reference %s: %w", f.Path, inputErr("row %d is at position %d, this run's row %d is at %d", i, f.Positions[i], i, p))
		}
	}
	return nil
}

func posRange(p []int32) string {
	if len(p) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d…%d", p[0], p[len(p)-1])
}

// Row reads row i into dst (grown as needed) and checks that its values are
// finite.
func (f *LogitsFile) Row(i int, dst []float32) ([]float32, error) {
	if i < 0 || i >= f.Rows {
		return nil, fmt.Errorf("logits file %s: row %d outside [0, %d)", f.Path, i, f.Rows)
	}
	n := 4 * f.Vocab
	if cap(f.buf) < n {
		f.buf = make([]byte, n)
	}
	b := f.buf[:n]
	if err := f.sf.ReadRange(f.logits, uint64(i)*uint64(n), b); err != nil {
		return nil, fmt.Errorf("logits file %s: %w", f.Path, err)
	}
	if cap(dst) < f.Vocab {
		dst = make([]float32, f.Vocab)
	}
	dst = dst[:f.Vocab]
	for j := range dst {
		dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
	}
	if err := CheckFinite(dst); err != nil {
		return nil, fmt.Errorf("logits file %s: %w", f.Path, inputErr("row %d (position %d): %v", i, f.Positions[i], err))
	}
	return dst, nil
}

// Close closes the file.
func (f *LogitsFile) Close() error { return f.sf.Close() }

// LogitsWriter writes a logits file row by row. It writes to a temporary
// file beside the destination and renames it into place when Close finds
// every row written; Abort removes it.
type LogitsWriter struct {
	path, tmp string
	f         *os.File
	sw        *convert.SafeWriter
	vocab     int
	rows, n   int
	buf       []byte
}

// CreateLogits starts a logits file with the given vocabulary size and row
// positions (known before the run); metadata is stored in __metadata__.
func CreateLogits(path string, vocab int, positions []int32, metadata map[string]string) (*LogitsWriter, error) {
	if vocab < 1 || len(positions) < 1 {
		return nil, fmt.Errorf("logits file %s: %d rows of %d logits", path, len(positions), vocab)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("logits file: %w", err)
	}
	w := &LogitsWriter{path: path, tmp: f.Name(), f: f, vocab: vocab, rows: len(positions)}
	specs := []convert.WriteSpec{
		{Name: TensorPositions, DType: convert.I32, Shape: []int64{int64(len(positions))}},
		{Name: TensorLogits, DType: convert.F32, Shape: []int64{int64(len(positions)), int64(vocab)}},
	}
	if w.sw, err = convert.NewSafeWriter(f, specs, metadata); err != nil {
		w.Abort()
		return nil, fmt.Errorf("logits file %s: %w", path, err)
	}
	if err := w.sw.WriteI32(positions); err != nil {
		w.Abort()
		return nil, fmt.Errorf("logits file %s: %w", path, err)
	}
	return w, nil
}

// WriteRow appends the next row.
func (w *LogitsWriter) WriteRow(row []float32) error {
	if len(row) != w.vocab {
		return fmt.Errorf("logits file %s: row of %d values, want %d", w.path, len(row), w.vocab)
	}
	if w.n >= w.rows {
		return fmt.Errorf("logits file %s: more than %d rows", w.path, w.rows)
	}
	w.buf = w.buf[:0]
	for _, v := range row {
		w.buf = binary.LittleEndian.AppendUint32(w.buf, math.Float32bits(v))
	}
	if _, err := w.sw.Write(w.buf); err != nil {
		return fmt.Errorf("logits file %s: %w", w.path, err)
	}
	w.n++
	return nil
}

// Close finishes the file: it fails (and removes the temporary file) unless
// every row was written.
func (w *LogitsWriter) Close() error {
	if w.f == nil {
		return fmt.Errorf("logits file %s: already closed", w.path)
	}
	if err := w.sw.Close(); err != nil {
		w.Abort()
		return fmt.Errorf("logits file %s: %d of %d rows written: %w", w.path, w.n, w.rows, err)
	}
	err := w.f.Close()
	w.f = nil
	if err == nil {
		err = os.Rename(w.tmp, w.path)
	}
	if err != nil {
		os.Remove(w.tmp)
		return fmt.Errorf("logits file %s: %w", w.path, err)
	}
	return nil
}

// Abort discards the file being written.
func (w *LogitsWriter) Abort() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	os.Remove(w.tmp)
}
