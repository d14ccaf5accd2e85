package cuda

import (
	"encoding/binary"
	"fmt"
	"time"

	"ds4go/engine"
)

// Greedy decode without a host round trip (engine.GreedyPipeliner). A
// decode step's head ends with Argmax, which writes its choice into the
// batch's token slot on the device, and a 4-byte copy of it to pinned
// memory with an event; the next step's EmbedGreedy reads the slot, so the
// host queues step k+1 (its graph segments) while the GPU runs step k, and
// reads step k's token only afterwards (GreedyToken). The gap between two
// tokens' kernels no longer holds the logits' download, the host's argmax
// and the recording of the next step's first segment.

var _ engine.GreedyPipeliner = (*Backend)(nil)

// greedySlots bounds the HeadGreedy choices queued and not yet returned
// (the engine keeps at most two).
const greedySlots = 4

// greedyQueue is a batch's state for the greedy pipeline, made on first use.
type greedyQueue struct {
	logits   [2]Ptr // the latest two HeadGreedy's logits, [Vocab] f32 each (HeadGreedy k uses k % 2)
	work     Ptr    // Argmax's work area
	pin      []byte // pinned: the choices, 4 bytes a slot (HeadGreedy k uses k % greedySlots)
	ev       [greedySlots]Event
	heads    int  // HeadGreedy calls so far
	taken    int  // choices returned (or discarded by Embed)
	onDevice bool // b.tokens[0] holds the latest HeadGreedy's choice
}

func (q *greedyQueue) ready() bool { return q.work != 0 }

// init allocates the queue's buffers.
func (q *greedyQueue) init(d *Device, vocab int) error {
	var err error
	for i := range q.logits {
		if q.logits[i], err = d.Malloc(4 * int64(vocab)); err != nil {
			return err
		}
	}
	if q.work, err = d.Malloc(ArgmaxWork); err != nil {
		return err
	}
	if err := d.Upload(q.work, make([]byte, ArgmaxWork)); err != nil {
		return err
	}
	if q.pin, err = d.MallocHost(4 * greedySlots); err != nil {
		return err
	}
	for i := range q.ev {
		if q.ev[i], err = d.NewEvent(); err != nil {
			return err
		}
	}
	return nil
}

// release frees what init allocated (the batch's stream is idle).
func (q *greedyQueue) release(d *Device) {
	for _, p := range append(q.logits[:], q.work) {
		if p != 0 {
			d.Free(p)
		}
	}
	if q.pin != nil {
		d.FreeHost(q.pin)
	}
	for _, e := range q.ev {
		if e != 0 {
			d.DestroyEvent(e)
		}
	}
	*q = greedyQueue{}
}

// HeadGreedy is Head for the one row of a one-token chunk that keeps the
// logits on the device and queues their greedy choice (engine.GreedyPipeliner).
func (be *Backend) HeadGreedy(bi engine.Batch) error {
	b, err := be.oneTokenBatch(bi, "greedy")
	if err != nil {
		return err
	}
	q := &b.gq
	if q.heads-q.taken >= greedySlots {
		return fmt.Errorf("cuda: greedy head: %d choices already queued", q.heads-q.taken)
	}
	d := be.dev
	if err := b.readyQueue(q, "greedy head"); err != nil {
		return err
	}
	lg := q.logits[q.heads%2]
	if err := be.headRow(b, lg); err != nil {
		return err
	}
	if err := d.Argmax(b.s, lg, be.cfg.Vocab, q.work, b.tokens); err != nil {
		return err
	}
	// (its own graphs: the same shape with Head has one kernel fewer)
	b.g.shape = append(b.g.shape, 'G')
	if err := b.finish(); err != nil {
		return err
	}
	slot := q.heads % greedySlots
	if err := d.DownloadAsync(q.pin[4*slot:4*slot+4], b.tokens, b.s); err != nil {
		return err
	}
	if err := d.Record(q.ev[slot], b.s); err != nil {
		return err
	}
	q.heads++
	q.onDevice = true
	be.gstats.greedyHeads.Add(1)
	return b.stopProfiler()
}

// pipeQueue is what readyQueue makes of a batch's greedy or picked queue.
type pipeQueue interface {
	ready() bool
	init(d *Device, vocab int) error
	release(d *Device)
}

// readyQueue makes q on first use: the capture in progress flushed first
// (its allocations may wait for the device), q released again if it fails.
func (b *batch) readyQueue(q pipeQueue, what string) error {
	if q.ready() {
		return nil
	}
	if err := b.flush(); err != nil {
		return err
	}
	if err := q.init(b.be.dev, b.be.cfg.Vocab); err != nil {
		q.release(b.be.dev)
		return fmt.Errorf("cuda: %s: %w", what, err)
	}
	return nil
}

// headRow queues the head of a one-token chunk's row into out (Vocab
// floats on the device): Head's work for that row, the logits left on the
// device.
func (be *Backend) headRow(b *batch, out Ptr) error {
	if err := be.headIn(b, &be.head); err != nil {
		return err
	}
	return be.linear(b, b.headIn, be.cfg.Embed, 1, linJob{w: be.out, y: out, ldy: be.cfg.Vocab})
}

// stopProfiler ends the profiling of the chunk the profiler was armed for
// (Backend.profileAt) once its work is done.
func (b *batch) stopProfiler() error {
	if !b.profiling {
		return nil
	}
	b.profiling = false
	if err := b.be.dev.SyncStream(b.s); err != nil {
		return err
	}
	return b.be.dev.Profiler(false)
}

// EmbedGreedy is Embed of one token at pos: the latest HeadGreedy's choice,
// read on the device (engine.GreedyPipeliner).
func (be *Backend) EmbedGreedy(bi engine.Batch, pos int) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if !b.gq.onDevice {
		return fmt.Errorf("cuda: greedy embed: no greedy choice on the device")
	}
	return be.embed(b, pos, 1, nil)
}

// GreedyToken waits for the oldest queued greedy choice not yet returned
// and returns it (engine.GreedyPipeliner).
func (be *Backend) GreedyToken(bi engine.Batch) (int32, error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return 0, err
	}
	q := &b.gq
	if q.taken >= q.heads {
		return 0, fmt.Errorf("cuda: greedy token: none queued")
	}
	slot := q.taken % greedySlots
	t0 := time.Now()
	if err := be.dev.SyncEvent(q.ev[slot]); err != nil {
		return 0, err
	}
	be.gstats.waitNs.Add(int64(time.Since(t0)))
	q.taken++
	return int32(binary.LittleEndian.Uint32(q.pin[4*slot:])), nil
}

// GreedyLogits waits for the batch's work and copies the logits of the
// latest HeadGreedy (back 0) or of the one before (back 1) into dst
// (engine.GreedyPipeliner).
func (be *Backend) GreedyLogits(bi engine.Batch, back int, dst []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	q := &b.gq
	V := be.cfg.Vocab
	k := q.heads - 1 - back
	if back < 0 || back > 1 || k < 0 {
		return fmt.Errorf("cuda: greedy logits %d back: %d heads queued", back, q.heads)
	}
	if len(dst) < V {
		return fmt.Errorf("cuda: greedy logits: %d values for a vocabulary of %d", len(dst), V)
	}
	if err := be.dev.SyncStream(b.s); err != nil {
		return err
	}
	return DownloadSlice(be.dev, dst[:V], q.logits[k%2])
}
