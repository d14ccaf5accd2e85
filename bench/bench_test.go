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
	return synthBackend(t, synth.Options{Config: synth.Tiny(), Scheme: model.SchemeQ8, Seed: 1})
}

// synthBackend is the CPU backend on the synthetic model of o.
func synthBackend(t *testing.T, o synth.Options) (*cpu.Backend, *model.Weights) {
	t.Helper()
	data, err := synth.Build(o)
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
	sameLogits(t, "a warm-up", logits[1], logits[0])
}

// sameLogits fails t unless with (after what) and without are the same
// non-empty logits bit for bit.
func sameLogits(t *testing.T, what string, with, without []float32) {
	t.Helper()
	if len(without) == 0 || len(without) != len(with) {
		t.Fatalf("logits of %d values after %s, %d without", len(with), what, len(without))
	}
	for i := range without {
		if with[i] != without[i] {
			t.Fatalf("logit %d: %v after %s, %v without", i, with[i], what, without[i])
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

// TestRunSettle: Options.Settle decodes untimed tokens before each timed
// decode and rewinds, leaving no trace — the same tokens and bit-identical
// logits as a run without — and (past a small RewindSlack) its rewinds
// re-prefill, which shows the tokens were decoded.
func TestRunSettle(t *testing.T) {
	be, w := tinyBackend(t)
	prompt := RandomTokens(40, w.Config.Vocab, 11)
	var logits [2][]float32
	for i, settle := range []int{0, 20} {
		s, err := engine.NewSession(be, engine.Options{ChunkSize: 16, MaxContext: 128, RewindSlack: 4})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := Run(context.Background(), s, prompt, Options{Frontiers: []int{20, 40}, Gen: 2, Settle: settle})
		if err != nil || len(rows) != 2 {
			t.Fatalf("settle %d: %v %+v", settle, err, rows)
		}
		if s.Pos() != 40 {
			t.Fatalf("settle %d: session at %d, want 40", settle, s.Pos())
		}
		if st := s.Stats(); (st.Rederivations > 0) != (settle > 0) {
			t.Errorf("settle %d: %d re-prefills", settle, st.Rederivations)
		}
		logits[i] = append([]float32(nil), s.Logits()...)
		s.Close()
	}
	sameLogits(t, "settling", logits[1], logits[0])
	s, err := engine.NewSession(be, engine.Options{ChunkSize: 16, MaxContext: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Run(context.Background(), s, prompt, Options{Frontiers: []int{20}, Gen: 2, Settle: -1}); err == nil {
		t.Error("settle -1 accepted")
	}
}

// TestRunSettleAccept: with a forced acceptance, each timed run follows a
// settle of its own kind and the draws restart after the speculative one,
// so the timed speculative run drafts and commits what it does without
// settling (every draft verified, one a pass) and leaves the draws where
// that run does, while the session's own counts include the settling's
// drafts.
func TestRunSettleAccept(t *testing.T) {
	be, w := synthBackend(t, synth.Options{Config: synth.Tiny(), Scheme: model.SchemeQ8, Seed: 2, MTP: synth.MTPInclude})
	prompt := RandomTokens(32, w.Config.Vocab, 5)
	var rows [2]Row
	var sessionDrafts [2]int
	var next [2]uint64 // the acceptance's next 64 draws after the run
	for i, settle := range []int{0, 6} {
		acc, err := NewAcceptance(0.5, 7)
		if err != nil {
			t.Fatal(err)
		}
		s, err := engine.NewSession(be, engine.Options{ChunkSize: 16, MaxContext: 96, RewindSlack: 24, Draft: true,
			DraftAlways: true, ForceAccept: acc.Accept})
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(context.Background(), s, prompt, Options{Frontiers: []int{32}, Gen: 10, Accept: acc, Settle: settle})
		if err != nil || len(r) != 1 {
			t.Fatalf("settle %d: %v %+v", settle, err, r)
		}
		rows[i], sessionDrafts[i] = r[0], s.Stats().Drafted
		s.Close()
		for b := range 64 {
			if acc.Accept(0) {
				next[i] |= 1 << b
			}
		}
	}
	if rows[0].Drafted == 0 || rows[0].Accepted == 0 || rows[0].Accepted == rows[0].Drafted {
		t.Fatalf("no mixed commits to compare: %+v", rows[0])
	}
	if next[1] != next[0] || rows[1].Drafted != rows[0].Drafted || rows[1].Accepted != rows[0].Accepted {
		t.Errorf("timed speculative run: %d drafts, %d committed after settling, then draws %x; %d, %d, %x without",
			rows[1].Drafted, rows[1].Accepted, next[1], rows[0].Drafted, rows[0].Accepted, next[0])
	}
	if sessionDrafts[1] <= rows[1].Drafted || sessionDrafts[0] != rows[0].Drafted {
		t.Errorf("session drafts %v against the timed runs' %d / %d: the settling drafted nothing", sessionDrafts, rows[0].Drafted, rows[1].Drafted)
	}
	s, err := engine.NewSession(be, engine.Options{ChunkSize: 16, MaxContext: 96, Draft: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	acc, err := NewAcceptance(1, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), s, prompt, Options{Frontiers: []int{32}, Gen: 1, HostGreedy: true, Accept: acc}); err == nil {
		t.Error("host-chosen steps with a forced acceptance accepted")
	}
}
