package synth

import (
	"testing"

	"ds4go/model"
	"ds4go/quant"
)

func BenchmarkFill(b *testing.B) {
	p := &plan{opts: &Options{}}
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q2_K, quant.Q4_K, quant.IQ2_XXS, quant.F16, quant.F32} {
		b.Run(typ.String(), func(b *testing.B) {
			buf := make([]byte, chunkTarget/typ.BlockBytes()*typ.BlockBytes())
			r := &rng{s: 1}
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				p.fillMatrix(r, typ, 0.02, buf)
			}
		})
	}
}

func BenchmarkBuildTiny(b *testing.B) {
	for b.Loop() {
		if _, err := Build(Options{Config: Tiny(), Scheme: model.SchemeQ8}); err != nil {
			b.Fatal(err)
		}
	}
}
