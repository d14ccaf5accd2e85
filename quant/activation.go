package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// MaxActivationLen bounds the length of an Activation, so that a corrupt
// dimension cannot request a huge allocation.
const MaxActivationLen = 1 << 28

// ActivationType returns the activation format that the dot product of a
// weight row of type w consumes: Q8_0 for Q8_0 weights, Q8_K for Q2_K, Q4_K
// and IQ2_XXS weights (as in ggml's CPU vec_dot), and F32 for F32, F16 and
// BF16 weights (ds4.c multiplies half-precision weights with f32
// activations; ggml would round the activations to F16/BF16 first, which an
// Activation of type F16/BF16 reproduces).
func ActivationType(w Type) (Type, error) {
	switch w {
	case Q8_0:
		return Q8_0, nil
	case Q2_K, Q4_K, IQ2_XXS:
		return Q8_K, nil
	case F32, F16, BF16:
		return F32, nil
	}
	return 0, fmt.Errorf("quant: no dot product for weights of type %s", w)
}

// Activation is a vector of N values prepared for dot products against
// weight rows: stored as float32 (type F32, or F16/BF16 for values rounded
// to those precisions), or quantized to Q8_0 or Q8_K. A matrix-vector
// product quantizes the activation once with Set and then dots every row.
// An Activation is not safe for concurrent Set, but concurrent dots that
// only read it are fine.
type Activation struct {
	t     Type
	n     int
	f     []float32 // F32/F16/BF16 values
	q     []int8    // Q8_0/Q8_K quants
	d     []float32 // Q8_0/Q8_K per-block scales (Q8_0: the f16 value)
	bsums []int16   // Q8_K sums of 16 consecutive quants
}

// NewActivation allocates an activation of n values in format t (F32, F16,
// BF16, Q8_0 or Q8_K). n must be a positive multiple of t's block size.
func NewActivation(t Type, n int) (*Activation, error) {
	switch t {
	case F32, F16, BF16, Q8_0, Q8_K:
	default:
		return nil, fmt.Errorf("quant: %s is not an activation format", t)
	}
	if n <= 0 || n > MaxActivationLen {
		return nil, fmt.Errorf("quant: activation length %d out of range (1..%d)", n, MaxActivationLen)
	}
	bs := t.BlockSize()
	if n%bs != 0 {
		return nil, fmt.Errorf("quant: activation length %d is not a multiple of the %s block size %d", n, t, bs)
	}
	a := &Activation{t: t, n: n}
	switch t {
	case F32, F16, BF16:
		a.f = make([]float32, n)
	case Q8_0:
		a.q = make([]int8, n)
		a.d = make([]float32, n/32)
	case Q8_K:
		a.q = make([]int8, n)
		a.d = make([]float32, n/QK_K)
		a.bsums = make([]int16, n/16)
	}
	return a, nil
}

// Type returns the activation's format.
func (a *Activation) Type() Type { return a.t }

// Len returns the number of values.
func (a *Activation) Len() int { return a.n }

// Set stores x (len(x) must equal Len) in the activation's format. Q8_0
// uses ggml's x86 CPU quantize_row_q8_0 (scale max/127 stored as f16,
// multiplier 127/max, round half to even); Q8_K uses ggml's
// quantize_row_q8_K. Both are bit-exact with ggml.
func (a *Activation) Set(x []float32) error {
	if len(x) != a.n {
		return fmt.Errorf("quant: activation of %d values set from %d values", a.n, len(x))
	}
	switch a.t {
	case F32:
		copy(a.f, x)
	case F16:
		for i, v := range x {
			a.f[i] = RoundF16(v)
		}
	case BF16:
		for i, v := range x {
			a.f[i] = RoundBF16(v)
		}
	case Q8_0:
		for b := range a.d {
			a.d[b] = quantQ8_0Act((*[32]float32)(x[32*b:]), (*[32]int8)(a.q[32*b:]))
		}
	case Q8_K:
		for b := range a.d {
			a.d[b] = quantQ8KBlock((*[QK_K]float32)(x[QK_K*b:]), (*[QK_K]int8)(a.q[QK_K*b:]), (*[16]int16)(a.bsums[16*b:]))
		}
	}
	return nil
}

