package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"ds4go/chat"
	"ds4go/tokenizer"
)

// FakeEngine is a deterministic stand-in for the model, for tests and for
// ds4-server --fake. It uses the real tokenizer: for a rendered prompt that
// ends with the assistant opening it "generates" Script(prompt) followed by
// EOS, token by token, by putting all the probability on the scripted token
// (so any sampling settings reproduce the script). Everything downstream of
// the logits (sampling, DSML parsing, streaming, stop sequences, usage and
// prefix reuse) is therefore exercised exactly as with a real model.
type FakeEngine struct {
	Tok *tokenizer.Tokenizer
	// Ctx is the context size in tokens.
	Ctx int
	// Script returns the raw text the model continues a rendered prompt
	// with (reasoning, "</think>", text, DSML…), without EOS. Nil selects
	// DemoScript.
	Script func(prompt string) string
	// TokenDelay is slept for every decoded token, PrefillDelay for every
	// prefilled token (checked against the context in between).
	TokenDelay, PrefillDelay time.Duration
	// NoiseToken, when NoiseLogit is non-zero, gets that logit at every
	// step (the scripted token has 30): with sampling it is sometimes
	// picked. Lenient keeps following the script by position after a
	// deviation (otherwise the fake ends with EOS).
	NoiseToken int32
	NoiseLogit float32
	Lenient    bool
	// NoiseAfter, if set, delays the noise until the generated text
	// contains it; NoiseNotAtTags withholds it where the scripted token
	// contains a tag's "<".
	NoiseAfter     string
	NoiseNotAtTags bool

	// Prefilled counts every token processed by Prefill (prefill and
	// decode), Sessions the sessions made.
	Prefilled atomic.Int64
	Sessions  atomic.Int64
	// Loaded counts tokens restored from payloads (disk KV cache hits).
	Loaded atomic.Int64

	once      sync.Once
	assistant int32
	thinkS    int32
	thinkE    int32
}

// NewFakeEngine returns a fake engine on the default DeepSeek V4 tokenizer.
func NewFakeEngine(ctxSize int, script func(string) string) (*FakeEngine, error) {
	tok, err := tokenizer.Default()
	if err != nil {
		return nil, err
	}
	return &FakeEngine{Tok: tok, Ctx: ctxSize, Script: script}, nil
}

// Tokenizer implements Engine.
func (e *FakeEngine) Tokenizer() *tokenizer.Tokenizer { return e.Tok }

// ContextSize implements Engine.
func (e *FakeEngine) ContextSize() int { return e.Ctx }

// NewSession implements Engine.
func (e *FakeEngine) NewSession() (Session, error) {
	e.once.Do(func() {
		e.assistant, _ = e.Tok.Lookup(chat.AssistantToken)
		e.thinkS, _ = e.Tok.Lookup(chat.ThinkStart)
		e.thinkE, _ = e.Tok.Lookup(chat.ThinkEnd)
	})
	e.Sessions.Add(1)
	return &fakeSession{e: e, logits: make([]float32, e.Tok.VocabSize())}, nil
}

type fakeSession struct {
	e        *FakeEngine
	tokens   []int32
	logits   []float32
	ok       bool
	prompt   []int32 // prompt of the cached reply
	reply    []int32
	lastNext int32
}

func (s *fakeSession) Tokens() []int32 { return s.tokens }

func (s *fakeSession) Close() {}

func (s *fakeSession) Logits() []float32 {
	if !s.ok {
		return nil
	}
	return s.logits
}

func (s *fakeSession) Rewind(ctx context.Context, n int) error {
	if n < 0 || n > len(s.tokens) {
		return fmt.Errorf("fake: rewind to %d of %d tokens", n, len(s.tokens))
	}
	s.tokens = s.tokens[:n]
	s.ok = n > 0
	if s.ok {
		s.computeLogits()
	}
	return nil
}

func (s *fakeSession) Prefill(ctx context.Context, toks []int32) error {
	if len(s.tokens)+len(toks) > s.e.Ctx {
		return fmt.Errorf("fake: %d + %d tokens > %d: %w", len(s.tokens), len(toks), s.e.Ctx, ErrContextFull)
	}
	vocab := int32(len(s.logits))
	for _, t := range toks {
		if t < 0 || t >= vocab {
			return fmt.Errorf("fake: token %d out of range", t)
		}
	}
	s.ok = false
	delay := s.e.PrefillDelay
	if len(toks) == 1 {
		delay = s.e.TokenDelay
	}
	for i := 0; i < len(toks); {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(32, len(toks)-i)
		if delay > 0 {
			time.Sleep(delay * time.Duration(n))
		}
		s.tokens = append(s.tokens, toks[i:i+n]...)
		s.e.Prefilled.Add(int64(n))
		i += n
	}
	if len(s.tokens) > 0 {
		s.ok = true
		s.computeLogits()
	}
	return nil
}

// computeLogits puts all the mass on the next scripted token.
func (s *fakeSession) computeLogits() {
	next := s.next()
	for i := range s.logits {
		s.logits[i] = -30
	}
	if s.e.NoiseLogit != 0 && s.noiseOn(next) {
		s.logits[s.e.NoiseToken] = s.e.NoiseLogit
	}
	s.logits[next] = 30
	s.lastNext = next
}

