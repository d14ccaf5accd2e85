package cuda

import (
	"encoding/binary"
	"fmt"
	"time"

	"ds4go/engine"
)

// Speculative decoding's pass with its greedy choices on the device
// (engine.SpecPipeliner). The MTP block's head ends with Argmax into the
// main batch's result word 0 (the draft), which EmbedDraft copies into the
// verification chunk's second token slot after an event; the verification's
// head ends with Argmax of each row into words 1 and 2 and one 12-byte copy
// of the three words to pinned memory. A pass then waits on the host once,
// for those 12 bytes, instead of downloading three rows of logits (≈ 1.5 MB)
// in two round trips and taking their argmax on the host; the MTP head's row
// is read in place (no gather through the host).

var _ engine.SpecPipeliner = (*Backend)(nil)

// specQueue is a main batch's state for the pipelined pass, made on first
// use.
type specQueue struct {
	logits     Ptr // the verification's two rows of logits [2][Vocab]
	dlogits    Ptr // the MTP head's row [Vocab] (the MTP batch's stream)
	work       Ptr // Argmax's work area on the main stream
	dwork      Ptr // … on the MTP batch's stream
	res        Ptr // [3] int32: the draft, the choices after rows 0 and 1
	pin        []byte
	drafted    Event // the draft's Argmax done (MTP stream)
	done       Event // the result's copy done (main stream)
	verified   bool  // a HeadVerify whose result VerifyResult has not read
	draftReady bool  // an MTPHeadDraft's draft not yet embedded by EmbedDraft
	cq         candQueue
}

// candQueue is a main batch's state for the verification rows' min-p
// candidates (engine.SpecCandidater), made on the first SetVerifyFilter.
type candQueue struct {
	filt  *engine.PickFilter // SetVerifyFilter's (nil: none)
	vfilt *engine.PickFilter // the latest HeadVerify's (its candidates in pin)
	vrows int                // … its rows
	work  Ptr                // PickCandidates' argmax work area
	top   Ptr                // … its greedy choice (int32)
	cnt   Ptr                // … its counts (CandidateCTAs words)
	cand  [2]Ptr             // … its output for rows 0 and 1 (CandidateWords(pickCandCap) words each)
	pin   [2][]byte          // pinned: the rows' candidates
}

func (c *candQueue) init(d *Device) error {
	var err error
	words := 4 * int64(CandidateWords(pickCandCap))
	allocs := []struct {
		p *Ptr
		n int64
	}{{&c.work, ArgmaxWork}, {&c.top, 16}, {&c.cnt, 4 * CandidateCTAs}, {&c.cand[0], words}, {&c.cand[1], words}}
	for _, a := range allocs {
		if *a.p, err = d.Malloc(a.n); err != nil {
			return err
		}
	}
	if err := d.Upload(c.work, make([]byte, ArgmaxWork)); err != nil {
		return err
	}
	for i := range c.pin {
		if c.pin[i], err = d.MallocHost(int(words)); err != nil {
			return err
		}
	}
	return nil
}

func (c *candQueue) release(d *Device) {
	for _, p := range []Ptr{c.work, c.top, c.cnt, c.cand[0], c.cand[1]} {
		if p != 0 {
			d.Free(p)
		}
	}
	for _, p := range c.pin {
		if p != nil {
			d.FreeHost(p)
		}
	}
	*c = candQueue{}
}

func (q *specQueue) ready() bool { return q.res != 0 }

func (q *specQueue) init(d *Device, vocab int) error {
	var err error
	allocs := []struct {
		p *Ptr
		n int64
	}{{&q.logits, 8 * int64(vocab)}, {&q.dlogits, 4 * int64(vocab)}, {&q.work, ArgmaxWork}, {&q.dwork, ArgmaxWork}, {&q.res, 16}}
	for _, a := range allocs {
		if *a.p, err = d.Malloc(a.n); err != nil {
			return err
		}
	}
	for _, w := range []Ptr{q.work, q.dwork, q.res} {
		if err := d.Upload(w, make([]byte, ArgmaxWork)); err != nil {
			return err
		}
	}
	if q.pin, err = d.MallocHost(16); err != nil {
		return err
	}
	for _, e := range []*Event{&q.drafted, &q.done} {
		if *e, err = d.NewEvent(); err != nil {
			return err
		}
	}
	return nil
}

// release frees what init allocated (the batch's stream is idle; the MTP
// batch's work on the buffers is waited for here).
func (q *specQueue) release(d *Device) {
	if q.drafted != 0 {
		_ = d.SyncEvent(q.drafted)
	}
	for _, p := range []Ptr{q.logits, q.dlogits, q.work, q.dwork, q.res} {
		if p != 0 {
			d.Free(p)
		}
	}
	if q.pin != nil {
		d.FreeHost(q.pin)
	}
	for _, e := range []Event{q.drafted, q.done} {
		if e != 0 {
			d.DestroyEvent(e)
		}
	}
	q.cq.release(d)
	*q = specQueue{}
}