// SetBytes loads the activation from ggml's encoding of its type (block
// bytes for Q8_0/Q8_K, little-endian values for F32/F16/BF16).
func (a *Activation) SetBytes(b []byte) error {
	if err := checkRow(a.t, len(b), a.n); err != nil {
		return fmt.Errorf("activation: %w", err)
	}
	switch a.t {
	case F32, F16, BF16:
		return Dequantize(a.t, b, a.f)
	case Q8_0:
		for i := range a.d {
			blk := b[q8_0Bytes*i:]
			a.d[i] = F16ToF32(binary.LittleEndian.Uint16(blk))
			for j := 0; j < 32; j++ {
				a.q[32*i+j] = int8(blk[2+j])
			}
		}
	case Q8_K:
		for i := range a.d {
			blk := b[q8KBytes*i:]
			a.d[i] = math.Float32frombits(binary.LittleEndian.Uint32(blk[q8KD:]))
			for j := 0; j < QK_K; j++ {
				a.q[QK_K*i+j] = int8(blk[q8KQs+j])
			}
			for j := 0; j < 16; j++ {
				a.bsums[16*i+j] = int16(binary.LittleEndian.Uint16(blk[q8KBsums+2*j:]))
			}
		}
	}
	return nil
}

// AppendBytes appends ggml's encoding of the activation to dst.
func (a *Activation) AppendBytes(dst []byte) []byte {
	switch a.t {
	case F32:
		for _, v := range a.f {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	case F16:
		for _, v := range a.f {
			dst = binary.LittleEndian.AppendUint16(dst, F32ToF16(v))
		}
	case BF16:
		for _, v := range a.f {
			dst = binary.LittleEndian.AppendUint16(dst, F32ToBF16(v))
		}
	case Q8_0:
		for i, d := range a.d {
			dst = binary.LittleEndian.AppendUint16(dst, F32ToF16(d))
			for _, q := range a.q[32*i : 32*i+32] {
				dst = append(dst, byte(q))
			}
		}
	case Q8_K:
		for i, d := range a.d {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(d))
			for _, q := range a.q[QK_K*i : QK_K*i+QK_K] {
				dst = append(dst, byte(q))
			}
			for _, s := range a.bsums[16*i : 16*i+16] {
				dst = binary.LittleEndian.AppendUint16(dst, uint16(s))
			}
		}
	}
	return dst
}

// nearestInt rounds f to the nearest integer, ties to even, like ggml's
// nearest_int (valid for |f| < 2^22; larger values give garbage, not a panic).
func nearestInt(f float32) int32 {
	v := f + 12582912 // 1.5 * 2^23
	return int32(math.Float32bits(v)&0x7fffff) - 0x400000
}

func clampI8(v int32) int8 {
	if v > 127 {
		return 127
	}
	if v < -128 {
		return -128
	}
	return int8(v)
}

// quantQ8_0Act quantizes 32 values as ggml's AVX/AVX2 quantize_row_q8_0 does
// and returns the f16-rounded scale as float32.
func quantQ8_0Act(x *[32]float32, q *[32]int8) float32 {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	dh := F32ToF16(amax / 127)
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	for i, v := range x {
		q[i] = clampI8(nearestInt(v * id))
	}
	return F16ToF32(dh)
}

// quantQ8KBlock quantizes 256 values as ggml's quantize_row_q8_K_ref does
// and returns the block scale.
func quantQ8KBlock(x *[QK_K]float32, q *[QK_K]int8, bsums *[16]int16) float32 {
	var amax, mx float32
	for _, v := range x {
		if av := abs32(v); av > amax {
			amax, mx = av, v
		}
	}
	if amax == 0 {
		*q = [QK_K]int8{}
		*bsums = [16]int16{}
		return 0
	}
	iscale := -127 / mx
	for i, v := range x {
		q[i] = clampI8(min(127, nearestInt(iscale*v)))
	}
	for j := range bsums {
		var s int16
		for _, v := range q[16*j : 16*j+16] {
			s += int16(v)
		}
		bsums[j] = s
	}
	return 1 / iscale
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
