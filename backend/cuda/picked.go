package cuda

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"ds4go/engine"
)

// Decode steps queued before the host has chosen their tokens
// (engine.PickPipeliner), for sampled decoding: the host draws each token
// from the previous step's logits, which it must download, so the device
// cannot choose it as in greedy.go. EmbedPicked records a step that begins
// with WaitToken: one thread polling a word of pinned host memory until the
// host publishes the step's token there (SupplyToken), which it writes to
// the batch's token slot for the embedding. HeadPicked ends the step with
// the logits' download to pinned memory and an event. So the host records
// and queues step k+1 while the device runs step k, and the device waits
// between tokens only for the download, the host's draw and the word's
// trip over the bus — not for the recording and launch of the next step.
//
// A step recorded this way is launched whole at HeadPicked (one graph, not
// one a layer): until the host publishes the token nothing after the wait
// can run, so nothing in the step may wait for the device. An op that would
// (a scratch buffer or a row table growing) finds the recording unlaunched,
// drops it and fails with engine.ErrPickAhead; the engine then runs that
// step after the draw, as an ordinary one.

var _ engine.PickPipeliner = (*Backend)(nil)

// pickTimeout is how long a queued step waits for its token before it gives
// up: it runs with token 0, and PickedLogits reports ErrPickTimeout, so that
// its work is discarded. Backend.pickTimeout overrides it (tests).
const pickTimeout = 30 * time.Second

// pickCandCap bounds the min-p candidates HeadPicked sends (more: the
// logits are fetched whole, PickedAll). A language model's logits leave a
// few to a few hundred; flat ones (the synthetic models') ≈ 8 % of the
// vocabulary.
const pickCandCap = 16384

// pickQueue is a batch's state for picked decode steps, made on first use.
type pickQueue struct {
	logits  Ptr                   // the head's logits on the device, [Vocab] f32
	work    Ptr                   // PickCandidates' argmax work area
	top     Ptr                   // … its greedy choice (int32)
	counts  Ptr                   // … its counts (CandidateCTAs words)
	cand    Ptr                   // … its output (CandidateWords(pickCandCap) words)
	filt    [2]*engine.PickFilter // HeadPicked k's filter: filt[k % 2]
	last    int                   // the slot PickedLogits returned last
	copyS   Stream                // PickedAll's copies (made on first use)
	host    [2][]byte             // pinned: HeadPicked k's logits (or candidates) go to host[k % 2]
	word    []byte                // pinned: the published token (8 bytes), then the time-out flag (4)
	ev      [2]Event              // HeadPicked k's download done: ev[k % 2]
	heads   int                   // HeadPicked calls so far
	taken   int                   // … whose logits were returned (or discarded by Embed)
	seq     uint32                // the latest EmbedPicked's sequence number
	waiting bool                  // an EmbedPicked has not been given its token
	timeout time.Duration         // how long the device waits for a token (pickTimeout)
}

func (q *pickQueue) ready() bool { return q.word != nil }

func (q *pickQueue) init(d *Device, vocab int) error {
	var err error
	if q.logits, err = d.Malloc(4 * int64(vocab)); err != nil {
		return err
	}
	if q.work, err = d.Malloc(ArgmaxWork); err != nil {
		return err
	}
	if err := d.Upload(q.work, make([]byte, ArgmaxWork)); err != nil {
		return err
	}
	if q.top, err = d.Malloc(4); err != nil {
		return err
	}
	if q.counts, err = d.Malloc(4 * CandidateCTAs); err != nil {
		return err
	}
	if q.cand, err = d.Malloc(4 * int64(CandidateWords(pickCandCap))); err != nil {
		return err
	}
	for i := range q.host {
		if q.host[i], err = d.MallocHost(4 * max(vocab, CandidateWords(pickCandCap))); err != nil {
			return err
		}
	}
	if q.word, err = d.MallocHost(16); err != nil {
		return err
	}
	clear(q.word)
	for i := range q.ev {
		if q.ev[i], err = d.NewEvent(); err != nil {
			return err
		}
	}
	return nil
}

// release frees what init allocated (the batch's stream is idle).
func (q *pickQueue) release(d *Device) {
	for _, p := range []Ptr{q.logits, q.work, q.top, q.counts, q.cand} {
		if p != 0 {
			d.Free(p)
		}
	}
	for _, h := range append(q.host[:], q.word) {
		if h != nil {
			d.FreeHost(h)
		}
	}
	for _, e := range q.ev {
		if e != 0 {
			d.DestroyEvent(e)
		}
	}
	if q.copyS != 0 {
		d.DestroyStream(q.copyS)
	}
	*q = pickQueue{}
}

