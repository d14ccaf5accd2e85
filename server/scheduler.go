package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"ds4go/chat/dsml"
	"ds4go/engine"
	"ds4go/kvdisk"
)

// evKind identifies what a generation reports to its HTTP handler.
type evKind uint8

const (
	evStart     evKind = iota + 1 // prefill done; res has the prompt counts
	evText                        // visible text delta
	evReasoning                   // reasoning delta
	evToolBegin                   // a tool call starts: index, id, name
	evToolArgs                    // a piece of the call's JSON arguments
	evToolEnd                     // the call is complete: call
	evToolAbort                   // the call was malformed; discard it
	evDone                        // generation finished: res
)

// event is one step of a generation, in order.
type event struct {
	kind  evKind
	text  string
	index int
	id    string
	name  string
	call  *genCall
	res   *genResult
}

// genCall is a generated tool call.
type genCall struct {
	ID, Name, Arguments string
	Index               int
	Truncated           bool // cut off by max_tokens: not executable
}

// genResult is the outcome of a generation.
type genResult struct {
	text, reasoning  string
	calls            []genCall // complete calls only
	finish           string    // "stop", "length", "tool_calls", "error"
	stopSeq          string    // the stop sequence that ended it
	prompt, cached   int       // prompt tokens, of which reused from the live session
	completion       int
	reasoningTokens  int
	reasoningOpen    bool // ended inside <think>
	err              *apiError
	cacheSource      string
	prefill, decode  time.Duration
	queued, firstTok time.Duration
}

// eventQueue carries a generation's events from the worker to the handler.
// It never blocks the worker: a slow client only makes it grow, and a
// client that goes away cancels the generation through its context.
type eventQueue struct {
	mu     sync.Mutex
	evs    []event
	closed bool
	notify chan struct{}
}

func newEventQueue() *eventQueue { return &eventQueue{notify: make(chan struct{}, 1)} }

func (q *eventQueue) push(e event) {
	q.mu.Lock()
	if !q.closed {
		q.evs = append(q.evs, e)
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// take returns the pending events and whether the queue is closed.
func (q *eventQueue) take(buf []event) ([]event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	buf = append(buf[:0], q.evs...)
	clear(q.evs)
	q.evs = q.evs[:0]
	return buf, q.closed
}

// job is a queued generation.
type job struct {
	ctx      context.Context
	req      *genRequest
	q        *eventQueue
	enqueued time.Time
}

// scheduler owns the engine's live session and runs jobs on it one at a
// time, in arrival order. See docs/server.md for how it grows to several
// sessions and batched decoding.
type scheduler struct {
	s    *Server
	sess Session
	kv   *kvCache // nil: no disk KV cache
	jobs chan *job

	mu      sync.Mutex
	closed  bool
	live    *liveFrontier
	liveLen int // tokens in the live session (for /health)
	busy    bool

	done chan struct{}
}

func newScheduler(s *Server, sess Session, kv *kvCache, maxQueue int) *scheduler {
	sc := &scheduler{s: s, sess: sess, kv: kv, jobs: make(chan *job, maxQueue), done: make(chan struct{})}
	go sc.worker()
	return sc
}

// submit queues a job; false when the queue is full or the server stops.
func (sc *scheduler) submit(j *job) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return false
	}
	select {
	case sc.jobs <- j:
		sc.s.metrics.queueDepth.Set(float64(len(sc.jobs)))
		return true
	default:
		return false
	}
}

func (sc *scheduler) close() {
	sc.mu.Lock()
	if !sc.closed {
		sc.closed = true
		close(sc.jobs)
	}
	sc.mu.Unlock()
	<-sc.done
}

func (sc *scheduler) frontier() *liveFrontier {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.live
}

func (sc *scheduler) setFrontier(f *liveFrontier) {
	sc.mu.Lock()
	sc.live = f
	sc.mu.Unlock()
}

func (sc *scheduler) status() (queued, liveTokens int, busy bool) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.jobs), sc.liveLen, sc.busy
}

func (sc *scheduler) worker() {
	defer close(sc.done)
	for j := range sc.jobs {
		sc.s.metrics.queueDepth.Set(float64(len(sc.jobs)))
		if j.ctx.Err() != nil {
			// The client left while queued: its slot is simply skipped.
			sc.s.metrics.cancelled.Inc()
			j.q.close()
			continue
		}
		sc.mu.Lock()
		sc.busy = true
		sc.mu.Unlock()
		sc.s.metrics.active.Set(1)
		sc.runSafe(j)
		sc.s.metrics.active.Set(0)
		sc.mu.Lock()
		sc.busy = false
		sc.liveLen = len(sc.sess.Tokens())
		sc.mu.Unlock()
		sc.s.metrics.liveTokens.Set(float64(sc.liveLen))
	}
	sc.shutdownSave()
	sc.sess.Close()
}

