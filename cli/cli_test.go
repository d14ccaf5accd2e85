package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"ds4go/chat"
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

func TestDumpTokens(t *testing.T) {
	text := "Hello, world! Ciao 日本語 <｜User｜> 123"
	h, rc := run(t, "", "--demo", "--dump-tokens", "-p", text)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	m, err := openModel(&Options{Demo: true, Backend: "cpu"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var want strings.Builder
	ids := m.tok.Encode(text)
	var all []byte
	for _, id := range ids {
		b, err := m.tok.TokenBytes(id)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
		fmt.Fprintf(&want, "%d\t%q\n", id, b)
	}
	fmt.Fprintf(&want, "%d tokens\n", len(ids))
	if h.stdout.String() != want.String() {
		t.Errorf("dump:\n%s\nwant:\n%s", h.stdout.String(), want.String())
	}
	if string(all) != text {
		t.Errorf("pieces concatenate to %q", all)
	}
}

// suffixLen is the token count of a user turn and the assistant opening.
func suffixLen(t *testing.T, c *Chat, text string, mode chat.Mode) int {
	t.Helper()
	open := chat.ThinkStart
	if !mode.Thinking() {
		open = chat.ThinkEnd
	}
	return len(c.m.tok.EncodeWithSpecial(chat.UserToken + text + chat.AssistantToken + open))
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
	if got := h.chat.conv.Messages[0].Content; got != "from a file" {
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
	h := &harness{}
	env := h.env("tell me a long story\nand another\n")
	w := &interruptingWriter{intr: h.intr}
	env.Stdout = w
	rc := Main([]string{"--demo", "-n", "3000", "--seed", "3", "--nothink"}, env)
	if rc != 0 {
		t.Fatalf("rc %d: %s", rc, h.stderr.String())
	}
	if len(h.turns) != 2 {
		t.Fatalf("%d turns: %s", len(h.turns), h.stderr.String())
	}
	t1, t2 := h.turns[0], h.turns[1]
	if t1.st.Stop != "interrupted" || t1.st.Generated >= 3000 {
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
	m, err := openModel(&Options{Demo: true, Backend: "cpu"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
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
