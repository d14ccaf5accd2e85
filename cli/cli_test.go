package cli

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"ds4go/chat"
	"ds4go/loader"
	"ds4go/synth"
)

type turnRecord struct {
	st     TurnStats
	pos    int
	tokens []int32
	mode   chat.Mode
	ctx    int
}

type harness struct {
	stdout, stderr bytes.Buffer
	intr           chan struct{}
	mu             sync.Mutex
	turns          []turnRecord
	chat           *Chat
}

func (h *harness) env(stdin string) Env {
	h.intr = make(chan struct{}, 1)
	return Env{
		Stdin: strings.NewReader(stdin), Stdout: &h.stdout, Stderr: &h.stderr,
		Interrupts: h.intr, IsTerminal: func() bool { return false },
		onTurn: func(c *Chat, st TurnStats) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.chat = c
			h.turns = append(h.turns, turnRecord{st: st, pos: c.sess.Pos(), tokens: c.sess.Tokens(), mode: c.mode, ctx: c.ctxSize})
		},
	}
}

func run(t *testing.T, stdin string, args ...string) (*harness, int) {
	t.Helper()
	h := &harness{}
	rc := Main(args, h.env(stdin))
	return h, rc
}

func TestOneShot(t *testing.T) {
	h, rc := run(t, "", "--demo", "-p", "Hello there", "-n", "12", "--seed", "7")
	if rc != 0 {
		t.Fatalf("rc %d, stderr:\n%s", rc, h.stderr.String())
	}
	if h.stdout.Len() == 0 {
		t.Fatal("no output")
	}
	errs := h.stderr.String()
	for _, want := range []string{DemoWarning, "prefill ", "t/s", "generation "} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	if len(h.turns) != 1 {
		t.Fatalf("%d turns", len(h.turns))
	}
	st := h.turns[0].st
	if st.Generated == 0 || st.Generated > 12 || st.Prefilled == 0 {
		t.Errorf("stats %+v", st)
	}
	// Default mode is thinking: the reasoning block is marked.
	if st.Reasoning != "" && !strings.Contains(h.stdout.String(), "[thinking]") {
		t.Errorf("reasoning not marked:\n%s", h.stdout.String())
	}
	// Same seed, same output.
	h2, _ := run(t, "", "--demo", "-p", "Hello there", "-n", "12", "--seed", "7")
	if h2.stdout.String() != h.stdout.String() {
		t.Errorf("not deterministic for a seed:\n%q\n%q", h.stdout.String(), h2.stdout.String())
	}
}

func TestOneShotNoThink(t *testing.T) {
	h, rc := run(t, "", "--demo", "-p", "Hi", "-n", "6", "--nothink", "--temp", "0")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	if strings.Contains(h.stdout.String(), "[thinking]") || h.turns[0].st.Reasoning != "" {
		t.Errorf("reasoning in nothink mode:\n%s", h.stdout.String())
	}
}

func TestDefaultIsDemoWithoutModelFile(t *testing.T) {
	t.Chdir(t.TempDir()) // no ./ds4flash.gguf here
	h, rc := run(t, "", "-p", "x", "-n", "2")
	if rc != 0 || !strings.Contains(h.stderr.String(), DemoWarning) {
		t.Fatalf("rc %d, stderr:\n%s", rc, h.stderr.String())
	}
}

func TestMissingModel(t *testing.T) {
	h, rc := run(t, "", "-m", filepath.Join(t.TempDir(), "nope.gguf"), "-p", "x")
	if rc != 1 {
		t.Fatalf("rc %d", rc)
	}
	for _, want := range []string{"huggingface", "--demo"} {
		if !strings.Contains(h.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, h.stderr.String())
		}
	}
}