func (s *fakeSession) next() int32 {
	eos := s.e.Tok.EOS()
	a := -1
	for i := len(s.tokens) - 1; i >= 0; i-- {
		if s.tokens[i] == s.e.assistant {
			a = i
			break
		}
	}
	if a < 0 {
		return eos
	}
	end := a + 1
	if end < len(s.tokens) && (s.tokens[end] == s.e.thinkS || s.tokens[end] == s.e.thinkE) {
		end++
	}
	if end > len(s.tokens) {
		return eos
	}
	if !slices.Equal(s.prompt, s.tokens[:end]) {
		s.prompt = append(s.prompt[:0], s.tokens[:end]...)
		text, _ := s.e.Tok.Decode(s.prompt)
		script := s.e.Script
		if script == nil {
			script = DemoScript
		}
		s.reply = s.e.Tok.EncodeWithSpecial(script(string(text)))
	}
	gen := s.tokens[end:]
	if len(gen) >= len(s.reply) || (!s.e.Lenient && !slices.Equal(gen, s.reply[:len(gen)])) {
		return eos
	}
	return s.reply[len(gen)]
}

// LastUserText returns the text of the last user turn of a rendered prompt
// (for scripts).
func LastUserText(prompt string) string {
	i := strings.LastIndex(prompt, chat.UserToken)
	if i < 0 {
		return ""
	}
	s := prompt[i+len(chat.UserToken):]
	if j := strings.Index(s, chat.AssistantToken); j >= 0 {
		s = s[:j]
	}
	return s
}

// DemoScript is the fake engine's default behaviour: it reasons briefly
// (in thinking mode) and echoes the last user message. With tools in the
// prompt and a user message whose last line is "call NAME {json}", it calls
// that tool.
func DemoScript(prompt string) string {
	var sb strings.Builder
	user := LastUserText(prompt)
	if strings.HasSuffix(prompt, chat.ThinkStart) {
		sb.WriteString("The user wrote ")
		sb.WriteString(fmt.Sprint(len([]rune(user))))
		sb.WriteString(" characters; I will echo them.")
		sb.WriteString(chat.ThinkEnd)
	}
	// "call NAME {json}" on the last line of the user's text calls a tool.
	last := strings.TrimSpace(user)
	if i := strings.LastIndexByte(last, '\n'); i >= 0 {
		last = strings.TrimSpace(last[i+1:])
	}
	var unq string
	if strings.HasPrefix(last, `"`) && json.Unmarshal([]byte(last), &unq) == nil {
		last = unq
	}
	if rest, ok := strings.CutPrefix(last, "call "); ok && strings.Contains(prompt, "## Tools") {
		if name, args, ok := strings.Cut(rest, " "); ok {
			calls, err := chat.RenderToolCalls([]chat.ToolCall{{Name: name, Arguments: args}}, true)
			if err == nil {
				sb.WriteString(calls)
				return sb.String()
			}
		}
	}
	sb.WriteString("You said: ")
	sb.WriteString(user)
	return sb.String()
}

// noiseOn reports whether the noise token is offered at this step.
func (s *fakeSession) noiseOn(next int32) bool {
	if s.e.NoiseNotAtTags {
		if b, _ := s.e.Tok.TokenBytes(next); strings.Contains(string(b), "<") {
			return false
		}
	}
	if s.e.NoiseAfter == "" {
		return true
	}
	gen := s.tokens[min(len(s.prompt), len(s.tokens)):]
	b, _ := s.e.Tok.Decode(gen)
	return strings.Contains(string(b), s.e.NoiseAfter)
}

// The fake session's payload (for the disk KV cache): "FAKE", u32 count,
// the tokens. Its logits follow from the tokens.
const fakePayloadMagic = "FAKE"

// PayloadSize implements PayloadSession.
func (s *fakeSession) PayloadSize() int64 { return int64(8 + 4*len(s.tokens)) }

// WritePayload implements PayloadSession.
func (s *fakeSession) WritePayload(w io.Writer) error {
	b := make([]byte, 0, s.PayloadSize())
	b = append(b, fakePayloadMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.tokens)))
	for _, t := range s.tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	_, err := w.Write(b)
	return err
}

// ReadPayload implements PayloadSession.
func (s *fakeSession) ReadPayload(r io.Reader, n int64) error {
	if n < 8 || n > int64(8+4*s.e.Ctx) {
		return fmt.Errorf("fake: payload of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("fake: payload: %w", err)
	}
	cnt := binary.LittleEndian.Uint32(b[4:])
	if string(b[:4]) != fakePayloadMagic || int64(cnt)*4+8 != n || cnt == 0 {
		return fmt.Errorf("fake: not a fake payload")
	}
	toks := make([]int32, cnt)
	for i := range toks {
		toks[i] = int32(binary.LittleEndian.Uint32(b[8+4*i:]))
		if toks[i] < 0 || int(toks[i]) >= len(s.logits) {
			return fmt.Errorf("fake: payload token %d out of range", toks[i])
		}
	}
	s.tokens = toks
	s.ok = true
	s.computeLogits()
	s.e.Loaded.Add(int64(cnt))
	return nil
}
