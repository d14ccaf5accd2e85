package cuda

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
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

// warmSmall is the size of the second chunk warmUp runs: an agent's turn
// after a cached prefix, whose products take other kernels than a full
// chunk's (the int8 experts' tiles of 32 slots, cuBLAS's choices for a
// narrow product). DS4_CUDA_WARM_SMALL=n sets another size, 0 none.
const warmSmall = 256

// warmSmallSize is warmSmall or DS4_CUDA_WARM_SMALL's value.
func warmSmallSize() (int, error) {
	return envCount("DS4_CUDA_WARM_SMALL", warmSmall, "a token count, 0 for none")
}

// envCount is the count environment variable name sets, def when it is
// unset, or an error naming what it wants when it is not a count (0 or
// more).
func envCount(name string, def int, want string) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("cuda: %s=%q: want %s", name, v, want)
	}
	return n, nil
}

// warmUp runs a prefill chunk of n tokens (ids spread over the vocabulary)
// at position 0, a chunk of warmSmall tokens after it when n is larger,
// then a one-token step, through one layer of each kind (warmLayers) and
// the head, on a batch and state of its own that it releases: the one-time
// costs a fresh process would otherwise pay inside its first prompts —
// each kernel's module loaded at its first launch, cuBLAS's set-up and its
// kernels for the chunks' product shapes, the stream-ordered memory pool
// grown to a chunk's conversions — are paid here, for a few layers' worth
// of device time (Options.WarmUp; measured in cuda/NOTES.md v48, v49). The
// weights are read, never written; the results are discarded.
func (be *Backend) warmUp(n int) error {
	t0 := time.Now()
	small, err := warmSmallSize()
	if err != nil {
		return err
	}
	type span struct{ pos, n int }
	chunks, end := []span{{0, n}}, n
	if small > 0 && small < n {
		chunks, end = append(chunks, span{n, small}), n+small
	}
	chunks = append(chunks, span{end, 1})
	layout, err := engine.NewStateLayout(&be.cfg, end+1, 0)
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
	for _, chunk := range chunks {
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