// runSafe runs a job; a panic fails the job, resets the session and keeps
// the server alive.
func (sc *scheduler) runSafe(j *job) {
	defer func() {
		if p := recover(); p != nil {
			sc.s.log.Error("generation panicked", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			sc.s.metrics.panics.Inc()
			sc.resetSession()
			j.q.push(event{kind: evDone, res: &genResult{finish: "error",
				err: &apiError{status: 500, typ: "server_error", msg: "internal error during generation"}}})
		}
		j.q.close()
	}()
	sc.run(j)
}

func (sc *scheduler) resetSession() {
	sc.setFrontier(nil)
	_ = sc.sess.Rewind(context.Background(), 0)
}

// reusePrefix picks how much of the live session a prompt can keep. The
// longest token boundary of the live tokens whose decoded bytes are a
// prefix of the rendered prompt wins (this covers the exact token-prefix
// case and the case where sampled tokens decode to text the prompt
// tokenizes differently); only the prompt text after it is tokenized anew.
func (sc *scheduler) reusePrefix(live, prompt []int32, text string) ([]int32, int, string) {
	common := 0
	for common < len(live) && common < len(prompt) && live[common] == prompt[common] {
		common++
	}
	if common == len(live) {
		if common == 0 {
			return prompt, 0, "none"
		}
		return prompt, common, "token"
	}
	tok := sc.s.tok
	off, k := 0, 0
	for i, t := range live {
		b, err := tok.TokenBytes(t)
		if err != nil || off+len(b) > len(text) || text[off:off+len(b)] != string(b) {
			break
		}
		off += len(b)
		k = i + 1
	}
	if k <= common {
		if common == 0 {
			return prompt, 0, "none"
		}
		return prompt, common, "token"
	}
	eff := append(slices.Clip(live[:k]), tok.EncodeWithSpecial(text[off:])...)
	return eff, k, "text"
}

// run executes one job: prefix reuse, prefill, the decode loop.
func (sc *scheduler) run(j *job) {
	s, r, q, ctx := sc.s, j.req, j.q, j.ctx
	tok := s.tok
	sess := sc.sess
	res := &genResult{queued: time.Since(j.enqueued)}
	fail := func(e *apiError) {
		res.finish, res.err = "error", e
		q.push(event{kind: evDone, res: res})
	}

	live := sess.Tokens()
	var eff []int32
	cached, source := 0, "none"
	if r.liveTail != "" {
		fr := sc.frontier()
		if fr != nil && fr.api == r.api && fr.tokens == len(live) && subset(r.liveIDs, fr.ids) {
			eff = append(slices.Clip(live), tok.EncodeWithSpecial(r.liveTail)...)
			cached, source = len(live), "live-tail"
		} else if r.needsLive {
			fail(&apiError{status: 409, typ: "invalid_request_error",
				msg: "continuation state is not available any more; retry by replaying the full history"})
			return
		}
	}
	if eff == nil {
		eff, cached, source = sc.reusePrefix(live, r.promptTokens, r.promptText)
		if sc.kv != nil {
			if deff, dc, ok := sc.kvLookup(r, cached); ok {
				eff, cached, source = deff, dc, "disk"
			} else {
				if len(live) >= sc.kv.cfg.MinTokens && cached < len(live)/2 {
					// An unrelated request replaces most of the live
					// session: keep it on disk first.
					sc.kvSave(kvdisk.ReasonEvict)
				}
				if now := sess.Tokens(); !slices.Equal(now, live) {
					// A failed load changed the session.
					eff, cached, source = sc.reusePrefix(now, r.promptTokens, r.promptText)
				}
			}
		}
	}
	if r.replayNoRs && source != "live-tail" {
		s.log.Warn("responses replay without reasoning state; continuing from the visible history")
	}
	if len(eff) >= s.ctxSize {
		fail(contextError(r.api, len(eff), s.ctxSize))
		return
	}
	sc.setFrontier(nil)
	res.prompt, res.cached, res.cacheSource = len(eff), cached, source
	s.metrics.cache.WithLabelValues(source).Inc()
	s.metrics.cachedTokens.Add(float64(cached))

	// Prefill what the live session lacks (at least one token, so that the
	// logits are fresh).
	t0 := time.Now()
	keep := min(cached, len(eff)-1)
	if source == "disk" && cached == len(eff) && sess.Logits() != nil {
		// A checkpoint of exactly the prompt restored its logits too; a
		// one-token rewind would have to re-derive the prefix (the payload
		// keeps only the rows the next position needs).
		keep = cached
	}
	if keep < len(sess.Tokens()) {
		if err := sess.Rewind(ctx, keep); err != nil {
			sc.engineFailure(ctx, res, q, "rewind", err)
			return
		}
	}
	if err := sc.prefill(ctx, eff, keep, cached, source); err != nil {
		sc.engineFailure(ctx, res, q, "prefill", err)
		return
	}
	res.prefill = time.Since(t0)
	s.metrics.promptTokens.Add(float64(len(eff)))
	s.metrics.prefilledTokens.Add(float64(len(eff) - keep))
	if res.prefill > 0 && len(eff)-keep > 1 {
		s.metrics.prefillTPS.Set(float64(len(eff)-keep) / res.prefill.Seconds())
	}
	q.push(event{kind: evStart, res: res})
	s.log.Debug("prefill done", "api", r.api.String(), "prompt", len(eff), "cached", cached, "source", source, "seconds", res.prefill.Seconds())

	sc.decode(ctx, j, res, len(eff))
}

// prefill runs eff[keep:] on the live session. With the disk KV cache it
// stops on the way where a checkpoint is due: the cold checkpoint of a
// first prompt (not after a disk hit) and the absolute continued frontiers.
func (sc *scheduler) prefill(ctx context.Context, eff []int32, keep, cached int, source string) error {
	sess, kc := sc.sess, sc.kv
	if kc == nil {
		return sess.Prefill(ctx, eff[keep:])
	}
	kc.lastStore = min(kc.lastStore, keep)
	cold := 0
	if source != "disk" && source != "live-tail" {
		cold = kc.coldLen(sc.s, eff, cached)
	}
	var stops []int
	if cold > keep {
		stops = append(stops, cold)
	}
	if st := kc.step(); st > 0 {
		for f := (keep/st + 1) * st; f <= len(eff); f += st {
			stops = append(stops, f)
		}
	}
	slices.Sort(stops)
	stops = slices.Compact(stops)
	pos := keep
	for _, stop := range stops {
		if err := sess.Prefill(ctx, eff[pos:stop]); err != nil {
			return err
		}
		pos = stop
		if stop == cold {
			sc.kvSave(kvdisk.ReasonCold)
			kc.lastStore = max(kc.lastStore, stop)
		} else {
			sc.kvMaybeContinued()
		}
	}
	if pos < len(eff) {
		return sess.Prefill(ctx, eff[pos:])
	}
	return nil
}

// shutdownSave writes the live session to the disk cache when the server
// stops cleanly.
func (sc *scheduler) shutdownSave() {
	if sc.kv == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			sc.s.log.Error("kv cache: shutdown save panicked", "panic", fmt.Sprint(p))
		}
	}()
	sc.kvSave(kvdisk.ReasonShutdown)
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// engineFailure reports a failed rewind or prefill. A cancelled request just
// ends; any other failure resets the session (its state is unknown).
func (sc *scheduler) engineFailure(ctx context.Context, res *genResult, q *eventQueue, op string, err error) {
	if ctx.Err() != nil {
		sc.s.metrics.cancelled.Inc()
		return
	}
	sc.s.log.Error("engine "+op+" failed", "err", err)
	sc.resetSession()
	res.finish = "error"
	res.err = &apiError{status: 500, typ: "server_error", msg: op + " failed: " + err.Error()}
	if errors.Is(err, ErrContextFull) {
		res.err = &apiError{status: 400, typ: "invalid_request_error", code: "context_length_exceeded", msg: err.Error()}
	}
	q.push(event{kind: evDone, res: res})
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// decode runs the sampling loop after prefill.
func (sc *scheduler) decode(ctx context.Context, j *job, res *genResult, promptLen int) {
	s, r, q := sc.s, j.req, j.q
	tok := s.tok
	sess := sc.sess
	eos := tok.EOS()

	maxTok := r.maxTokens
	if maxTok < 0 {
		maxTok = s.cfg.DefaultMaxTokens
	}
	maxTok = min(maxTok, s.ctxSize-promptLen)

	seed := r.seed
	if !r.hasSeed {
		seed = randomSeed()
	}
	smp := newSampler(seed)
	raw := r.api == apiCompletions
	var parser *dsml.Parser
	var sd = tok.NewStreamDecoder()
	if !raw {
		parser = dsml.NewParser(dsml.Options{Thinking: r.mode.Thinking(), DecodeEntities: true, DisableToolCalls: !r.hasTools})
	}
	stops := newStopFilter(r.stops)
	var text, reasoning strings.Builder
	ids := map[int]string{}
	finish := "length"
	callsEnded := 0
	truncated := false
	stopped := false

	emitText := func(t string) {
		if t == "" {
			return
		}
		text.WriteString(t)
		q.push(event{kind: evText, text: t})
	}
	handle := func(evs []dsml.Event) {
		for _, ev := range evs {
			if stopped {
				return
			}
			switch ev.Kind {
			case dsml.EventText:
				out, hit := stops.push(ev.Text)
				emitText(out)
				if hit {
					stopped, finish, res.stopSeq = true, "stop", stops.hit
				}
			case dsml.EventReasoning:
				reasoning.WriteString(ev.Text)
				q.push(event{kind: evReasoning, text: ev.Text})
			case dsml.EventToolCallBegin:
				emitText(stops.flush())
				stops = newStopFilter(r.stops)
				id := newToolID(r.api)
				for s.toolMem.has(id) {
					id = newToolID(r.api)
				}
				ids[ev.Index] = id
				q.push(event{kind: evToolBegin, index: ev.Index, id: id, name: ev.Name})
			case dsml.EventToolCallArgs:
				q.push(event{kind: evToolArgs, index: ev.Index, text: ev.Text})
			case dsml.EventToolCallEnd:
				c := ev.Call
				gc := genCall{ID: ids[ev.Index], Name: c.Name, Arguments: c.Arguments, Index: ev.Index, Truncated: c.Truncated}
				if c.Truncated {
					truncated = true
				} else {
					res.calls = append(res.calls, gc)
					callsEnded++
				}
				q.push(event{kind: evToolEnd, index: ev.Index, id: gc.ID, call: &gc})
			case dsml.EventError:
				s.log.Warn("malformed DSML in model output; returned as text", "err", ev.Err)
				s.metrics.dsmlErrors.Inc()
				if ev.Index >= 0 {
					q.push(event{kind: evToolAbort, index: ev.Index, id: ids[ev.Index]})
				}
			}
		}
	}

	// count records an accepted token; emitTok streams its text (raw, or
	// through the DSML parser) and reports whether the generation ends
	// after it (a stop sequence, or the turn's tool calls complete).
	count := func(inReasoning bool) {
		res.completion++
		if res.completion == 1 {
			res.firstTok = time.Since(j.enqueued)
			s.metrics.ttft.Observe(res.firstTok.Seconds())
		}
		if inReasoning {
			res.reasoningTokens++
		}
	}
	emitTok := func(t int32) bool {
		if raw {
			b, _ := sd.Add(t)
			out, hit := stops.push(string(b))
			emitText(out)
			if hit {
				stopped, finish, res.stopSeq = true, "stop", stops.hit
			}
			return stopped
		}
		b, _ := tok.TokenBytes(t)
		handle(parser.FeedBytes(b))
		if !stopped && callsEnded > 0 && parser.State() == dsml.StateText {
			finish = "tool_calls"
			return true
		}
		return stopped
	}
	decodeFailed := func(err error) {
		if ctx.Err() != nil {
			finish = "cancelled"
			return
		}
		s.log.Error("engine decode failed", "err", err)
		finish = "error"
		res.err = &apiError{status: 500, typ: "server_error", msg: "decode failed: " + err.Error()}
		sc.resetSession()
	}

	// the generation's speculative drafts, logged at its end
	ds, drafting := sess.(DraftSession)
	var d0 engine.Stats
	if drafting {
		d0 = ds.DraftStats()
	}
	t0 := time.Now()
	// A session that decodes by itself (GreedySession, PickSession) is
	// given what the loop below does token by token: gate says whether to
	// go on before a token is chosen (a token that ends the generation is
	// decoded, the choice after it only offered; a continued disk
	// checkpoint due pauses the run, and the same choice is made again
	// after the save), accept what follows the choice. The same tokens and
	// events as the loop; on the GPU each step is queued before the host
	// knows its token (greedy: chosen on the device).
	var endAfter, pause bool
	gate := func() bool {
		if endAfter {
			return false
		}
		if sc.kvContinuedDue() {
			pause = true
			return false
		}
		return true
	}
	accept := func(t int32) bool {
		if t == eos {
			finish = "stop"
			return false
		}
		count(parser != nil && parser.State() == dsml.StateReasoning)
		endAfter = emitTok(t)
		return true
	}
	var decodeBy func(max int) (int, error)
	if gs, ok := sess.(GreedySession); ok && r.sampling.greedy() {
		decodeBy = func(max int) (int, error) {
			return gs.DecodeGreedy(ctx, max, func(t int32) bool { return gate() && accept(t) })
		}
	} else if ps, ok := sess.(PickSession); ok {
		decodeBy = func(max int) (int, error) {
			return ps.DecodePicked(ctx, max, r.sampling.filter(), func(l *engine.Logits) (int32, bool) {
				if !gate() {
					return 0, false
				}
				greedy := parser != nil && r.hasTools && parser.InStructure()
				t := smp.sample(l, r.sampling, greedy)
				return t, accept(t)
			})
		}
	}
	pipelined := decodeBy != nil && sess.Logits() != nil
	if pipelined {
		for done := false; !done && res.completion < maxTok; {
			pause = false
			_, err := decodeBy(maxTok - res.completion)
			switch {
			case err != nil:
				decodeFailed(err)
				done = true
			case pause:
				sc.kvMaybeContinued()
			default:
				done = true
			}
		}
		if finish != "error" && finish != "cancelled" {
			sc.kvMaybeContinued()
		}
	}
	for !pipelined && res.completion < maxTok {
		if ctx.Err() != nil {
			finish = "cancelled"
			break
		}
		logits := sess.Logits()
		if logits == nil {
			finish = "error"
			res.err = &apiError{status: 500, typ: "server_error", msg: "engine returned no logits"}
			break
		}
		greedy := parser != nil && r.hasTools && parser.InStructure()
		inReasoning := parser != nil && parser.State() == dsml.StateReasoning
		t := smp.sample(engine.DenseLogits(logits), r.sampling, greedy)
		if t == eos {
			finish = "stop"
			break
		}
		count(inReasoning)
		if err := sess.Prefill(ctx, []int32{t}); err != nil {
			decodeFailed(err)
			break
		}
		sc.kvMaybeContinued()
		if emitTok(t) {
			break
		}
	}
	res.decode = time.Since(t0)
	s.metrics.completionTokens.Add(float64(res.completion))
	if res.completion > 1 && res.decode > 0 {
		s.metrics.decodeTPS.Set(float64(res.completion) / res.decode.Seconds())
	}
	if finish == "cancelled" {
		s.metrics.cancelled.Inc()
		return
	}

	if raw {
		if !stopped {
			b := sd.Flush()
			out, _ := stops.push(string(b))
			emitText(out)
		}
	} else if !stopped {
		handle(parser.Finish())
	}
	if !stopped {
		emitText(stops.flush())
	}
	res.text, res.reasoning = text.String(), reasoning.String()
	if parser != nil {
		pr := parser.Result()
		res.reasoningOpen = pr.ThinkingOpen
		if truncated {
			// A call cut off by max_tokens is not executable, and neither is
			// the turn: report the truncation, not the partial calls.
			res.calls = nil
		}
		if len(res.calls) > 0 && finish != "error" {
			finish = "tool_calls"
			for _, c := range res.calls {
				s.toolMem.put(c.ID, pr.ToolBlock, len(res.calls))
			}
			callIDs := make([]string, len(res.calls))
			for i, c := range res.calls {
				callIDs[i] = c.ID
			}
			if r.api == apiResponses || r.api == apiMessages {
				sc.setFrontier(&liveFrontier{api: r.api, ids: callIDs, tokens: len(sess.Tokens())})
			}
		}
	}
	res.finish = finish
	s.metrics.finish.WithLabelValues(finish).Inc()
	logArgs := []any{"api", r.api.String(), "prompt", res.prompt, "cached", res.cached,
		"source", res.cacheSource, "completion", res.completion, "finish", finish,
		"prefill_s", res.prefill.Seconds(), "decode_s", res.decode.Seconds(), "calls", len(res.calls)}
	if drafting {
		if d1 := ds.DraftStats(); d1.Drafted+d1.Checked > d0.Drafted+d0.Checked {
			logArgs = append(logArgs, "drafts", d1.Drafted-d0.Drafted, "drafts_committed", d1.Accepted-d0.Accepted,
				"drafts_checked", d1.Checked-d0.Checked)
		}
	}
	s.log.Info("generation done", logArgs...)
	q.push(event{kind: evDone, res: res})
}
