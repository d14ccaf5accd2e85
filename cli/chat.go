package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"ds4go/chat"
	"ds4go/chat/dsml"
	"ds4go/engine"
	"ds4go/internal/progress"
	"ds4go/loader"
)

// Chat is a conversation on one live session: every turn prefills only what
// the transcript gained since the previous turn (the closing EOS of the last
// answer, the new user turn and the assistant opening), then generates.
type Chat struct {
	m       *loader.Model
	opts    *Options
	out     io.Writer
	errw    io.Writer
	color   bool
	sess    *engine.Session
	ctxSize int
	mode    chat.Mode
	conv    chat.Conversation
	// pending are tokens the transcript has but the session has not
	// processed yet: the EOS closing the last answer, and a sampled token
	// whose decode was interrupted. They lead the next turn's prefill.
	pending []int32
	// kvThinkMax records whether the session's prompt starts with the
	// Think-Max prefix (right after BOS): switching it on or off mid-
	// conversation needs the transcript prefilled again.
	kvThinkMax bool
	sampler    *engine.Sampler
	stops      map[int32]bool
	eos        int32
	// progress shows a prefill progress bar on errw for long prompts
	// (set when stderr is a terminal).
	progress bool
}

// progressMinTokens is the prompt length from which the prefill shows a
// progress bar; progressStep is how many tokens each prefill call takes then.
const (
	progressMinTokens = 2048
	progressStep      = 512
)

// prefill runs toks through the session, in steps behind a progress bar
// when the prompt is long and progress is on.
func (c *Chat) prefill(ctx context.Context, toks []int32) error {
	if !c.progress || len(toks) < progressMinTokens {
		return c.sess.Prefill(ctx, toks)
	}
	bar := progress.Tokens(c.errw, len(toks), "prefill", false)
	defer bar.Exit()
	for off := 0; off < len(toks); off += progressStep {
		if err := c.sess.Prefill(ctx, toks[off:min(off+progressStep, len(toks))]); err != nil {
			return err
		}
		bar.Add(min(progressStep, len(toks)-off))
	}
	return bar.Finish()
}