// MTPHeadDraft is MTPHead for one row of the MTP batch's chunk whose greedy
// choice, made on the device, is the draft of the next EmbedDraft on b
// (engine.SpecPipeliner).
func (be *Backend) MTPHeadDraft(mbi, bi engine.Batch, row int) error {
	mb, _, err := be.mtpBatch(mbi)
	if err != nil {
		return err
	}
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if b == mb {
		return fmt.Errorf("cuda: MTP draft head: the MTP batch as the main one")
	}
	if row < 0 || row >= mb.n {
		return fmt.Errorf("cuda: MTP draft head: row %d of a chunk of %d", row, mb.n)
	}
	q := &b.sq
	if err := b.readyQueue(q, "MTP draft head"); err != nil {
		return err
	}
	d := be.dev
	D, V := be.cfg.Embed, be.cfg.Vocab
	if err := be.headIn(mb, &be.mtp.head); err != nil {
		return err
	}
	in := mb.headIn + Ptr(4*int64(row*D))
	if err := be.linear(mb, in, D, 1, linJob{w: be.out, y: q.dlogits, ldy: V}); err != nil {
		return err
	}
	if err := mb.finish(); err != nil {
		return err
	}
	// the result words are read by the main stream's copy of the pass
	// before (VerifyResult waited for it; the wait orders the streams too)
	if err := d.StreamWait(mb.s, q.done); err != nil {
		return err
	}
	if err := d.Argmax(mb.s, q.dlogits, V, q.dwork, q.res); err != nil {
		return err
	}
	if err := d.Record(q.drafted, mb.s); err != nil {
		return err
	}
	q.draftReady = true
	return nil
}

// EmbedDraft is Embed of the two-token chunk [tok, draft] at pos, the draft
// being the latest MTPHeadDraft's choice on the device
// (engine.SpecPipeliner).
func (be *Backend) EmbedDraft(bi engine.Batch, pos int, tok int32) error {
	return be.embedDraft(bi, pos, tok, 2)
}

// EmbedAfterDraft is Embed of the one-token chunk [tok] at pos after the
// latest MTPHeadDraft, whose draft the next VerifyResult returns
// (engine.SpecPipeliner): a pass that only checks the draft.
func (be *Backend) EmbedAfterDraft(bi engine.Batch, pos int, tok int32) error {
	return be.embedDraft(bi, pos, tok, 1)
}

// embedDraft is EmbedDraft (n = 2) and EmbedAfterDraft (n = 1): either
// way the main stream waits for the draft's Argmax, whose word the
// verification's result copy reads.
func (be *Backend) embedDraft(bi engine.Batch, pos int, tok int32, n int) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	q := &b.sq
	if !q.draftReady {
		return fmt.Errorf("cuda: draft embed: no MTP draft queued")
	}
	if b.cap < n {
		return fmt.Errorf("cuda: draft embed: a batch of %d tokens", b.cap)
	}
	if tok < 0 || int(tok) >= be.cfg.Vocab {
		return fmt.Errorf("cuda: token %d out of range", tok)
	}
	b.releasePick()
	b.abortGraph()
	b.gq.onDevice = false
	b.gq.taken = b.gq.heads
	b.pq.taken = b.pq.heads
	if err := b.setTokens([]int32{tok}); err != nil {
		return err
	}
	d := be.dev
	if err := d.StreamWait(b.s, q.drafted); err != nil {
		return err
	}
	if n == 2 {
		if err := d.CopyAsync(b.tokens+4, q.res, 4, b.s); err != nil {
			return err
		}
	}
	q.draftReady = false
	return be.embedFrom(b, pos, n, nil, false)
}

