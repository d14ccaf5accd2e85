package cuda

import (
	"fmt"

	"ds4go/quant"
)

// Weight is a weight tensor resident on the device in the library's layout:
// Mats matrices (experts; 1 for a 2-D tensor) of Rows rows of Cols values.
type Weight struct {
	Type             quant.Type
	Rows, Cols, Mats int
	Ptr              Ptr
	Bytes            int64
	// Half, when set, is an f16 copy of a Q8_0 tensor's values (HalfCopy),
	// which MatMulHalf and MatMulHalfH multiply instead of converting the
	// quants before each product (the same f16 values, the same bits).
	Half Ptr
}

// HalfCopy makes w.Half, the f16 copy of a Q8_0 tensor (2 bytes a value),
// converted on the device as MatMulHalf converts before each product; it
// returns after the copy is made.
func (d *Device) HalfCopy(w *Weight) error {
	if w.Type != quant.Q8_0 || w.Ptr == 0 {
		return fmt.Errorf("cuda: half copy of a %v tensor", w.Type)
	}
	if w.Half != 0 {
		return nil
	}
	rows := int64(w.Rows) * int64(w.Mats)
	p, err := d.Malloc(2 * rows * int64(w.Cols))
	if err != nil {
		return err
	}
	if err := d.l.call("q8_0_to_half", func() int32 { return d.l.q8ToHalf(uintptr(w.Ptr), rows, int64(w.Cols), uintptr(p), 0) }); err != nil {
		d.Free(p)
		return err
	}
	if err := d.Synchronize(); err != nil {
		d.Free(p)
		return err
	}
	w.Half = p
	return nil
}

// WeightBytes is the device size of a tensor of rows x cols values of type t
// (the GGUF size); 0 if the library cannot hold that type or shape.
func (d *Device) WeightBytes(t quant.Type, rows, cols int) int64 {
	return int64(d.l.weightBytes(int32(t), int64(rows), int64(cols)))
}

// stagingBytes bounds the device staging buffer of UploadWeight.
const stagingBytes = 64 << 20

// UploadWeight allocates a device tensor and fills it from data, the GGUF
// bytes of mats matrices of rows x cols values of type t (row-major, matrix
// after matrix), converting them into the device layout. It returns after
// the data is on the device.
func (d *Device) UploadWeight(t quant.Type, rows, cols, mats int, data []byte) (*Weight, error) {
	if rows <= 0 || cols <= 0 || mats <= 0 {
		return nil, fmt.Errorf("cuda: weight shape %dx%dx%d", mats, rows, cols)
	}
	total := rows * mats
	n := d.WeightBytes(t, total, cols)
	if n == 0 {
		return nil, fmt.Errorf("cuda: weights of type %s and %d columns are not supported", t, cols)
	}
	if int64(len(data)) != n {
		return nil, fmt.Errorf("cuda: %s weight %dx%dx%d needs %d bytes, got %d", t, mats, rows, cols, n, len(data))
	}
	p, err := d.Malloc(n)
	if err != nil {
		return nil, err
	}
	w := &Weight{Type: t, Rows: rows, Cols: cols, Mats: mats, Ptr: p, Bytes: n}
	if err := d.fillWeight(w, data); err != nil {
		d.Free(p)
		return nil, err
	}
	return w, nil
}

func (d *Device) fillWeight(w *Weight, data []byte) error {
	bb := int64(w.Type.BlockBytes())
	nblocks := int64(len(data)) / bb
	chunk := max(1, stagingBytes/bb)
	stage, err := d.Malloc(min(nblocks, chunk) * bb)
	if err != nil {
		return err
	}
	defer d.Free(stage)
	total := int64(w.Rows) * int64(w.Mats)
	for first := int64(0); first < nblocks; first += chunk {
		nb := min(chunk, nblocks-first)
		if err := d.Upload(stage, data[first*bb:(first+nb)*bb]); err != nil {
			return err
		}
		if err := d.l.call("weight_repack", func() int32 {
			return d.l.weightRepack(int32(w.Type), uintptr(w.Ptr), total, int64(w.Cols), uintptr(stage), first, nb, 0)
		}); err != nil {
			return err
		}
	}
	return d.Synchronize()
}

// FreeWeight releases a weight's device memory.
func (d *Device) FreeWeight(w *Weight) error {
	if w == nil || w.Ptr == 0 {
		return nil
	}
	err := d.Free(w.Ptr)
	w.Ptr = 0
	if w.Half != 0 {
		if e := d.Free(w.Half); err == nil {
			err = e
		}
		w.Half = 0
	}
	return err
}