func openDemo(t *testing.T) *loader.Model {
	t.Helper()
	m, err := openModel(&Options{Demo: true, Backend: "cpu"}, io.Discard, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func dumpLines(t *testing.T, m *loader.Model, ids []int32) string {
	t.Helper()
	var want strings.Builder
	for _, id := range ids {
		b, err := m.Tokenizer.TokenBytes(id)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&want, "%d\t%q\n", id, b)
	}
	fmt.Fprintf(&want, "%d tokens\n", len(ids))
	return want.String()
}

func TestDumpTokens(t *testing.T) {
	m := openDemo(t)
	text := "Hello, world! Ciao 日本語 123"
	// Default: the prompt as the model sees it (chat template, thinking).
	h, rc := run(t, "", "--demo", "--dump-tokens", "-sys", "be brief", "-p", text)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	rendered, err := chat.Render(chat.Conversation{Messages: []chat.Message{
		{Role: chat.RoleSystem, Content: "be brief"}, {Role: chat.RoleUser, Content: text}}},
		chat.Options{Mode: chat.ModeThinking, ContextSize: DefaultCtx})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rendered, chat.BOS) || !strings.Contains(rendered, text) {
		t.Fatalf("rendered prompt %q", rendered)
	}
	if got, want := h.stdout.String(), dumpLines(t, m, m.Tokenizer.EncodeWithSpecial(rendered)); got != want {
		t.Errorf("dump:\n%s\nwant:\n%s", got, want)
	}
	// A text that is already a rendered chat is taken as it is.
	h, rc = run(t, "", "--demo", "--dump-tokens", "-p", rendered)
	if rc != 0 || h.stdout.String() != dumpLines(t, m, m.Tokenizer.EncodeWithSpecial(rendered)) {
		t.Errorf("rendered input: rc %d\n%s", rc, h.stdout.String())
	}
}

func TestDumpTokensRawJSON(t *testing.T) {
	m := openDemo(t)
	// Rare characters whose bytes the vocabulary splits mid-character, and
	// a protocol special (recognised, as the HF tokenizer does).
	text := "Ciao 日本語 \U0001F980\U0001F9A9 ꙮ𓀀 <｜User｜> x\n"
	file := filepath.Join(t.TempDir(), "p.txt")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	h, rc := run(t, "", "--demo", "--dump-tokens", "--raw", "--json", "--prompt-file", file)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	var got struct {
		IDs       []int32  `json:"ids"`
		Pieces    []string `json:"pieces"`
		HexPieces []int    `json:"hex_pieces"`
	}
	if err := json.Unmarshal(h.stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, h.stdout.String())
	}
	want := m.Tokenizer.EncodeWithSpecial(text)
	if !slices.Equal(got.IDs, want) || len(got.Pieces) != len(want) {
		t.Fatalf("ids %v, want %v", got.IDs, want)
	}
	if id, _ := m.Tokenizer.Lookup(chat.UserToken); !slices.Contains(got.IDs, id) {
		t.Errorf("%s not recognised: %v", chat.UserToken, got.IDs)
	}
	if len(got.HexPieces) == 0 {
		t.Errorf("no piece needed hex: %q", got.Pieces)
	}
	var all []byte
	for i, p := range got.Pieces {
		if slices.Contains(got.HexPieces, i) {
			b, err := hex.DecodeString(strings.TrimPrefix(p, "0x"))
			if err != nil || utf8.Valid(b) {
				t.Fatalf("piece %d %q: %v", i, p, err)
			}
			all = append(all, b...)
		} else {
			all = append(all, p...)
		}
	}
	if string(all) != text {
		t.Errorf("pieces concatenate to %q, want %q", all, text)
	}
}