// HeadVerify is Head for every row of the chunk (two, or one after
// EmbedAfterDraft or a one-token Embed), the logits kept on the device and
// the greedy choice after each row queued for VerifyResult
// (engine.SpecPipeliner).
func (be *Backend) HeadVerify(bi engine.Batch) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	n := b.n
	if n != 1 && n != 2 {
		return fmt.Errorf("cuda: verification head of a chunk of %d tokens (one or two)", n)
	}
	q := &b.sq
	if !q.ready() {
		return fmt.Errorf("cuda: verification head: no draft head before it")
	}
	d := be.dev
	D, V := be.cfg.Embed, be.cfg.Vocab
	if err := be.headIn(b, &be.head); err != nil {
		return err
	}
	if err := be.linear(b, b.headIn, D, n, linJob{w: be.out, y: q.logits, ldy: V}); err != nil {
		return err
	}
	for r := 0; r < n; r++ {
		if err := d.Argmax(b.s, q.logits+Ptr(4*int64(r*V)), V, q.work, q.res+Ptr(4*(r+1))); err != nil {
			return err
		}
	}
	c := &q.cq
	f := c.filt
	c.vfilt = nil
	if f != nil { // each row's min-p candidates (SetVerifyFilter)
		for r := 0; r < n; r++ {
			if err := d.PickCandidates(b.s, q.logits+Ptr(4*int64(r*V)), V, f.Temperature, f.MinP, c.work, c.top, c.cnt, c.cand[r], pickCandCap); err != nil {
				return err
			}
		}
		b.g.shape = append(b.g.shape, 'c')
	}
	b.g.shape = append(b.g.shape, 'V')
	if err := b.finish(); err != nil {
		return err
	}
	if err := d.DownloadAsync(q.pin[:12], q.res, b.s); err != nil {
		return err
	}
	if f != nil {
		for r := 0; r < n; r++ {
			if err := d.DownloadAsync(c.pin[r], c.cand[r], b.s); err != nil {
				return err
			}
		}
		c.vfilt, c.vrows = f, n
	}
	if err := d.Record(q.done, b.s); err != nil {
		return err
	}
	q.verified = true
	be.gstats.specHeads.Add(1)
	return b.stopProfiler()
}

// VerifyResult waits for the latest HeadVerify and returns its chunk's
// draft and the greedy choices after its rows (after a one-token chunk,
// after1 is the word a pass before left) (engine.SpecPipeliner).
func (be *Backend) VerifyResult(bi engine.Batch) (draft, after0, after1 int32, err error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return 0, 0, 0, err
	}
	q := &b.sq
	if !q.verified {
		return 0, 0, 0, fmt.Errorf("cuda: verification result: none queued")
	}
	t0 := time.Now()
	if err := be.dev.SyncEvent(q.done); err != nil {
		return 0, 0, 0, err
	}
	be.gstats.waitNs.Add(int64(time.Since(t0)))
	q.verified = false
	w := func(i int) int32 { return int32(binary.LittleEndian.Uint32(q.pin[4*i:])) }
	return w(0), w(1), w(2), nil
}

// VerifyLogits waits for the batch's work and copies the logits of row
// (0 or 1) of the latest HeadVerify into dst (engine.SpecPipeliner).
func (be *Backend) VerifyLogits(bi engine.Batch, row int, dst []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	q := &b.sq
	V := be.cfg.Vocab
	if !q.ready() || row < 0 || row > 1 {
		return fmt.Errorf("cuda: verification logits of row %d: none queued", row)
	}
	if len(dst) < V {
		return fmt.Errorf("cuda: verification logits: %d values for a vocabulary of %d", len(dst), V)
	}
	if err := be.dev.SyncStream(b.s); err != nil {
		return err
	}
	return DownloadSlice(be.dev, dst[:V], q.logits+Ptr(4*int64(row*V)))
}

var _ engine.SpecCandidater = (*Backend)(nil)

// SetVerifyFilter makes the following HeadVerify calls on bi find each
// row's min-p candidates under f (PickCandidates, as HeadPicked does) and
// download them with the pass's result; nil, or a filter without a
// temperature and min-p, stops it (engine.SpecCandidater).
func (be *Backend) SetVerifyFilter(bi engine.Batch, f *engine.PickFilter) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	c := &b.sq.cq
	if f == nil || !(f.Temperature > 0 && f.MinP > 0) {
		c.filt = nil
		return nil
	}
	if c.pin[0] == nil {
		if err := b.flush(); err != nil {
			return err
		}
		if err := c.init(be.dev); err != nil {
			c.release(be.dev)
			return fmt.Errorf("cuda: verification candidates: %w", err)
		}
	}
	fc := *f
	c.filt = &fc
	return nil
}

// VerifyCandidates returns the min-p candidates of row (0 or 1) of the
// latest HeadVerify on bi, after VerifyResult: in pinned memory, valid
// until the next HeadVerify; nil when that head had no filter or found more
// than pickCandCap (engine.SpecCandidater).
func (be *Backend) VerifyCandidates(bi engine.Batch, row int) (*engine.Candidates, error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return nil, err
	}
	q := &b.sq
	c := &q.cq
	if c.vfilt == nil || row < 0 || row >= c.vrows {
		return nil, nil
	}
	if q.verified {
		return nil, fmt.Errorf("cuda: verification candidates before VerifyResult")
	}
	cs, err := be.candidatesIn(c.pin[row], *c.vfilt)
	if err != nil {
		return nil, fmt.Errorf("cuda: verification %w", err)
	}
	return cs, nil
}