func (q *pickQueue) wordPtr() *uint64 { return (*uint64)(unsafe.Pointer(&q.word[0])) }
func (q *pickQueue) flagPtr() *uint32 { return (*uint32)(unsafe.Pointer(&q.word[8])) }

// publish gives the waiting step its token: one 8-byte store (x86-64 keeps
// it whole and in order; the device reads the word over the bus).
func (q *pickQueue) publish(tok int32) {
	atomic.StoreUint64(q.wordPtr(), uint64(q.seq)<<32|uint64(uint32(tok)))
	q.waiting = false
}

// errPickAhead is engine.ErrPickAhead with the reason.
func errPickAhead(why string) error {
	return fmt.Errorf("cuda: %s: %w", why, engine.ErrPickAhead)
}

// pickBlocked is called by what must wait for the device (flush). While a
// picked step is being recorded it drops the recording (nothing of it has
// run) and returns engine.ErrPickAhead.
func (b *batch) pickBlocked(why string) error {
	if !b.pq.waiting {
		return nil
	}
	b.abortGraph()
	b.pq.waiting = false
	b.be.gstats.pickDropped.Add(1)
	return errPickAhead(why)
}

// releasePick gives a step still waiting for its token the token 0, so that
// the device can go on (its work is discarded). Called before anything that
// waits for the batch's stream (a new embed, the batch's release); a
// recording never launched is dropped there too (abortGraph).
func (b *batch) releasePick() {
	if b.pq.waiting {
		b.pq.publish(0)
	}
}

// EmbedPicked is Embed of one token at pos that the device waits for until
// SupplyToken gives it (engine.PickPipeliner).
func (be *Backend) EmbedPicked(bi engine.Batch, pos int) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if be.opts.GraphLayers <= 0 || be.profileAt > 0 {
		be.gstats.pickDropped.Add(1)
		return errPickAhead("graph decode is off, or the profiler is armed")
	}
	q := &b.pq
	if q.waiting {
		return fmt.Errorf("cuda: picked embed: a step already waits for its token")
	}
	if err := b.readyQueue(q, "picked embed"); err != nil {
		return err
	}
	if q.timeout = be.pickTimeout; q.timeout <= 0 {
		q.timeout = pickTimeout
	}
	q.seq++
	if err := be.embedFrom(b, pos, 1, nil, true); err != nil {
		return err
	}
	be.gstats.pickAhead.Add(1)
	return nil
}

// SupplyToken publishes the token of the step that waits for it
// (engine.PickPipeliner).
func (be *Backend) SupplyToken(bi engine.Batch, tok int32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if !b.pq.waiting {
		return fmt.Errorf("cuda: supply token: no step waits for one")
	}
	if tok < 0 || int(tok) >= be.cfg.Vocab {
		b.pq.publish(0)
		return fmt.Errorf("cuda: supply token: %d is not in [0, %d)", tok, be.cfg.Vocab)
	}
	b.pq.publish(tok)
	return nil
}

// HeadPicked is Head for the one row of a one-token chunk whose logits are
// downloaded to pinned memory as the step ends — with a filter, only
// min-p's candidates under it, found on the device (PickCandidates)
// (engine.PickPipeliner).
func (be *Backend) HeadPicked(bi engine.Batch, f *engine.PickFilter) error {
	b, err := be.oneTokenBatch(bi, "picked")
	if err != nil {
		return err
	}
	q := &b.pq
	if q.heads-q.taken >= len(q.host) {
		return fmt.Errorf("cuda: picked head: %d heads' logits not taken", q.heads-q.taken)
	}
	d := be.dev
	if err := b.readyQueue(q, "picked head"); err != nil {
		return err
	}
	if err := be.headRow(b, q.logits); err != nil {
		return err
	}
	k := q.heads % len(q.host)
	q.filt[k] = nil
	src, bytes := q.logits, 4*be.cfg.Vocab
	if f != nil && f.Temperature > 0 && f.MinP > 0 {
		if err := d.PickCandidates(b.s, q.logits, be.cfg.Vocab, f.Temperature, f.MinP, q.work, q.top, q.counts, q.cand, pickCandCap); err != nil {
			return err
		}
		fc := *f
		q.filt[k] = &fc
		src, bytes = q.cand, 4*CandidateWords(pickCandCap)
		b.g.shape = append(b.g.shape, 'C')
	} else {
		b.g.shape = append(b.g.shape, 'P')
	}
	if err := b.finish(); err != nil {
		return err
	}
	if err := d.DownloadAsync(q.host[k][:bytes], src, b.s); err != nil {
		return err
	}
	if err := d.Record(q.ev[k], b.s); err != nil {
		return err
	}
	q.heads++
	return b.stopProfiler()
}

