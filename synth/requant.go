package synth

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
)

// Requantize returns the model in f stored in another scheme: every tensor
// is decoded to f32 and encoded again in the type the scheme gives its role
// (quant.Quantize, ggml's reference quantizers); the metadata is kept, with
// KeyScheme set to the new scheme's name. Requantizing an F32 model gives
// quantized models of the very same float weights (Build with another
// Scheme draws different weights), which is what measuring a quantization's
// error needs. For small models: the whole file is built in memory.
func Requantize(f *gguf.File, scheme model.Scheme) ([]byte, error) {
	cfg, err := model.ConfigFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("synth: requantize: %w", err)
	}
	typed, err := scheme.Typed(model.ExpectedTensors(&cfg))
	if err != nil {
		return nil, fmt.Errorf("synth: requantize: %w", err)
	}
	b := gguf.FromFile(f)
	hasScheme := false
	for i := range b.KVs {
		if b.KVs[i].Key == KeyScheme {
			b.KVs[i].Value, hasScheme = gguf.Str(scheme.Name), true
		}
	}
	if !hasScheme {
		b.Add(KeyScheme, gguf.Str(scheme.Name))
	}
	b.Tensors = typed
	// Encode the tensors in parallel (the block quantizers are slow), then
	// write them in order.
	out := make([][]byte, len(typed))
	errs := make([]error, len(typed))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(typed)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var vals []float32
			for {
				i := int(next.Add(1) - 1)
				if i >= len(typed) {
					return
				}
				out[i], vals, errs[i] = requantTensor(f, &typed[i], vals)
			}
		}()
	}
	wg.Wait()
	var buf bytes.Buffer
	err = b.Write(&buf, func(i int) ([]byte, error) { return out[i], errs[i] })
	if err != nil {
		return nil, fmt.Errorf("synth: requantize to %s: %w", scheme.Name, err)
	}
	return buf.Bytes(), nil
}

// requantTensor encodes one tensor of f in spec's type (vals is scratch).
func requantTensor(f *gguf.File, spec *gguf.TensorSpec, vals []float32) ([]byte, []float32, error) {
	src, ok := f.Tensor(spec.Name)
	if !ok {
		return nil, vals, fmt.Errorf("not in the source file")
	}
	data := f.TensorData(src)
	if src.Type == spec.Type {
		return data, vals, nil
	}
	n := int(src.Elements())
	if cap(vals) < n {
		vals = make([]float32, n)
	}
	vals = vals[:n]
	if err := quant.Dequantize(src.Type, data, vals); err != nil {
		return nil, vals, err
	}
	out := make([]byte, uint64(n)/uint64(spec.Type.BlockSize())*uint64(spec.Type.BlockBytes()))
	if err := quant.Quantize(spec.Type, vals, out); err != nil {
		return nil, vals, err
	}
	return out, vals, nil
}
