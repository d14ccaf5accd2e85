package cuda

import (
	"fmt"
	"log/slog"
	"unsafe"

	"ds4go/engine"
)

// batch holds the device activations of one chunk of up to cap tokens, all
// f32, token-major, and the stream its work runs on.
type batch struct {
	be    *Backend
	stage *stageBuf // an MTP batch's staged rows (engine.Drafter), or nil
	// draftStart: an MTP batch's chunk embedded from host tokens, whose
	// MTPHeadDraft is a pass's first draft (spec.go)
	draftStart bool
	cap        int
	n          int // tokens of the current chunk
	pos        int // position of the first token
	s          Stream

	// side is a second stream for work independent of the main stream's
	// (the shared expert beside the routed ones): fork makes it wait for
	// the main stream's work so far, join makes the main stream wait for
	// it. Under graph capture the two become parallel branches of the graph.
	side           Stream
	evFork, evJoin Event
	forked         bool
	// side2 is a third stream, for work beside both (the indexer's query
	// path beside the compressors): fork2 and join2 as fork and join;
	// evSide orders it after work on side (markSide, side2WaitMark).
	side2            Stream
	evFork2, evJoin2 Event
	evSide           Event
	forked2          bool
	// evKV and evAct: the side stream's KV product and routed-expert
	// activation done (Backend.kvSide, actSide), for the main stream
	// (markOn, waitMark); marked: the flushes count when each was
	// recorded, so that a wait across a flush (which joined the side
	// stream already, and whose recording held the event) is skipped
	evKV, evAct Event
	marked      map[Event]int
	flushes     int
	// moe: the MoE sum an FFN left for its HCPost to form (Backend.moeFold;
	// k 0: none, b.out holds the sub-block output)
	moe moeSum

	tokens Ptr     // [cap] int32
	pinned []byte  // pinned host staging for the tokens
	logPin []byte  // pinned host staging for a few rows of logits (Head), made on first use
	h      Ptr     // [cap][HC·Embed] hyper-connection streams
	x      Ptr     // [cap][Embed] sub-block input
	out    Ptr     // [cap][Embed] sub-block output
	post   Ptr     // [cap][HC]
	comb   Ptr     // [cap][HC·HC]
	headIn Ptr     // [cap][Embed]
	sc     scratch // named working buffers

	g  graphDecode // capture of one-token chunks (graph.go)
	gq greedyQueue // greedy decode on the device (greedy.go)
	pq pickQueue   // decode steps queued before their tokens are chosen (picked.go)
	sq specQueue   // speculative passes with their choices on the device (spec.go)

	profiling bool // the profiler runs for this chunk (Backend.profileAt)

	// mixFn, when set, is the mixing weight whose raw products the last
	// HCPost formed in parts (HCPostMix: mixParts parts at mixPart; mixEx:
	// HCPostMixEx's) for the HCPre that follows.
	mixFn    *Weight
	mixPart  Ptr
	mixParts int
	mixEx    bool

	xq8 Ptr // x's Q8_0 activation, formed by the last HCPre (0: none)
	xh  Ptr // x in f16, formed by the last HCPre for MatMulHalf (0: none)
}

// scratch is per-batch device working memory: named buffers, grown on
// demand (growing waits for the batch's stream, then frees the old buffer).
type scratch struct {
	d     *Device
	s     Stream
	sides []Stream // also waited for before a buffer is freed
	bufs  map[string]scratchBuf
	// flush, when set, ends a graph capture in progress before the
	// scratch allocates (allocation synchronises).
	flush func() error
}

type scratchBuf struct {
	p Ptr
	n int64
}

// get returns a buffer of at least bytes bytes (contents undefined).
func (s *scratch) get(name string, bytes int64) (Ptr, error) {
	if s.bufs == nil {
		s.bufs = map[string]scratchBuf{}
	}
	b := s.bufs[name]
	if b.n >= bytes && b.p != 0 {
		return b.p, nil
	}
	if s.flush != nil {
		if err := s.flush(); err != nil {
			return 0, err
		}
	}
	if b.p != 0 {
		if err := s.d.SyncStream(s.s); err != nil {
			return 0, err
		}
		for _, side := range s.sides {
			if err := s.d.SyncStream(side); err != nil {
				return 0, err
			}
		}
		if err := s.d.Free(b.p); err != nil {
			return 0, err
		}
	}
	n := max(bytes, 2*b.n, 256)
	p, err := s.d.Malloc(n)
	if err != nil {
		delete(s.bufs, name)
		return 0, err
	}
	if s.d.l.slow > 0 { // (DS4_CUDA_SLOW_CALL_US: which buffers a first chunk grows)
		slog.Info("cuda: scratch grows", "name", name, "bytes", n, "had", b.n)
	}
	s.bufs[name] = scratchBuf{p, n}
	return p, nil
}

// f32 returns a buffer of n floats.
func (s *scratch) f32(name string, n int) (Ptr, error) { return s.get(name, 4*int64(n)) }

