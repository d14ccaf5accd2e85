package cuda

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"ds4go/engine"
)

// warmLayers lists one layer of each kind the model has — each distinct
// compression ratio with hash or learned routing — in layer order: the
// layers whose ops, between them, launch every kernel and every cuBLAS
// product shape a prefill chunk does.
func (be *Backend) warmLayers() []int {
	c := &be.cfg
	type kind struct {
		ratio int
		hash  bool
	}
	seen := map[kind]bool{}
	var ls []int
	for l := 0; l < c.Layers; l++ {
		k := kind{c.Ratio(l), c.IsHashLayer(l)}
		if !seen[k] {
			seen[k] = true
			ls = append(ls, l)
		}
	}
	return ls
}

// warmUp runs a prefill chunk of n tokens (ids spread over the vocabulary)
// at position 0, then a one-token step after it, through one layer of each
// kind (warmLayers) and the head, on a batch and state of its own that it
// releases: the one-time costs a fresh process would otherwise pay inside
// its first prompt — each kernel's module loaded at its first launch,
// cuBLAS's set-up and its kernels for the chunk's product shapes, the
// stream-ordered memory pool grown to a chunk's conversions — are paid
// here, for a few layers' worth of device time (Options.WarmUp; measured
// in cuda/NOTES.md v48). The weights are read, never written; the results
// are discarded.
func (be *Backend) warmUp(n int) error {
	t0 := time.Now()
	layout, err := engine.NewStateLayout(&be.cfg, n+1, 0)
	if err != nil {
		return err
	}
	st, err := be.NewState(layout)
	if err != nil {
		return err
	}
	defer st.Release()
	b, err := be.NewBatch(n)
	if err != nil {
		return err
	}
	defer b.Release()
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32((i*7919 + 1) % be.cfg.Vocab)
	}
	logits := make([]float32, be.cfg.Vocab)
	layers := be.warmLayers()
	ctx := context.Background()
	for _, chunk := range []struct{ pos, n int }{{0, n}, {n, 1}} {
		if err := be.Embed(b, chunk.pos, toks[:chunk.n]); err != nil {
			return err
		}
		for _, l := range layers {
			if err := engine.RunBlocks(ctx, be, b, st, l, l+1, chunk.pos, nil); err != nil {
				return err
			}
		}
		if err := be.Head(b, []int{chunk.n - 1}, logits); err != nil {
			return err
		}
	}
	if err := be.dev.Synchronize(); err != nil {
		return err
	}
	slog.Debug("cuda: warmed up", "tokens", n, "layers", fmt.Sprint(layers), "seconds", time.Since(t0).Seconds())
	return nil
}
