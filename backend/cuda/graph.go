package cuda

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Graph decode. The work of a one-token chunk (or a two-token pass of
// speculative decoding), Embed to Head, runs as CUDA graphs (one per Options.GraphLayers layers) instead of kernel by kernel:
// the GPU runs the ≈ 45 kernels of a layer back to back while the host
// records the next layer.
//
// The ops run every token (positions and row counts are kernel arguments),
// but their work is recorded rather than captured (cuda/replay.cu): the
// library logs each kernel and its arguments, and at the end of a segment
// runs the log as the executable graph kept from an earlier token of the
// same shape, setting in place only the kernel nodes whose arguments
// changed; a log of another structure is captured into a new graph. The
// shape is the sequence of host decisions that add or remove kernels (a
// compressor completing a row, the indexer starting to score), recorded as
// the ops run; each shape keeps its own executable graph.
// Options.Recapture captures every token instead and updates the kept graph
// with cudaGraphExecUpdate (the way before recording; for comparison).
//
// Anything that must synchronise with the host in the middle of a token
// (a scratch buffer or row table growing, an activation read by a tracer)
// first flushes: it ends the recording (or capture) and launches its work, and
// the rest of the token runs as plain launches. The kernels and their
// arguments are the same either way, so the results are bit-identical.
type graphDecode struct {
	capturing bool // recording or capturing a segment
	shape     []byte
	execs     map[string]Graph  // Options.Recapture
	rec       Recorder          // the batch's recorder, created on first use
	rgraphs   map[string]RGraph // recorded graphs by shape
	began     time.Time         // when the current segment began
}

// graphCounters are a backend's graph-decode counters, over all batches.
type graphCounters struct {
	captures, updates, instantiates, flushes, segments atomic.Int64
	replays, nodeSets                                  atomic.Int64
	hostNs, waitNs                                     atomic.Int64
	greedyHeads, pickedHeads, pickAhead, pickDropped   atomic.Int64
	pickOverflows                                      atomic.Int64
	rebuilds                                           atomic.Int64
	specHeads                                          atomic.Int64
	buildNs                                            atomic.Int64
}

// GraphStats counts what graph decode did.
type GraphStats struct {
	Captures     int64 // tokens whose work was captured
	Updates      int64 // executable graphs updated in place (Options.Recapture)
	Instantiates int64 // executable graphs built (new shape or structure)
	Replays      int64 // recorded segments run by setting changed kernel nodes
	NodeSets     int64 // kernel nodes set in place by those replays
	Flushes      int64 // captures ended early by a synchronising step
	Segments     int64 // graphs launched (a token is one or more segments)
	// HostNs is the host time spent capturing, updating and launching;
	// WaitNs the time Head then waited for the GPU.
	HostNs, WaitNs int64
	// GreedyHeads counts the decode steps whose greedy choice was made on
	// the device (HeadGreedy).
	GreedyHeads int64
	// PickedHeads counts the decode steps queued before the host chose
	// their tokens whose logits the host took (PickedLogits).
	PickedHeads int64
	// PickAhead counts the steps queued before their tokens were known
	// (EmbedPicked), PickDropped those of them dropped because an op had
	// to wait for the device (engine.ErrPickAhead; run again after the draw).
	PickAhead, PickDropped int64
	// PickOverflows counts the steps with more min-p candidates than
	// HeadPicked sends (their logits fetched whole).
	PickOverflows int64
	// Rebuilds counts the recorded segments whose shape had a graph
	// already but whose work differed in structure (kernels, order,
	// streams, events), so that it was built again: in steady decode a
	// per-step choice missing from the shape (batch.mark) rebuilds graphs
	// every step, correct but slow (cuda/NOTES.md v42: 2815 builds in 128
	// tokens, −20 %).
	Rebuilds int64
	// SpecHeads counts the speculative passes whose greedy choices were
	// made on the device (HeadVerify).
	SpecHeads int64
	// BuildNs is the host time spent in the launches of recorded segments
	// that built an executable graph (Instantiates without
	// Options.Recapture: the graph's creation, instantiation and launch),
	// part of HostNs.
	BuildNs int64
}

// GraphStats returns the backend's graph-decode counters, over all its
// batches since it was created.
func (be *Backend) GraphStats() GraphStats {
	c := &be.gstats
	return GraphStats{c.captures.Load(), c.updates.Load(), c.instantiates.Load(), c.replays.Load(),
		c.nodeSets.Load(), c.flushes.Load(), c.segments.Load(), c.hostNs.Load(), c.waitNs.Load(), c.greedyHeads.Load(),
		c.pickedHeads.Load(), c.pickAhead.Load(), c.pickDropped.Load(), c.pickOverflows.Load(), c.rebuilds.Load(),
		c.specHeads.Load(), c.buildNs.Load()}
}

// graphMaxTokens is the largest chunk whose work runs as graphs: a decode
// step, or speculative decoding's pass of a token and its drafts (up to
// three: passTokensMax).
const graphMaxTokens = passTokensMax

// beginGraph starts recording the chunk's work (at most graphMaxTokens
// tokens, graphs on).
func (b *batch) beginGraph() error {
	if err := b.startSegment(); err != nil {
		return err
	}
	b.be.gstats.captures.Add(1)
	return nil
}

// startSegment starts recording (or capturing) a segment of the token.
func (b *batch) startSegment() error {
	d := b.be.dev
	if b.be.opts.Recapture {
		if err := d.BeginCapture(b.s); err != nil {
			return err
		}
	} else {
		if b.g.rec == 0 {
			r, err := d.NewRecorder(b.s, b.side, b.side2)
			if err != nil {
				return err
			}
			b.g.rec = r
		}
		if err := d.RecordBegin(b.g.rec); err != nil {
			return err
		}
	}
	b.g.capturing = true
	b.g.shape = b.g.shape[:0]
	if b.n > 1 {
		b.g.shape = append(b.g.shape, 'n', byte(b.n)) // the token count is the kernels' structure too
	}
	b.g.began = time.Now()
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
	if b.pq.waiting {
		return nil // a picked step is launched whole (picked.go)
	}
	// Each segment keeps its own executable graphs: layers of one kind
	// share a topology but not always kernel functions.
	b.g.shape = append(b.g.shape, 'L', byte(layer), byte(layer>>8))
	b.g.capturing = false
	if err := b.launchCaptured(true); err != nil {
		return err
	}
	return b.startSegment()
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
// capture forked onto the side streams is joined first (a capture must end
// joined) and forked again after the launch, so that the side streams'
// later work still follows everything before it.
func (b *batch) flush() error {
	if !b.g.capturing {
		return nil
	}
	if err := b.pickBlocked("a synchronising step"); err != nil {
		return err
	}
	forked, forked2 := b.forked, b.forked2
	if err := b.joinAll(); err != nil {
		return err
	}
	b.g.capturing = false
	b.flushes++
	if err := b.launchCaptured(false); err != nil {
		return err
	}
	if forked {
		if err := b.fork(); err != nil {
			return err
		}
	}
	if forked2 {
		return b.fork2()
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
	if !b.be.opts.Recapture {
		return b.launchRecorded(key)
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

// launchRecorded runs the recorded segment as the graph of its shape.
func (b *batch) launchRecorded(key string) error {
	if b.g.rgraphs == nil {
		b.g.rgraphs = map[string]RGraph{}
	}
	g := b.g.rgraphs[key]
	had := g != 0
	t0 := time.Now()
	st, err := b.be.dev.RecordLaunch(b.g.rec, &g)
	if g != 0 {
		b.g.rgraphs[key] = g
	}
	if err != nil {
		return fmt.Errorf("cuda: graph decode: %w", err)
	}
	c := &b.be.gstats
	if st.Built {
		c.instantiates.Add(1)
		c.buildNs.Add(int64(time.Since(t0)))
		if had {
			c.rebuilds.Add(1)
		}
	} else {
		c.replays.Add(1)
		c.nodeSets.Add(int64(st.Updated))
	}
	c.segments.Add(1)
	c.hostNs.Add(int64(time.Since(b.g.began)))
	return nil
}

// abortGraph drops a capture or recording left open by a chunk that failed.
func (b *batch) abortGraph() {
	_ = b.joinAll()
	if b.g.capturing {
		b.g.capturing = false
		if b.be.opts.Recapture {
			b.be.dev.AbortCapture(b.s)
		} else {
			b.be.dev.RecordAbort(b.g.rec)
		}
	}
}

func (b *batch) releaseGraphs() {
	b.abortGraph()
	for _, g := range b.g.execs {
		b.be.dev.DestroyGraph(g)
	}
	b.g.execs = nil
	for _, g := range b.g.rgraphs {
		b.be.dev.DestroyRGraph(g)
	}
	b.g.rgraphs = nil
	if b.g.rec != 0 {
		b.be.dev.DestroyRecorder(b.g.rec)
		b.g.rec = 0
	}
}