// getE is get for a run of requests that checks its error once: after the
// first failure (kept in *e) it returns 0 without trying.
func (s *scratch) getE(e *error, name string, bytes int64) Ptr {
	if *e != nil {
		return 0
	}
	var p Ptr
	p, *e = s.get(name, bytes)
	return p
}

func (s *scratch) free() {
	for _, b := range s.bufs {
		s.d.Free(b.p)
	}
	s.bufs = nil
}

// NewBatch allocates the activations of a chunk of up to maxTokens tokens.
func (be *Backend) NewBatch(maxTokens int) (engine.Batch, error) {
	if maxTokens <= 0 || maxTokens > 1<<20 {
		return nil, fmt.Errorf("cuda: batch of %d tokens", maxTokens)
	}
	c := &be.cfg
	D, HC := int64(c.Embed), int64(c.HC)
	b := &batch{be: be, cap: maxTokens, sc: scratch{d: be.dev}}
	var err error
	if b.s, err = be.dev.NewStream(); err != nil {
		return nil, err
	}
	b.sc.s = b.s
	if be.opts.OneStream {
		b.side, b.side2 = b.s, b.s
	} else {
		for _, p := range []*Stream{&b.side, &b.side2} {
			if *p, err = be.dev.NewStream(); err != nil {
				b.Release()
				return nil, err
			}
			b.sc.sides = append(b.sc.sides, *p)
		}
	}
	for _, p := range []*Event{&b.evFork, &b.evJoin, &b.evFork2, &b.evJoin2, &b.evSide, &b.evKV, &b.evAct} {
		if *p, err = be.dev.NewEvent(); err != nil {
			b.Release()
			return nil, err
		}
	}
	b.sc.flush = b.flush
	if b.pinned, err = be.dev.MallocHost(4 * maxTokens); err != nil {
		b.Release()
		return nil, err
	}
	m := int64(maxTokens)
	for _, a := range []struct {
		p     *Ptr
		bytes int64
	}{
		{&b.tokens, 4 * m}, {&b.h, 4 * m * HC * D}, {&b.x, 4 * m * D}, {&b.out, 4 * m * D},
		{&b.post, 4 * m * HC}, {&b.comb, 4 * m * HC * HC}, {&b.headIn, 4 * m * D},
	} {
		if *a.p, err = be.dev.Malloc(a.bytes); err != nil {
			b.Release()
			return nil, err
		}
	}
	return b, nil
}

// Release frees the batch's device memory.
func (b *batch) Release() {
	if b.be == nil {
		return
	}
	d := b.be.dev
	b.releasePick()
	b.releaseGraphs()
	if b.s != 0 {
		d.SyncStream(b.s)
	}
	for _, side := range []Stream{b.side, b.side2} {
		if side != 0 && side != b.s {
			d.SyncStream(side)
		}
	}
	for _, p := range []Ptr{b.tokens, b.h, b.x, b.out, b.post, b.comb, b.headIn} {
		d.Free(p)
	}
	b.sc.free()
	if b.stage != nil {
		b.stage.release(d)
	}
	b.gq.release(d)
	b.pq.release(d)
	b.sq.release(d)
	if b.pinned != nil {
		d.FreeHost(b.pinned)
	}
	if b.logPin != nil {
		d.FreeHost(b.logPin)
	}
	if b.s != 0 {
		d.DestroyStream(b.s)
	}
	for _, side := range []Stream{b.side, b.side2} {
		if side != 0 && side != b.s {
			d.DestroyStream(side)
		}
	}
	for _, e := range []Event{b.evFork, b.evJoin, b.evFork2, b.evJoin2, b.evSide, b.evKV, b.evAct} {
		if e != 0 {
			d.DestroyEvent(e)
		}
	}
	*b = batch{}
}

func (be *Backend) batchOf(bi engine.Batch) (*batch, error) {
	b, ok := bi.(*batch)
	if !ok || b.be != be {
		return nil, fmt.Errorf("cuda: batch %T does not belong to this backend", bi)
	}
	return b, nil
}

// oneTokenBatch is batchOf for the pipelined heads, which take the one row
// of a one-token chunk (what names the head in the error).
func (be *Backend) oneTokenBatch(bi engine.Batch, what string) (*batch, error) {
	b, err := be.batchOf(bi)
	if err != nil {
		return nil, err
	}
	if b.n != 1 {
		return nil, fmt.Errorf("cuda: %s head of a chunk of %d tokens (one only)", what, b.n)
	}
	return b, nil
}

// setTokens stages the chunk's tokens in pinned memory and copies them to
// the device on the batch's stream (after the batch's earlier work).
func (b *batch) setTokens(tokens []int32) error {
	if err := b.be.dev.SyncStream(b.s); err != nil {
		return err
	}
	dst := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(b.pinned))), b.cap)
	copy(dst, tokens)
	return b.be.dev.UploadAsync(b.tokens, b.pinned[:4*len(tokens)], b.s)
}

