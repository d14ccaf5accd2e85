package cuda

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Graph decode. The work of a one-token chunk, Embed to Head, is captured
// into a CUDA graph on the batch's stream instead of being launched kernel
// by kernel, and the graph is launched once from Head: the host pays a
// capture record per kernel instead of a launch, and the GPU runs the
// ≈ 60 kernels of a layer back to back.
//
// Every token is captured again (positions and row counts are kernel
// arguments), and the capture updates an executable graph kept from an
// earlier token of the same shape in place (cudaGraphExecUpdate), which
// costs far less than instantiating one. The shape is the sequence of host
// decisions that add or remove kernels (a compressor completing a row, the
// indexer starting to score), recorded as the ops run; each shape keeps its
// own executable graph.
//
// Anything that must synchronise with the host in the middle of a token
// (a scratch buffer or row table growing, an activation read by a tracer)
// first flushes: it ends the capture and launches what was recorded, and
// the rest of the token runs as plain launches. The kernels and their
// arguments are the same either way, so the results are bit-identical.
type graphDecode struct {
	capturing bool
	shape     []byte
	execs     map[string]Graph
	began     time.Time // when the current capture began
}

// graphCounters are a backend's graph-decode counters, over all batches.
type graphCounters struct {
	captures, updates, instantiates, flushes, segments atomic.Int64
	hostNs, waitNs                                     atomic.Int64
}

// GraphStats counts what graph decode did.
type GraphStats struct {
	Captures     int64 // tokens whose work was captured
	Updates      int64 // executable graphs updated in place
	Instantiates int64 // executable graphs built (new shape or failed update)
	Flushes      int64 // captures ended early by a synchronising step
	Segments     int64 // graphs launched (a token is one or more segments)
	// HostNs is the host time spent capturing, updating and launching;
	// WaitNs the time Head then waited for the GPU.
	HostNs, WaitNs int64
}

// GraphStats returns the backend's graph-decode counters, over all its
// batches since it was created.
func (be *Backend) GraphStats() GraphStats {
	c := &be.gstats
	return GraphStats{c.captures.Load(), c.updates.Load(), c.instantiates.Load(), c.flushes.Load(),
		c.segments.Load(), c.hostNs.Load(), c.waitNs.Load()}
}

// beginGraph starts capturing the chunk's work (one token, graphs on).
func (b *batch) beginGraph() error {
	if err := b.be.dev.BeginCapture(b.s); err != nil {
		return err
	}
	b.g.capturing = true
	b.g.shape = b.g.shape[:0]
	b.g.began = time.Now()
	b.be.gstats.captures.Add(1)
	return nil
}

// segment ends the current graph after a layer and starts the next one, so
// that the GPU runs a layer while the host captures the next
// (Options.GraphLayers).
func (b *batch) segment(layer int) error {
	k := b.be.opts.GraphLayers
	if !b.g.capturing || k <= 0 || (layer+1)%k != 0 || layer+1 >= b.be.cfg.Layers {
		return nil
	}
	// Each segment keeps its own executable graphs: layers of one kind
	// share a topology but not always kernel functions.
	b.g.shape = append(b.g.shape, 'L', byte(layer), byte(layer>>8))
	b.g.capturing = false
	if err := b.launchCaptured(true); err != nil {
		return err
	}
	if err := b.be.dev.BeginCapture(b.s); err != nil {
		return err
	}
	b.g.capturing = true
	b.g.shape = b.g.shape[:0]
	b.g.began = time.Now()
	return nil
}

// markRatio records the compression ratio of the layer being captured
// (segments of different layer kinds have different shapes).
func (b *batch) markRatio(r int) {
	if b.g.capturing {
		b.g.shape = append(b.g.shape, 'r', byte(r))
	}
}

// mark records a host decision that changes the captured graph's shape.
func (b *batch) mark(v bool) {
	if b.g.capturing {
		x := byte('0')
		if v {
			x = '1'
		}
		b.g.shape = append(b.g.shape, x)
	}
}

// flush ends the capture in progress, if any, and launches its work. A
// capture forked onto the side stream is joined first (a capture must end
// joined) and forked again after the launch, so that the side stream's
// later work still follows everything before it.
func (b *batch) flush() error {
	if !b.g.capturing {
		return nil
	}
	forked := b.forked
	if err := b.join(); err != nil {
		return err
	}
	b.g.capturing = false
	if err := b.launchCaptured(false); err != nil {
		return err
	}
	if forked {
		return b.fork()
	}
	return nil
}

// finish ends the capture at the end of the chunk (Head) and launches it.
func (b *batch) finish() error {
	if !b.g.capturing {
		return nil
	}
	b.g.capturing = false
	return b.launchCaptured(true)
}

func (b *batch) launchCaptured(whole bool) error {
	d := b.be.dev
	key := string(b.g.shape)
	if !whole {
		key = "partial:" + key
		b.be.gstats.flushes.Add(1)
	}
	if b.g.execs == nil {
		b.g.execs = map[string]Graph{}
	}
	g := b.g.execs[key]
	how, err := d.EndCaptureUpdate(b.s, &g)
	if g != 0 {
		b.g.execs[key] = g
	} else {
		delete(b.g.execs, key)
	}
	if err != nil {
		return fmt.Errorf("cuda: graph decode: %w", err)
	}
	if how == 1 {
		b.be.gstats.updates.Add(1)
	} else {
		b.be.gstats.instantiates.Add(1)
	}
	if err := d.Launch(g, b.s); err != nil {
		return fmt.Errorf("cuda: graph decode: %w", err)
	}
	b.be.gstats.segments.Add(1)
	b.be.gstats.hostNs.Add(int64(time.Since(b.g.began)))
	return nil
}

// abortGraph drops a capture left open by a chunk that failed.
func (b *batch) abortGraph() {
	if b.forked {
		_ = b.join()
	}
	if b.g.capturing {
		b.g.capturing = false
		b.be.dev.AbortCapture(b.s)
	}
}

func (b *batch) releaseGraphs() {
	b.abortGraph()
	for _, g := range b.g.execs {
		b.be.dev.DestroyGraph(g)
	}
	b.g.execs = nil
}