// TurnStats describes one turn.
type TurnStats struct {
	// Prefilled is the number of tokens prefilled for the turn.
	Prefilled int
	// Reprefilled is set when the transcript could not be extended and the
	// whole of it was prefilled again.
	Reprefilled bool
	PrefillTime time.Duration
	// Generated is the number of tokens sampled (the stop token excluded).
	Generated int
	GenTime   time.Duration
	// Stop says why generation ended: eos, length, context, interrupted
	// (or interrupted-prefill: the turn was dropped).
	Stop string
	// SessionTokens is the session's length after the turn.
	SessionTokens int
	Text          string
	Reasoning     string
	// Drafts counts the turn's speculative drafts (--mtp-draft 2):
	// verified, committed, and only checked while the session paused
	// speculation (engine.Stats).
	Drafts engine.Stats
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func (st TurnStats) print(w io.Writer) {
	fmt.Fprintf(w, "ds4: prefill %d tokens, %.2f s, %.1f t/s; generation %d tokens, %.2f s, %.1f t/s; stop: %s; context %d tokens%s\n",
		st.Prefilled, st.PrefillTime.Seconds(), rate(st.Prefilled, st.PrefillTime),
		st.Generated, st.GenTime.Seconds(), rate(st.Generated, st.GenTime), st.Stop, st.SessionTokens, draftLine(st.Drafts))
}

// draftLine is the turn line's account of speculative drafts: empty when
// the turn drafted nothing.
func draftLine(d engine.Stats) string {
	if d.Drafted+d.Checked == 0 {
		return ""
	}
	s := fmt.Sprintf("; drafts %d, %d committed (%.0f %%)", d.Drafted, d.Accepted, 100*float64(d.Accepted)/float64(max(d.Drafted, 1)))
	if d.Checked > 0 {
		s += fmt.Sprintf(", %d only checked (%d right)", d.Checked, d.CheckAccepted)
	}
	return s
}

func newChat(m *loader.Model, o *Options, out, errw io.Writer, color bool) (*Chat, error) {
	seed := o.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	c := &Chat{
		m: m, opts: o, out: out, errw: errw, color: color, mode: o.Mode(),
		sampler: engine.NewSampler(engine.SamplerOptions{
			Temperature: float32(o.Temp), TopK: o.TopK, TopP: float32(o.TopP), MinP: float32(o.MinP), Seed: seed,
		}),
		stops: map[int32]bool{},
		eos:   m.Tokenizer.EOS(),
	}
	c.stops[c.eos] = true
	for _, s := range []string{chat.EOS, chat.UserToken} {
		if id, ok := m.Tokenizer.Lookup(s); ok {
			c.stops[id] = true
		}
	}
	if id, ok := m.Tokenizer.Lookup(chat.EOS); ok {
		c.eos = id
	}
	if err := c.setContext(o.Ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// setContext starts a new session of n tokens (capped at the model's) and
// an empty transcript (the system prompt kept).
func (c *Chat) setContext(n int) error {
	n = c.m.ContextSize(n)
	s, err := engine.NewSession(c.m.Backend, engine.Options{MaxContext: n, Draft: c.opts.MTPDraft >= 2, DraftDepth: max(c.opts.MTPDraft-1, 0)})
	if err != nil {
		return err
	}
	if c.sess != nil {
		c.sess.Close()
	}
	c.sess, c.ctxSize, c.pending = s, n, nil
	c.conv = chat.Conversation{}
	if c.opts.System != "" {
		c.conv.Messages = []chat.Message{{Role: chat.RoleSystem, Content: c.opts.System}}
	}
	return nil
}

// Close frees the session.
func (c *Chat) Close() { c.sess.Close() }

func (c *Chat) renderOptions() chat.Options {
	return chat.Options{Mode: c.mode, ContextSize: c.ctxSize, KeepReasoning: true}
}

// turnTokens returns what to prefill for a new user message: the pending
// tokens and the tokens of the text the rendered transcript gains. If the
// new rendering does not extend the old one, the session is reset and the
// whole transcript is returned (reprefill true).
func (c *Chat) turnTokens(msgs []chat.Message) (toks []int32, reprefill bool, err error) {
	ro := c.renderOptions()
	full, err := chat.Render(chat.Conversation{Messages: msgs}, ro)
	if err != nil {
		return nil, false, err
	}
	tm := chat.EffectiveMode(c.mode, c.ctxSize) == chat.ModeThinkMax
	if c.sess.Pos() == 0 && len(c.pending) == 0 {
		c.kvThinkMax = tm
		return c.m.Tokenizer.EncodeWithSpecial(full), false, nil
	}
	prev, err := chat.Render(c.conv, ro)
	if err == nil && tm == c.kvThinkMax && strings.HasPrefix(full, prev) {
		toks = append(append([]int32(nil), c.pending...), c.m.Tokenizer.EncodeWithSpecial(full[len(prev):])...)
		return toks, false, nil
	}
	c.sess.Reset()
	c.pending, c.kvThinkMax = nil, tm
	return c.m.Tokenizer.EncodeWithSpecial(full), true, nil
}

// Turn adds a user message, prefills it and streams the answer to the
// output. Cancelling ctx during the prefill drops the turn (the session is
// rewound to where it was); during generation it stops the answer, which
// stays in the transcript as far as it got. Either way the session stays
// usable for the next turn.
func (c *Chat) Turn(ctx context.Context, text string) (TurnStats, error) {
	var st TurnStats
	msgs := append(append([]chat.Message(nil), c.conv.Messages...), chat.Message{Role: chat.RoleUser, Content: text})
	toks, re, err := c.turnTokens(msgs)
	if err != nil {
		return st, err
	}
	st.Prefilled, st.Reprefilled = len(toks), re
	base := c.sess.Pos()
	if base+len(toks) >= c.ctxSize {
		return st, fmt.Errorf("context full: %d + %d tokens > %d (use /ctx N for a larger context, which starts a new conversation)", base, len(toks), c.ctxSize)
	}
	t0 := time.Now()
	err = c.prefill(ctx, toks)
	st.PrefillTime = time.Since(t0)
	if err != nil {
		// Drop the turn: back to the session as it was.
		if c.sess.Pos() > base {
			if base > 0 {
				if rerr := c.sess.Rewind(context.Background(), base); rerr != nil {
					return st, rerr
				}
			} else {
				c.sess.Reset()
			}
		}
		st.SessionTokens = c.sess.Pos()
		if errors.Is(err, context.Canceled) {
			st.Stop = "interrupted-prefill"
		}
		return st, err
	}
	c.pending = nil
	c.conv.Messages = msgs

	eff := chat.EffectiveMode(c.mode, c.ctxSize)
	p := dsml.NewParser(dsml.Options{Thinking: eff.Thinking(), DisableToolCalls: true})
	sd := c.m.Tokenizer.NewStreamDecoder()
	em := &emitter{w: c.out, color: c.color}
	t1 := time.Now()
	st.Stop = "length"
	// emit shows an accepted token; it reports a failure of the stream
	// decoder.
	emit := func(id int32) error {
		st.Generated++
		b, err := sd.Add(id)
		if err != nil {
			return err
		}
		em.events(p.FeedBytes(b))
		return nil
	}
	// Greedy: Session.DecodeGreedy (on the GPU the token is chosen on the
	// device); sampled: Session.DecodePicked with the sampler's draw. On the
	// GPU either queues the next step before the host has read its token.
	var emitErr error
	accepted, last := 0, int32(0)
	take := func(id int32) bool {
		if c.stops[id] {
			st.Stop = "eos"
			return false
		}
		if emitErr = emit(id); emitErr != nil {
			return false
		}
		accepted, last = accepted+1, id
		return true
	}
	limit := min(c.opts.MaxTokens, st.Generated+c.ctxSize-c.sess.Pos())
	var n int
	if c.sampler.Options().Temperature <= 0 {
		d0 := c.sess.Stats()
		n, err = c.sess.DecodeGreedy(ctx, max(0, limit-st.Generated), take)
		d1 := c.sess.Stats()
		st.Drafts = engine.Stats{Drafted: d1.Drafted - d0.Drafted, Accepted: d1.Accepted - d0.Accepted,
			Checked: d1.Checked - d0.Checked, CheckAccepted: d1.CheckAccepted - d0.CheckAccepted}
	} else {
		o := c.sampler.Options()
		n, err = c.sess.DecodePicked(ctx, max(0, limit-st.Generated), engine.FilterFor(o), func(l *engine.Logits) (int32, bool) {
			id := c.sampler.SampleLogits(l, o)
			return id, take(id)
		})
	}
	switch {
	case emitErr != nil:
		return st, emitErr
	case err != nil && errors.Is(err, context.Canceled):
		if accepted > n && c.sess.Pos() < c.ctxSize {
			c.pending = append(c.pending, last)
		}
		st.Stop = "interrupted"
	case err != nil:
		return st, err
	case st.Stop != "eos" && st.Generated < c.opts.MaxTokens && c.sess.Pos() >= c.ctxSize:
		st.Stop = "context"
	}
	st.GenTime = time.Since(t1)
	em.events(p.FeedBytes(sd.Flush()))
	em.events(p.Finish())
	em.end()
	res := p.Result()
	st.Text, st.Reasoning = res.Text, res.Reasoning
	c.conv.Messages = append(c.conv.Messages, chat.Message{Role: chat.RoleAssistant, Content: res.Text, Reasoning: res.Reasoning})
	// The answer is closed by EOS in the transcript; the session gets it
	// with the next turn's prefill.
	c.pending = append(c.pending, c.eos)
	st.SessionTokens = c.sess.Pos()
	return st, nil
}

// emitter writes parser events: reasoning dimmed (or between markers when
// colours are off), then the answer.
type emitter struct {
	w         io.Writer
	color     bool
	reasoning bool
	any       bool
	atBOL     bool
}

func (e *emitter) write(s string) {
	if s == "" {
		return
	}
	io.WriteString(e.w, s)
	e.any = true
	e.atBOL = strings.HasSuffix(s, "\n")
}

func (e *emitter) endReasoning() {
	if !e.reasoning {
		return
	}
	e.reasoning = false
	if e.color {
		io.WriteString(e.w, "\x1b[0m")
	}
	if !e.atBOL {
		e.write("\n")
	}
	if !e.color {
		e.write("[end of thinking]\n")
	}
	e.write("\n")
}

func (e *emitter) events(evs []dsml.Event) {
	for _, ev := range evs {
		switch ev.Kind {
		case dsml.EventReasoning:
			if ev.Text == "" {
				continue
			}
			if !e.reasoning {
				e.reasoning = true
				if e.color {
					io.WriteString(e.w, "\x1b[2m")
				} else {
					e.write("[thinking]\n")
				}
			}
			e.write(ev.Text)
		case dsml.EventText:
			if ev.Text == "" {
				continue
			}
			e.endReasoning()
			e.write(ev.Text)
		}
	}
}

func (e *emitter) end() {
	e.endReasoning()
	if e.any && !e.atBOL {
		e.write("\n")
	}
}
