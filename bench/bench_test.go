package bench

import (
	"context"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/gguf"
	"ds4go/model"
	"ds4go/synth"
)

// tinyBackend is the CPU backend on the Tiny synthetic model (Q8 scheme).
func tinyBackend(t *testing.T) (*cpu.Backend, *model.Weights) {
	t.Helper()
	data, err := synth.Build(synth.Options{Config: synth.Tiny(), Scheme: model.SchemeQ8, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	be, err := cpu.New(w, cpu.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	return be, w
}

func TestRunRewindsToFrontier(t *testing.T) {
	be, w := tinyBackend(t)
	s, err := engine.NewSession(be, engine.Options{ChunkSize: 16, MaxContext: 128})
	if err != nil {
		t.Fatal(err)
	}
	prompt := RandomTokens(48, w.Config.Vocab, 7)
	rows, err := Run(context.Background(), s, prompt, Options{Frontiers: []int{24, 48}, Gen: 5})
	if err != nil || len(rows) != 2 {
		t.Fatalf("%v %+v", err, rows)
	}
	if s.Pos() != 48 {
		t.Errorf("session at %d after the run, want 48", s.Pos())
	}
	got := s.Tokens()
	for i, tok := range prompt {
		if got[i] != tok {
			t.Fatalf("token %d: %d, want %d", i, got[i], tok)
		}
	}
	if rows[0].PrefillTokens != 24 || rows[1].PrefillTokens != 24 || rows[1].KVBytes <= rows[0].KVBytes {
		t.Errorf("rows %+v", rows)
	}
}

// TestRunWarmupLeavesNoTrace: a run after the warm-up prefill and rewind
// ends with the same tokens and bit-identical logits as one without.
func TestRunWarmupLeavesNoTrace(t *testing.T) {
	be, w := tinyBackend(t)
	prompt := RandomTokens(40, w.Config.Vocab, 9)
	var logits [2][]float32
	for i, warm := range []int{0, 24} {
		s, err := engine.NewSession(be, engine.Options{ChunkSize: 16, MaxContext: 128})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(context.Background(), s, prompt, Options{Frontiers: []int{20, 40}, Warmup: warm}); err != nil {
			t.Fatal(err)
		}
		if s.Pos() != 40 {
			t.Fatalf("warm-up %d: session at %d, want 40", warm, s.Pos())
		}
		logits[i] = append([]float32(nil), s.Logits()...)
		s.Close()
	}
	if len(logits[0]) == 0 || len(logits[0]) != len(logits[1]) {
		t.Fatalf("logits of %d and %d values", len(logits[0]), len(logits[1]))
	}
	for i := range logits[0] {
		if logits[0][i] != logits[1][i] {
			t.Fatalf("logit %d: %v after a warm-up, %v without", i, logits[1][i], logits[0][i])
		}
	}
}

func TestKVBytesFlash(t *testing.T) {
	c := model.Flash()
	l, err := engine.NewStateLayout(&c, 1<<20, 64)
	if err != nil {
		t.Fatal(err)
	}
	// row tables grow by 13,760 bytes per token (docs/engine.md), every 128 tokens
	if d := KVBytes(l, 128*1000) - KVBytes(l, 0); d != 13760*128*1000 {
		t.Errorf("growth over 128k tokens: %d, want %d", d, 13760*128*1000)
	}
}

func TestParseFrontiers(t *testing.T) {
	if fs, err := ParseFrontiers("2048, 4096,8192"); err != nil || len(fs) != 3 || fs[2] != 8192 {
		t.Errorf("%v %v", fs, err)
	}
	for _, s := range []string{"", "1,1", "4,2", "0", "a"} {
		if _, err := ParseFrontiers(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// TestAcceptanceReset: after Reset the same commits are drawn again.
func TestAcceptanceReset(t *testing.T) {
	a, err := NewAcceptance(0.5, 3)
	if err != nil {
		t.Fatal(err)
	}
	var first []bool
	for i := 0; i < 64; i++ {
		first = append(first, a.Accept(i))
	}
	a.Reset()
	n := 0
	for i, want := range first {
		if a.Accept(i) != want {
			t.Fatalf("draw %d after Reset differs", i)
		}
		if want {
			n++
		}
	}
	if n == 0 || n == len(first) || a.Rate() != 0.5 {
		t.Errorf("%d of %d committed at rate %g", n, len(first), a.Rate())
	}
}