// ErrPickTimeout reports a queued step that waited for its token longer
// than the backend's limit and went on without it.
var ErrPickTimeout = errors.New("cuda: a queued decode step waited too long for its token")

// PickedLogits waits for the oldest HeadPicked whose logits it has not
// returned and returns them, or its min-p candidates (none of either when
// there were more than pickCandCap candidates: PickedAll then fetches the
// logits): pinned memory, valid until the second HeadPicked after it runs
// (engine.PickPipeliner).
func (be *Backend) PickedLogits(bi engine.Batch) ([]float32, *engine.Candidates, error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return nil, nil, err
	}
	q := &b.pq
	if q.taken >= q.heads {
		return nil, nil, fmt.Errorf("cuda: picked logits: none queued")
	}
	k := q.taken % len(q.host)
	t0 := time.Now()
	if err := be.dev.SyncEvent(q.ev[k]); err != nil {
		return nil, nil, err
	}
	be.gstats.waitNs.Add(int64(time.Since(t0)))
	q.taken++
	q.last = k
	if s := atomic.LoadUint32(q.flagPtr()); s != 0 {
		atomic.StoreUint32(q.flagPtr(), 0)
		return nil, nil, fmt.Errorf("%w (step %d, %v)", ErrPickTimeout, s, q.timeout)
	}
	be.gstats.pickedHeads.Add(1)
	if f := q.filt[k]; f != nil {
		c, err := be.candidatesIn(q.host[k], *f)
		if err != nil {
			return nil, nil, fmt.Errorf("cuda: picked %w", err)
		}
		return nil, c, nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&q.host[k][0])), be.cfg.Vocab), nil, nil
}

// candidatesIn reads PickCandidates' output (CandidateWords(pickCandCap)
// words, downloaded to pinned memory) as the candidates under f, in place:
// nil when there were more than pickCandCap (counted in the graph stats).
func (be *Backend) candidatesIn(buf []byte, f engine.PickFilter) (*engine.Candidates, error) {
	w := unsafe.Slice((*int32)(unsafe.Pointer(&buf[0])), CandidateWords(pickCandCap))
	n, top := int(w[0]), w[1]
	if n < 1 || top < 0 || int(top) >= be.cfg.Vocab {
		return nil, fmt.Errorf("candidates: %d, greedy choice %d", n, top)
	}
	if n > pickCandCap {
		be.gstats.pickOverflows.Add(1)
		return nil, nil
	}
	vals := unsafe.Slice((*float32)(unsafe.Pointer(&w[4+pickCandCap])), n)
	return &engine.Candidates{Filter: f, Top: top, TopLogit: math.Float32frombits(uint32(w[2])), IDs: w[4 : 4+n], Values: vals}, nil
}

// PickedAll copies the logits of the HeadPicked whose logits PickedLogits
// returned last into dst: from the device when only candidates came (no
// step queued after it has run: the next one waits for its token)
// (engine.PickPipeliner).
func (be *Backend) PickedAll(bi engine.Batch, dst []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	q := &b.pq
	V := be.cfg.Vocab
	if q.taken == 0 || len(dst) < V {
		return fmt.Errorf("cuda: picked logits: none taken, or %d values for a vocabulary of %d", len(dst), V)
	}
	if q.filt[q.last] == nil { // (they came whole)
		copy(dst, unsafe.Slice((*float32)(unsafe.Pointer(&q.host[q.last][0])), V))
		return nil
	}
	// Not a plain Download: cudaMemcpy runs on the legacy default stream,
	// which may wait for the queued step (which waits for this draw). A
	// stream of its own into the other pinned buffer (the queued step's,
	// which it fills only after its token).
	d := be.dev
	if q.copyS == 0 {
		if q.copyS, err = d.NewStream(); err != nil {
			return err
		}
	}
	buf := q.host[1-q.last][:4*V]
	if err := d.DownloadAsync(buf, q.logits, q.copyS); err != nil {
		return err
	}
	if err := d.SyncStream(q.copyS); err != nil {
		return err
	}
	copy(dst, unsafe.Slice((*float32)(unsafe.Pointer(&buf[0])), V))
	return nil
}