// MatrixBytes is the device size of one matrix of w.
func (w *Weight) MatrixBytes() int64 { return w.Bytes / int64(w.Mats) }

// ActType returns the activation format products with weights of type t
// consume (as quant.ActivationType: Q8_0, Q8_K or F32).
func (d *Device) ActType(t quant.Type) (quant.Type, error) {
	at := d.l.actType(int32(t))
	if at < 0 {
		return 0, fmt.Errorf("cuda: no product for weights of type %s", t)
	}
	return quant.Type(at), nil
}

// actKey is an activation format and row length (Device.actBytes).
type actKey struct {
	t    quant.Type
	cols int
}

// ActBytes is the device size of one activation row of cols values in
// format t (a multiple of 16), or 0 for an unsupported format or length.
func (d *Device) ActBytes(t quant.Type, cols int) int64 {
	k := actKey{t, cols}
	if v, ok := d.actBytes.Load(k); ok {
		return v.(int64)
	}
	n := int64(d.l.actBytes(int32(t), int64(cols)))
	d.actBytes.Store(k, n)
	return n
}

// Quantize converts ntok rows of cols float32 values at x (row stride
// xStride floats; 0 means cols) into activation rows of format t at act
// (stride ActBytes(t, cols)), on stream s.
func (d *Device) Quantize(s Stream, t quant.Type, x Ptr, xStride int, act Ptr, cols, ntok int) error {
	return d.l.call("quantize", func() int32 {
		return d.l.quantize(int32(t), uintptr(x), int64(xStride), uintptr(act), int64(cols), int32(ntok), uintptr(s))
	})
}

// MatMul computes y[t*yStride + r] = W0[r] · act_t for the rows r of the
// first matrix of w and ntok activation rows at act (actStride bytes apart;
// 0 means ActBytes), on stream s. yStride 0 means w.Rows.
func (d *Device) MatMul(s Stream, w *Weight, act Ptr, actStride int64, ntok int, y Ptr, yStride int) error {
	return d.l.call("matmul", func() int32 {
		return d.l.matmul(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), uintptr(act),
			actStride, int32(ntok), uintptr(y), int64(yStride), uintptr(s))
	})
}

// HalfOK reports whether MatMulHalf takes weights of type t with inputs of
// type xt (F16: ToHalf's rows; F32: floats, on the TF32 tensor cores) for
// ntok tokens (OptHalfMM and OptHalfMin; cuBLAS found).
func (d *Device) HalfOK(t, xt quant.Type, ntok int) bool {
	return d.l.halfOK(int32(t), int32(xt), int32(ntok)) == 1
}

// HalfWarm loads cuBLAS and initialises it (a handle made, one small GEMM,
// the handle released), so that the first MatMulHalf does not pay for it;
// it reports whether cuBLAS is there.
func (d *Device) HalfWarm() bool { return d.l.halfWarm() == 1 }

// ToHalf writes ntok rows of cols floats at x (xStride floats apart) as f16
// rows at xh (cols apart), on stream s; finite magnitudes beyond f16's
// range saturate at 65504.
func (d *Device) ToHalf(s Stream, x Ptr, xStride, cols, ntok int, xh Ptr) error {
	return d.l.call("to_half", func() int32 {
		return d.l.toHalf(uintptr(x), int64(xStride), int64(cols), int32(ntok), uintptr(xh), uintptr(s))
	})
}

// ToHalfAs is ToHalf writing the rows in layout lay (HalfRows: as ToHalf;
// HalfPerm32: each 32-value block permuted for the RS form of
// MatMulGroupedHalf; cols a multiple of 32, xStride even, x 8-byte and xh
// 16-byte aligned).
func (d *Device) ToHalfAs(s Stream, x Ptr, xStride, cols, ntok int, xh Ptr, lay HalfLayout) error {
	if lay != HalfPerm32 {
		return d.ToHalf(s, x, xStride, cols, ntok, xh)
	}
	return d.l.call("to_half_ex", func() int32 {
		return d.l.toHalfEx(uintptr(x), int64(xStride), int64(cols), int32(ntok), uintptr(xh), 1, uintptr(s))
	})
}

