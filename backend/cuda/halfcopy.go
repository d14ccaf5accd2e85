package cuda

import (
	"fmt"
	"log/slog"
	"os"

	"ds4go/quant"
)

// halfCopyReserve is the device memory halfCopies leaves free after the
// copies, by default: a session's KV state, a prefill chunk's scratch and
// cuBLAS's pool (a 4096-token chunk of Flash takes ≈ 3 GB of scratch; the
// KV state of a million positions ≈ 15 GB).
const halfCopyReserve = 24 << 30

// halfCopies gives fast mode's Q8_0 tensors that chunks multiply through
// cuBLAS (MatMulHalf: those of at most halfMaxQ8 values) an f16 copy
// (Weight.Half), so that a chunk's products no longer convert their quants
// before each product (v48's trace charged the conversions ≈ 20 ms of a
// 256-token chunk's 110; the copies saved ≈ 5 ms of it, an 8k prompt ≈ 1 %:
// cuda/NOTES.md v49). The copies take 2 bytes a value (Flash q2: ≈ 11 GB).
// DS4_CUDA_HALF_COPY=0 makes none, 1 makes them whatever the memory left;
// by default they are made only when halfCopyReserve stays free after them.
// The products' bits are the same either way.
func (be *Backend) halfCopies() error {
	mode := os.Getenv("DS4_CUDA_HALF_COPY")
	switch mode {
	case "", "0", "1":
	default:
		return fmt.Errorf("cuda: DS4_CUDA_HALF_COPY=%q: want 0 (none), 1 (always) or unset (when the memory allows)", mode)
	}
	if mode == "0" || !be.dev.HalfOK(quant.F16, quant.F16, fastChunk) {
		return nil
	}
	var ws []*Weight
	var need int64
	for _, w := range be.weights {
		n := int64(w.Rows) * int64(w.Cols) * int64(w.Mats)
		if w.Type == quant.Q8_0 && n <= halfMaxQ8 && w.Cols%32 == 0 && w.Half == 0 {
			ws = append(ws, w)
			need += 2 * n
		}
	}
	if len(ws) == 0 {
		return nil
	}
	if free := int64(be.dev.Info().FreeMem); mode == "" && free-need < halfCopyReserve {
		slog.Info("cuda: Q8_0 weights converted at each chunk product (no f16 copies: too little device memory)",
			"copies_gb", float64(need)/(1<<30), "free_gb", float64(free)/(1<<30))
		return nil
	}
	for _, w := range ws {
		if err := be.dev.HalfCopy(w); err != nil {
			if mode == "1" {
				return fmt.Errorf("cuda: f16 copy of a %d×%d×%d Q8_0 tensor: %w", w.Mats, w.Rows, w.Cols, err)
			}
			for _, w := range ws { // all or none
				if w.Half != 0 {
					be.dev.Free(w.Half)
					w.Half = 0
				}
			}
			slog.Info("cuda: Q8_0 weights converted at each chunk product (the f16 copies failed)", "err", err)
			return nil
		}
	}
	slog.Info("cuda: f16 copies of the Q8_0 weights for prompt chunks (DS4_CUDA_HALF_COPY=0: none)", "tensors", len(ws), "gb", float64(need)/(1<<30))
	return nil
}
