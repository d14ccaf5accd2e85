package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"ds4go/model"
	"ds4go/quant"
)

// mat is a weight matrix of rows×k values of one storage type, row-major:
// the view a matrix-vector product needs.
type mat struct {
	name string
	t    quant.Type
	rows int
	k    int
	rb   int // bytes per row
	data []byte
	act  quant.Type // activation format of t's dot product
	f32  []float32  // the values, for F32 matrices (a view of data when aligned)
}

func isFloat(t quant.Type) bool { return t == quant.F32 || t == quant.F16 || t == quant.BF16 }

// newMat views a bound tensor as a rows×k matrix.
func newMat(t *model.Tensor, rows, k int) (*mat, error) {
	if t == nil {
		return nil, fmt.Errorf("missing tensor")
	}
	if !quant.Supported(t.Type) || t.Type == quant.Q8_K {
		return nil, fmt.Errorf("%s: no dot product for %s weights", t.Name, t.Type)
	}
	if t.RowLen() != k || t.Rows() != rows {
		return nil, fmt.Errorf("%s: shape %v, want %d rows of %d", t.Name, t.Dims, rows, k)
	}
	act, err := quant.ActivationType(t.Type)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Name, err)
	}
	if k%act.BlockSize() != 0 {
		return nil, fmt.Errorf("%s: row length %d is not a multiple of the %s block size", t.Name, k, act)
	}
	rb := t.RowBytes()
	if len(t.Data) != rb*rows {
		return nil, fmt.Errorf("%s: %d bytes, want %d", t.Name, len(t.Data), rb*rows)
	}
	m := &mat{name: t.Name, t: t.Type, rows: rows, k: k, rb: rb, data: t.Data, act: act}
	if t.Type == quant.F32 && rows*k > 0 {
		if uintptr(unsafe.Pointer(&t.Data[0]))%4 == 0 {
			m.f32 = unsafe.Slice((*float32)(unsafe.Pointer(&t.Data[0])), rows*k)
		} else {
			m.f32 = make([]float32, rows*k)
			for i := range m.f32 {
				m.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
			}
		}
	}
	return m, nil
}

// sub returns rows [r0, r0+n) as a matrix (one expert of a stacked tensor,
// one group of the output projection).
func (m *mat) sub(r0, n int) *mat {
	s := *m
	s.rows = n
	s.data = m.data[r0*m.rb : (r0+n)*m.rb]
	if m.f32 != nil {
		s.f32 = m.f32[r0*m.k : (r0+n)*m.k]
	}
	return &s
}

func (m *mat) row(r int) []byte { return m.data[r*m.rb : (r+1)*m.rb] }

// floatRow returns row r of a float matrix as f32 values, decoding into buf
// unless the matrix is F32.
func (m *mat) floatRow(r int, buf []float32) []float32 {
	if m.f32 != nil {
		return m.f32[r*m.k : (r+1)*m.k]
	}
	_ = quant.Dequantize(m.t, m.row(r), buf[:m.k])
	return buf[:m.k]
}

// dotRow is row r · x for a float matrix in the float-weight order of
// package quant: exactly the value of quant.DotFloat32(floatRow(r), x), so
// one-token and many-token products agree bit for bit.
func (m *mat) dotRow(r int, x []float32) float32 {
	if m.f32 != nil {
		return quant.DotFloat32(m.f32[r*m.k:(r+1)*m.k], x)
	}
	return quant.DotFloatRow(m.t, m.row(r), x)
}

// quantTile is the number of quantized weight rows dotted with all tokens
// of a chunk before moving on (they stay in cache across the tokens).
const quantTile = 8

var rowBufs = sync.Pool{New: func() any { return new([]float32) }}

func getRowBuf(n int) *[]float32 {
	p := rowBufs.Get().(*[]float32)
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	*p = (*p)[:n]
	return p
}

// linJob is one matrix of a linear call: out[t·ldy + r] = W[r]·x_t.
type linJob struct {
	m   *mat
	y   []float32
	ldy int
}

// linear computes several matrix products that share their input: for
// each job and each of the n input rows x_t = x[t·ldx : t·ldx+k],
// y[t·ldy + r] = W[r]·x_t. All jobs must have the same k. Quantized weights
// dot an activation quantized to their activation format once per token
// (quant.NewActivation, as ggml does); float weights dot the f32 input.
// Each weight row is read once for all n tokens.
func (be *Backend) linear(sc *scratch, x []float32, ldx, n int, jobs ...linJob) {
	if n == 0 || len(jobs) == 0 {
		return
	}
	k := jobs[0].m.k
	// Quantize the input once per activation format.
	var acts [4][]*quant.Activation
	var actTypes [4]quant.Type
	nActs := 0
	actOf := make([]int, len(jobs))
	total := 0
	for j, jb := range jobs {
		if jb.m.k != k {
			panic(fmt.Sprintf("cpu: linear: %s has rows of %d, want %d", jb.m.name, jb.m.k, k))
		}
		total += jb.m.rows
		actOf[j] = -1
		if isFloat(jb.m.t) {
			continue
		}
		a := -1
		for i := 0; i < nActs; i++ {
			if actTypes[i] == jb.m.act {
				a = i
			}
		}
		if a < 0 {
			a = nActs
			actTypes[a] = jb.m.act
			acts[a] = sc.activations(jb.m.act, k, n)
			nActs++
			as := acts[a]
			be.pool.run(n, 1, func(lo, hi int) {
				for t := lo; t < hi; t++ {
					_ = as[t].Set(x[t*ldx : t*ldx+k])
				}
			})
		}
		actOf[j] = a
	}
	grain := max(1, 65536/(k*n))
	be.pool.run(total, grain, func(lo, hi int) {
		var buf *[]float32
		j, base := 0, 0
		for r := lo; r < hi; r++ {
			for r-base >= jobs[j].m.rows {
				base += jobs[j].m.rows
				j++
			}
			jb, rr := &jobs[j], r-base
			m := jb.m
			switch {
			case !isFloat(m.t):
				// A tile of rows of this job, dotted with every token's
				// activation (quant.MatVec checks once per call).
				end := min(hi-base, m.rows, rr+quantTile)
				w, as := m.data[rr*m.rb:end*m.rb], acts[actOf[j]]
				for t := 0; t < n; t++ {
					_ = quant.MatVec(m.t, w, as[t], jb.y[t*jb.ldy+rr:t*jb.ldy+end])
				}
				r = base + end - 1
			case n == 1:
				jb.y[rr] = m.dotRow(rr, x[:k])
			default:
				if buf == nil && m.f32 == nil {
					buf = getRowBuf(k)
				}
				var w []float32
				if m.f32 != nil {
					w = m.f32[rr*k : (rr+1)*k]
				} else {
					w = m.floatRow(rr, *buf)
				}
				for t := 0; t < n; t++ {
					jb.y[t*jb.ldy+rr] = quant.DotFloat32(w, x[t*ldx:t*ldx+k])
				}
			}
		}
		if buf != nil {
			rowBufs.Put(buf)
		}
	})
}