// MatMulHalf is fast mode's product of a chunk through cuBLAS (f32 sums;
// HalfOK says which it takes): for i < nsel (1, or w.Mats: selection i
// through matrix i) and t < ntok, y[i*ySel + t*yTok + r] = W_i[r] · x(i, t),
// with x(i, t) the row of type xt at element i*xSel + t*xTok of x: f16
// (ToHalf's output; Q8_0 weights are rounded to f16 on the way, q·d once)
// or float (F16 weights; both operands on the TF32 tensor cores).
func (d *Device) MatMulHalf(s Stream, w *Weight, nsel int, x Ptr, xt quant.Type, xTok, xSel int64, ntok int, y Ptr, yTok, ySel int64) error {
	t, p := d.halfOperand(w, xt, ntok)
	return d.l.call("matmul_half", func() int32 {
		return d.l.matmulHalf(int32(t), uintptr(p), int64(w.Rows), int64(w.Cols), int64(w.Mats), int32(nsel),
			uintptr(x), int32(xt), xTok, xSel, int32(ntok), uintptr(y), yTok, ySel, uintptr(s))
	})
}

// halfOperand is the weights MatMulHalf hands the library for w: its f16
// copy, where it has one, the inputs are f16 (the only ones the library
// multiplies Q8_0 weights by) and the library takes F16 weights with them,
// else w itself.
func (d *Device) halfOperand(w *Weight, xt quant.Type, ntok int) (quant.Type, Ptr) {
	if w.Half != 0 && w.Type == quant.Q8_0 && xt == quant.F16 && d.HalfOK(quant.F16, quant.F16, ntok) {
		return quant.F16, w.Half
	}
	return w.Type, w.Ptr
}

// MatMulHalfH is MatMulHalf with f16 inputs (xt F16) and f16 outputs yh
// (strides in halves): the f32 sums rounded to nearest by cuBLAS, without
// ToHalf's saturation (a magnitude beyond 65504 becomes infinite).
func (d *Device) MatMulHalfH(s Stream, w *Weight, nsel int, x Ptr, xTok, xSel int64, ntok int, yh Ptr, yTok, ySel int64) error {
	t, p := d.halfOperand(w, quant.F16, ntok)
	return d.l.call("matmul_half_h", func() int32 {
		return d.l.matmulHalfH(int32(t), uintptr(p), int64(w.Rows), int64(w.Cols), int64(w.Mats), int32(nsel),
			uintptr(x), int32(quant.F16), xTok, xSel, int32(ntok), uintptr(yh), yTok, ySel, uintptr(s))
	})
}

// MatVecIDs computes, for each of the nsel matrix indices (int32) at ids,
// y[i*yStride + r] = W_ids[i][r] · act_i, with act_i at act + i*actStride
// (actStride 0: one activation shared by all), on stream s. yStride 0
// means w.Rows. An index outside the tensor yields NaN rows.
func (d *Device) MatVecIDs(s Stream, w *Weight, ids Ptr, nsel int, act Ptr, actStride int64, y Ptr, yStride int) error {
	return d.l.call("matvec_ids", func() int32 {
		return d.l.matvecIDs(int32(w.Type), uintptr(w.Ptr), int64(w.Rows), int64(w.Cols), int64(w.Mats), uintptr(ids),
			int32(nsel), uintptr(act), actStride, uintptr(y), int64(yStride), uintptr(s))
	})
}

// RMSNorm sets y[r] = x[r] / sqrt(mean(x[r]²) + eps) * w for rows rows of n
// floats (w may be 0 for no weight); x and y may be the same.
func (d *Device) RMSNorm(s Stream, x, w, y Ptr, n, rows int, eps float32) error {
	return d.l.call("rmsnorm", func() int32 {
		return d.l.rmsnorm(uintptr(x), uintptr(w), uintptr(y), int64(n), int32(rows), eps, uintptr(s))
	})
}

// Softmax computes a softmax of each of rows rows of n floats.
func (d *Device) Softmax(s Stream, x, y Ptr, n, rows int) error {
	return d.l.call("softmax", func() int32 { return d.l.softmax(uintptr(x), uintptr(y), int64(n), int32(rows), uintptr(s)) })
}

// SwiGLU sets y = silu(min(g, clamp)) * clip(u, ±clamp) over n floats
// (clamp <= 0: no clamping).
func (d *Device) SwiGLU(s Stream, g, u, y Ptr, n int, clamp float32) error {
	return d.l.call("swiglu", func() int32 { return d.l.swiglu(uintptr(g), uintptr(u), uintptr(y), int64(n), clamp, uintptr(s)) })
}