func TestDumpLogprobs(t *testing.T) {
	out := filepath.Join(t.TempDir(), "lp.json")
	h, rc := run(t, "", "--demo", "--nothink", "-n", "6", "--dump-logprobs", out, "--logprobs-top-k", "5", "-p", "Hi")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	if h.stdout.Len() != 0 {
		t.Errorf("stdout %q: --dump-logprobs prints no text", h.stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var d logprobDump
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.TopK != 5 || len(d.Steps) == 0 || len(d.Steps) > 6 || d.PromptTokens == 0 {
		t.Fatalf("dump header %+v", d)
	}
	var sel []int32
	for _, st := range d.Steps {
		if len(st.TopLogprobs) != 5 || st.TopLogprobs[0].Token.ID != st.Selected.ID {
			t.Fatalf("step %d: %+v", st.Step, st)
		}
		for i, a := range st.TopLogprobs {
			if a.Logprob > 0 || (i > 0 && (a.Logit > st.TopLogprobs[i-1].Logit || a.Logprob > st.TopLogprobs[i-1].Logprob)) {
				t.Fatalf("step %d: alternatives out of order: %+v", st.Step, st.TopLogprobs)
			}
			if d := float64(a.Logit-st.TopLogprobs[0].Logit) - (a.Logprob - st.TopLogprobs[0].Logprob); d > 1e-4 || d < -1e-4 {
				t.Fatalf("step %d: logit and logprob differences disagree by %g", st.Step, d)
			}
		}
		sel = append(sel, st.Selected.ID)
	}
	// The same prompt answered greedily by the chat path gives the same
	// tokens.
	h2, rc := run(t, "", "--demo", "--nothink", "-n", "6", "--temp", "0", "-p", "Hi")
	if rc != 0 || len(h2.turns) != 1 {
		t.Fatalf("rc %d: %s", rc, h2.stderr.String())
	}
	tr := h2.turns[0]
	if tr.st.Prefilled != d.PromptTokens || !slices.Equal(tr.tokens[tr.st.Prefilled:], sel[:tr.st.Generated]) {
		t.Errorf("dumped greedy tokens %v after %d prompt tokens; the chat's: %v", sel, d.PromptTokens, tr.tokens)
	}
}

// suffixLen is the token count of a user turn and the assistant opening.
func suffixLen(t *testing.T, c *Chat, text string, mode chat.Mode) int {
	t.Helper()
	open := chat.ThinkStart
	if !mode.Thinking() {
		open = chat.ThinkEnd
	}
	return len(c.m.Tokenizer.EncodeWithSpecial(chat.UserToken + text + chat.AssistantToken + open))
}

func TestInteractiveReusesSession(t *testing.T) {
	h, rc := run(t, "first question\nsecond one\n/nothink\nthird\n", "--demo", "-n", "10", "--seed", "1")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	if len(h.turns) != 3 {
		t.Fatalf("%d turns; stderr:\n%s", len(h.turns), h.stderr.String())
	}
	t1, t2, t3 := h.turns[0], h.turns[1], h.turns[2]
	if t1.pos != t1.st.Prefilled+t1.st.Generated {
		t.Errorf("turn 1: pos %d, stats %+v", t1.pos, t1.st)
	}
	for i, tr := range []turnRecord{t2, t3} {
		prev := h.turns[i]
		if tr.st.Reprefilled {
			t.Errorf("turn %d re-prefilled the transcript", i+2)
		}
		// Only the new suffix: the EOS closing the last answer, the user
		// turn and the assistant opening.
		text := []string{"second one", "third"}[i]
		if want := 1 + suffixLen(t, h.chat, text, tr.mode); tr.st.Prefilled != want {
			t.Errorf("turn %d prefilled %d tokens, want %d", i+2, tr.st.Prefilled, want)
		}
		if tr.pos != prev.pos+tr.st.Prefilled+tr.st.Generated || tr.pos <= prev.pos {
			t.Errorf("turn %d: pos %d after %d, stats %+v", i+2, tr.pos, prev.pos, tr.st)
		}
		if !slices.Equal(tr.tokens[:prev.pos], prev.tokens) {
			t.Errorf("turn %d changed the session's earlier tokens", i+2)
		}
		if tr.tokens[prev.pos] != h.chat.eos {
			t.Errorf("turn %d does not start with the closing EOS", i+2)
		}
	}
	if t3.mode != chat.ModeChat {
		t.Errorf("/nothink: mode %v", t3.mode)
	}
	if n := strings.Count(h.stderr.String(), "t/s"); n != 6 {
		t.Errorf("%d rates printed, want 6 (2 per turn)", n)
	}
}

func TestCommands(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "msg.txt")
	if err := os.WriteFile(file, []byte("from a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := strings.Join([]string{
		"/help", "hello", "/ctx 300", "/think-max", "/nothink", "/think", "/bogus", "/ctx x",
		"/read " + file, "/read " + filepath.Join(dir, "none"), "/quit", "never sent",
	}, "\n") + "\n"
	h, rc := run(t, in, "--demo", "-n", "4", "--seed", "2")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	out, errs := h.stdout.String(), h.stderr.String()
	for _, want := range []string{"/think-max", "context: 300 tokens", "mode: think-max (context 300", "mode: nothink", "mode: think\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"unknown command /bogus", "/ctx needs", "none"} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	if len(h.turns) != 2 {
		t.Fatalf("%d turns, want 2 (hello, /read)", len(h.turns))
	}
	// /ctx started a new session: the /read turn is the first of it.
	r := h.turns[1]
	if r.ctx != 300 || r.pos != r.st.Prefilled+r.st.Generated {
		t.Errorf("after /ctx: ctx %d pos %d stats %+v", r.ctx, r.pos, r.st)
	}
	msgs := h.chat.conv.Messages
	if msgs[0].Role != chat.RoleSystem || msgs[0].Content != DefaultSystem {
		t.Errorf("the new conversation lost the default system prompt: %+v", msgs[0])
	}
	if got := msgs[1].Content; msgs[1].Role != chat.RoleUser || got != "from a file" {
		t.Errorf("/read sent %q", got)
	}
	// Ctrl+D (EOF) exits cleanly too.
	if _, rc := run(t, "hi", "--demo", "-n", "2"); rc != 0 {
		t.Errorf("EOF: rc %d", rc)
	}
}

// interruptingWriter sends one interrupt once the answer has started.
type interruptingWriter struct {
	buf  bytes.Buffer
	intr chan struct{}
	sent bool
	arm  bool
}

func (w *interruptingWriter) Write(p []byte) (int, error) {
	if w.arm && !w.sent && len(p) > 0 && !strings.HasPrefix(string(p), "ds4>") {
		w.sent = true
		w.intr <- struct{}{}
	}
	if strings.HasPrefix(string(p), "ds4>") {
		w.arm = !w.sent
	}
	return w.buf.Write(p)
}

func TestInterruptGeneration(t *testing.T) {
	for _, temp := range []string{"0.6", "0"} { // sampled; greedy (Session.DecodeGreedy)
		t.Run("temp "+temp, func(t *testing.T) { testInterruptGeneration(t, temp) })
	}
}

func testInterruptGeneration(t *testing.T, temp string) {
	h := &harness{}
	env := h.env("tell me a long story\nand another\n")
	w := &interruptingWriter{intr: h.intr}
	env.Stdout = w
	rc := Main([]string{"--demo", "-n", "300", "--seed", "3", "--nothink", "--temp", temp}, env)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	if len(h.turns) != 2 {
		t.Fatalf("%d turns: %s", len(h.turns), h.stderr.String())
	}
	t1, t2 := h.turns[0], h.turns[1]
	if t1.st.Stop != "interrupted" || t1.st.Generated >= 300 {
		t.Fatalf("turn 1 not interrupted: %+v", t1.st)
	}
	if !strings.Contains(h.stderr.String(), "interrupted") {
		t.Errorf("no notice:\n%s", h.stderr.String())
	}
	// The session continues: the second turn prefills the closing EOS (and
	// the token whose decode was interrupted, if any) plus its own suffix.
	extra := t2.st.Prefilled - suffixLen(t, h.chat, "and another", chat.ModeChat)
	if extra != 1 && extra != 2 || t2.st.Reprefilled {
		t.Errorf("turn 2 prefilled %d tokens beyond its suffix (re-prefill %v)", extra, t2.st.Reprefilled)
	}
	if t2.pos != t1.pos+t2.st.Prefilled+t2.st.Generated || t2.st.Generated == 0 {
		t.Errorf("turn 2: pos %d after %d, %+v", t2.pos, t1.pos, t2.st)
	}
}

func TestInterruptPrefillDropsTurn(t *testing.T) {
	m := openDemo(t)
	o, err := ParseFlags([]string{"-n", "3", "--seed", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newChat(m, o, io.Discard, io.Discard, false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Turn(context.Background(), "one"); err != nil {
		t.Fatal(err)
	}
	pos, msgs, pending := c.sess.Pos(), len(c.conv.Messages), slices.Clone(c.pending)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st, err := c.Turn(ctx, "two")
	if !errors.Is(err, context.Canceled) || st.Stop != "interrupted-prefill" {
		t.Fatalf("err %v, stats %+v", err, st)
	}
	if c.sess.Pos() != pos || len(c.conv.Messages) != msgs || !slices.Equal(c.pending, pending) {
		t.Fatalf("turn not dropped: pos %d→%d, messages %d→%d", pos, c.sess.Pos(), msgs, len(c.conv.Messages))
	}
	st, err = c.Turn(context.Background(), "three")
	if err != nil || st.Reprefilled || st.Generated == 0 {
		t.Fatalf("after the dropped turn: %v %+v", err, st)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--bogus"},
		{"--think", "--nothink"},
		{"-n", "0"},
		{"--ctx", "-1"},
		{"--dump-tokens"},
		{"extra"},
		{"--backend", "tpu"},
		{"--top-p", "2"},
		{"-m", "a.gguf", "--demo"},
		{"--temp", "x"},
	} {
		var stderr bytes.Buffer
		rc := Main(args, Env{Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: &stderr, Interrupts: make(chan struct{})})
		if rc != 2 {
			t.Errorf("%q: rc %d", args, rc)
		}
		if !strings.Contains(stderr.String(), "usage: ds4") {
			t.Errorf("%q: no usage:\n%s", args, stderr.String())
		}
	}
	if rc := Main([]string{"--help"}, Env{Stdout: io.Discard, Stderr: io.Discard, Interrupts: make(chan struct{})}); rc != 0 {
		t.Errorf("--help: rc %d", rc)
	}
}

func TestDS4Defaults(t *testing.T) {
	o, err := ParseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Temp != 1 || o.TopP != 1 || o.MinP != 0.05 || o.TopK != 0 || o.MaxTokens != 50000 || o.Ctx != 32768 ||
		o.System != DefaultSystem || o.Backend != "cpu" || o.Mode() != chat.ModeThinking {
		t.Errorf("defaults differ from ds4.c's: %+v", o)
	}
	o, err = ParseFlags([]string{"-sys", "", "--tokens", "7", "--cuda", "--fast", "--quality"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.System != "" || o.MaxTokens != 7 || o.Backend != "cuda" || o.Fast {
		t.Errorf("aliases: %+v", o)
	}
}

func TestInspect(t *testing.T) {
	h, rc := run(t, "", "--demo", "--inspect")
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	for _, want := range []string{"deepseek4 q8: 6 layers", "vocabulary 129280 tokens", "compress ratios [0 0 4 128 4 128]", "differs from Flash"} {
		if !strings.Contains(h.stdout.String(), want) {
			t.Errorf("--inspect lacks %q:\n%s", want, h.stdout.String())
		}
	}
}

// TestMTPSpeculative: --mtp FILE --mtp-draft 2 (and 3, 5) answers a greedy
// prompt with the tokens of plain greedy decoding, drafting with the
// separate MTP file; --mtp-draft 17, and --mtp-draft 2 without an MTP
// block, are refused.
func TestMTPSpeculative(t *testing.T) {
	dir := t.TempDir()
	main, mtp := filepath.Join(dir, "m.gguf"), filepath.Join(dir, "mtp.gguf")
	c := synth.DemoConfig()
	ctx := context.Background()
	if err := synth.WriteFile(ctx, main, synth.Options{Config: c, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	if err := synth.WriteFile(ctx, mtp, synth.Options{Config: c, Seed: 1, MTP: synth.MTPOnly}); err != nil {
		t.Fatal(err)
	}
	args := []string{"-m", main, "-p", "Hello there", "-n", "24", "--temp", "0", "--nothink"}
	plain, rc := run(t, "", args...)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, plain.stderr.String())
	}
	// --mtp-draft 3 and 5: deeper drafts (the block run again over its own
	// output), the same answer
	for _, k := range []string{"3", "5"} {
		deep, rc := run(t, "", append(args, "--mtp", mtp, "--mtp-draft", k)...)
		if rc != 0 {
			t.Fatalf("--mtp-draft %s: rc %d: %s", k, rc, deep.stderr.String())
		}
		if deep.stdout.String() != plain.stdout.String() || deep.chat.sess.Stats().Drafted == 0 {
			t.Errorf("--mtp-draft %s: answer differs or nothing drafted (%+v):\n%q\n%q", k, deep.chat.sess.Stats(), deep.stdout.String(), plain.stdout.String())
		}
	}
	if _, rc := run(t, "", append(args, "--mtp", mtp, "--mtp-draft", "17")...); rc == 0 {
		t.Error("--mtp-draft 17 accepted")
	}
	spec, rc := run(t, "", append(args, "--mtp", mtp, "--mtp-draft", "2")...)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, spec.stderr.String())
	}
	if spec.stdout.String() != plain.stdout.String() || !slices.Equal(spec.turns[0].tokens, plain.turns[0].tokens) {
		t.Errorf("speculative answer differs:\n%q\n%q", spec.stdout.String(), plain.stdout.String())
	}
	if st := spec.chat.sess.Stats(); st.Drafted == 0 {
		t.Errorf("nothing drafted: %+v", st)
	}
	// the turn line counts the turn's drafts
	if d := spec.turns[0].st.Drafts; d.Drafted == 0 || !strings.Contains(spec.stderr.String(), fmt.Sprintf("; drafts %d, %d committed", d.Drafted, d.Accepted)) {
		t.Errorf("turn drafts %+v, stderr %q", d, spec.stderr.String())
	}
	if strings.Contains(plain.stderr.String(), "; drafts ") {
		t.Errorf("a plain turn's line mentions drafts: %q", plain.stderr.String())
	}
	bad, rc := run(t, "", append(args, "--mtp-draft", "2")...)
	if rc == 0 || !strings.Contains(bad.stderr.String(), "needs an MTP block") {
		t.Errorf("--mtp-draft 2 without an MTP block: rc %d, %s", rc, bad.stderr.String())
	}
	bad, rc = run(t, "", append(args, "--mtp", main)...)
	if rc == 0 || !strings.Contains(bad.stderr.String(), "MTP file") {
		t.Errorf("a model file as --mtp: rc %d, %s", rc, bad.stderr.String())
	}
}