// moeSum is a decode step's MoE sum not yet formed: the routed outputs ye
// [k][D] of the experts sel [k] and the shared expert's ysh [D].
type moeSum struct {
	ye, sel, ysh Ptr
	k            int
}

// formMoE writes the MoE sum an FFN left pending (b.moe) into b.out.
func (be *Backend) formMoE(b *batch) error {
	m := b.moe
	if m.k == 0 {
		return nil
	}
	b.moe = moeSum{}
	return be.dev.MoECombine(b.s, m.ye, m.sel, m.ysh, b.out, b.n, m.k, be.cfg.Embed)
}

// ReadActivation copies an activation of the current chunk (engine.Inspector).
func (be *Backend) ReadActivation(bi engine.Batch, a engine.Activation, dst []float32) error {
	b, err := be.batchOf(bi)
	if err != nil {
		return err
	}
	if a == engine.ActSubOut {
		if err := be.formMoE(b); err != nil {
			return err
		}
	}
	D := be.cfg.Embed
	var src Ptr
	n := b.n * D
	switch a {
	case engine.ActStreams:
		src, n = b.h, b.n*be.cfg.HC*D
	case engine.ActSubIn:
		src = b.x
	case engine.ActSubOut:
		src = b.out
	case engine.ActHeadIn:
		src = b.headIn
	default:
		return fmt.Errorf("cuda: unknown activation %d", a)
	}
	if len(dst) < n {
		return fmt.Errorf("cuda: activation needs %d values, dst has %d", n, len(dst))
	}
	if err := b.flush(); err != nil {
		return err
	}
	if err := be.dev.SyncStream(b.s); err != nil {
		return err
	}
	return DownloadSlice(be.dev, dst[:n], src)
}

// fork makes the side stream wait for the work queued on the main stream.
func (b *batch) fork() error { return b.forkOn(b.side, b.evFork, &b.forked) }

// join makes the main stream wait for the work queued on the side stream.
func (b *batch) join() error { return b.joinFrom(b.side, b.evJoin, &b.forked) }

// rowsDone returns the compressed rows [i0, i1) at ratio r that the batch's
// tokens complete (none when i1 == i0): those a compressor pools and writes
// in this batch (compress), and so those its readers must wait for.
func (b *batch) rowsDone(r int) (i0, i1 int) { return b.pos / r, (b.pos + b.n) / r }

// fork2 and join2 are fork and join for the second side stream.
func (b *batch) fork2() error { return b.forkOn(b.side2, b.evFork2, &b.forked2) }
func (b *batch) join2() error { return b.joinFrom(b.side2, b.evJoin2, &b.forked2) }

// forkOn makes stream side wait for the work queued on the main stream
// (through event e), noting it in *forked; nothing when side is the main
// stream.
func (b *batch) forkOn(side Stream, e Event, forked *bool) error {
	if side == b.s {
		return nil
	}
	if err := b.follow(side, b.s, e); err != nil {
		return err
	}
	*forked = true
	return nil
}

// joinFrom makes the main stream wait for the work queued on stream side
// (through event e) when *forked, and clears it.
func (b *batch) joinFrom(side Stream, e Event, forked *bool) error {
	if !*forked {
		return nil
	}
	if err := b.follow(b.s, side, e); err != nil {
		return err
	}
	*forked = false
	return nil
}

// joinAll joins both side streams into the main stream.
func (b *batch) joinAll() error {
	if err := b.join(); err != nil {
		return err
	}
	return b.join2()
}

// markSide notes the work queued on the side stream so far, for
// side2WaitMark.
func (b *batch) markSide() error {
	if b.side2 == b.side {
		return nil
	}
	return b.be.dev.Record(b.evSide, b.side)
}

// side2WaitMark makes the second side stream wait for the side stream's
// work up to the last markSide.
func (b *batch) side2WaitMark() error {
	if b.side2 == b.side {
		return nil
	}
	return b.be.dev.StreamWait(b.side2, b.evSide)
}

// markOn notes the work queued on the side stream so far in event e, for
// waitMark (nothing when the side stream is the main one).
func (b *batch) markOn(e Event) error {
	if b.side == b.s {
		return nil
	}
	if b.marked == nil {
		b.marked = map[Event]int{}
	}
	b.marked[e] = b.flushes
	return b.be.dev.Record(e, b.side)
}

// waitMark makes the main stream wait for the side stream's work up to
// markOn(e), without a join (the side stream goes on).
func (b *batch) waitMark(e Event) error {
	if b.side == b.s {
		return nil
	}
	if at, ok := b.marked[e]; !ok || at != b.flushes {
		return nil // (a flush since: the main stream follows that work)
	}
	return b.be.dev.StreamWait(b.s, e)
}

// follow makes stream waiter wait for the work queued on stream s so far,
// through event e.
func (b *batch) follow(waiter, s Stream, e Event) error {
	if err := b.be.dev.Record(e, s); err != nil {
		return err
	}
	return b.be.dev.StreamWait(waiter, e)
}
