package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"ds4go/engine"
	"ds4go/synth"
)

// mtpBackend is tinyBackend's model with an MTP block.
func mtpBackend(t *testing.T) engine.Backend {
	t.Helper()
	return tinyBackendMTP(t, nil, synth.MTPInclude)
}

// greedyRun decodes n tokens and returns them.
func greedyRun(t *testing.T, s *engine.Session, n int) []int32 {
	t.Helper()
	var out []int32
	got, err := s.DecodeGreedy(context.Background(), n, func(tok int32) bool { out = append(out, tok); return true })
	if err != nil || got != n || len(out) != n {
		t.Fatalf("decoded %d (%d emitted) of %d: %v", got, len(out), n, err)
	}
	return out
}

func newSess(t *testing.T, be engine.Backend, o engine.Options) *engine.Session {
	t.Helper()
	s, err := engine.NewSession(be, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestDraftSameTokens: speculative greedy decoding gives the tokens and
// logits of plain greedy decoding, whatever the drafts: the MTP block's own
// (rejected on random weights), always right (an oracle), or right every
// other time; across prefills in chunks that leave the staged rows at
// every offset, a continued prompt, a rewind and a reset.
func TestDraftSameTokens(t *testing.T) {
	be := mtpBackend(t)
	ctx := context.Background()
	prompt := tokens(45, 512)
	more := tokens(70, 512)[50:]
	type step struct {
		name string
		do   func(s *engine.Session) []int32
	}
	steps := []step{
		{"prefill+decode", func(s *engine.Session) []int32 {
			if err := s.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
			return greedyRun(t, s, 23)
		}},
		{"continue", func(s *engine.Session) []int32 {
			if err := s.Prefill(ctx, more); err != nil {
				t.Fatal(err)
			}
			return greedyRun(t, s, 9)
		}},
		{"rewind", func(s *engine.Session) []int32 {
			if err := s.Rewind(ctx, s.Pos()-7); err != nil {
				t.Fatal(err)
			}
			return greedyRun(t, s, 12)
		}},
		{"one token", func(s *engine.Session) []int32 { return greedyRun(t, s, 1) }},
		{"reset", func(s *engine.Session) []int32 {
			s.Reset()
			if err := s.Prefill(ctx, prompt[:20]); err != nil {
				t.Fatal(err)
			}
			return greedyRun(t, s, 15)
		}},
	}
	plain := newSess(t, be, engine.Options{ChunkSize: 7})
	var want [][]int32
	var wantLogits [][]float32
	var wantSeq [][]int32
	for _, st := range steps {
		want = append(want, st.do(plain))
		wantLogits = append(wantLogits, slices.Clone(plain.Logits()))
		wantSeq = append(wantSeq, plain.Tokens())
	}
	for _, mode := range []string{"model", "oracle", "alternate"} {
		t.Run(mode, func(t *testing.T) {
			// The oracle knows plain decoding's next token at every
			// position of every step (recorded per step below).
			var truth map[int]int32
			o := engine.Options{ChunkSize: 7, Draft: true}
			switch mode {
			case "oracle", "alternate":
				o.DraftOverride = func(pos int, d int32) int32 {
					if tok, ok := truth[pos]; ok && (mode == "oracle" || pos%2 == 0) {
						return tok
					}
					return (d + 1) % 512 // surely wrong unless the model agrees
				}
			}
			s := newSess(t, be, o)
			for i, st := range steps {
				// Plain decoding's tokens of this step, by position.
				truth = map[int]int32{}
				start := s.Pos()
				switch st.name {
				case "prefill+decode":
					start += len(prompt)
				case "continue":
					start += len(more)
				}
				if st.name == "rewind" {
					start -= 7
				}
				if st.name == "reset" {
					start = 20
				}
				for j, tok := range want[i] {
					truth[start+j] = tok
				}
				got := st.do(s)
				if !slices.Equal(got, want[i]) {
					t.Fatalf("%s: tokens %v, want %v", st.name, got, want[i])
				}
				if !slices.Equal(s.Logits(), wantLogits[i]) {
					t.Fatalf("%s: logits differ", st.name)
				}
				if !slices.Equal(s.Tokens(), wantSeq[i]) {
					t.Fatalf("%s: session tokens differ", st.name)
				}
			}
			stats := s.Stats()
			t.Logf("%s: %d drafts, %d accepted", mode, stats.Drafted, stats.Accepted)
			if stats.Drafted == 0 {
				t.Error("nothing drafted")
			}
			switch mode {
			case "oracle":
				if stats.Accepted != stats.Drafted {
					t.Errorf("oracle drafts: %d of %d accepted", stats.Accepted, stats.Drafted)
				}
			case "alternate":
				if stats.Accepted == 0 || stats.Accepted == stats.Drafted {
					t.Errorf("alternate drafts: %d of %d accepted", stats.Accepted, stats.Drafted)
				}
			}
		})
	}
}

// TestDraftRefusedToken: a confirmed draft that emit refuses is not
// decoded; the session holds the token before it, with its logits.
func TestDraftRefusedToken(t *testing.T) {
	be := mtpBackend(t)
	ctx := context.Background()
	prompt := tokens(30, 512)
	plain := newSess(t, be, engine.Options{})
	if err := plain.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	want := greedyRun(t, plain, 6)
	s := newSess(t, be, engine.Options{Draft: true,
		DraftOverride: func(pos int, d int32) int32 { return want[pos-len(prompt)] }})
	if err := s.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	var got []int32
	n, err := s.DecodeGreedy(ctx, 10, func(tok int32) bool {
		if len(got) == 4 {
			return false
		}
		got = append(got, tok)
		return true
	})
	if err != nil || n != 4 || !slices.Equal(got, want[:4]) {
		t.Fatalf("decoded %d %v (%v), want 4 %v", n, got, err, want[:4])
	}
	if s.Pos() != len(prompt)+4 || !slices.Equal(s.Tokens()[len(prompt):], want[:4]) {
		t.Fatalf("session holds %v", s.Tokens()[len(prompt):])
	}
	// Its logits are those after the 4th token: the next choice is want[4].
	if engine.Greedy(s.Logits()) != want[4] {
		t.Fatalf("next choice %d, want %d", engine.Greedy(s.Logits()), want[4])
	}
	if rest := greedyRun(t, s, 2); !slices.Equal(rest, want[4:6]) {
		t.Fatalf("then %v, want %v", rest, want[4:6])
	}
}

// TestDraftNeedsMTP: Options.Draft on a model without an MTP block fails
// with a clear error.
func TestDraftNeedsMTP(t *testing.T) {
	_, err := engine.NewSession(tinyBackend(t, nil), engine.Options{Draft: true})
	if err == nil || !strings.Contains(err.Error(), "MTP block") {
		t.Fatalf("got %v", err)
	}
}

// TestDraftForceAccept: committed drafts the model did not choose (a
// benchmark's forced acceptance) leave the session as a plain session fed
// the same tokens: its logits bit for bit; speculation can be turned off
// and on.
func TestDraftForceAccept(t *testing.T) {
	be := mtpBackend(t)
	ctx := context.Background()
	prompt := tokens(30, 512)
	const X = 77
	s := newSess(t, be, engine.Options{ChunkSize: 8, Draft: true,
		DraftOverride: func(int, int32) int32 { return X },
		ForceAccept:   func(pos int) bool { return pos%3 != 0 }})
	if err := s.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	var got []int32
	if _, err := s.DecodeGreedy(ctx, 40, func(tok int32) bool { got = append(got, tok); return true }); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Accepted == 0 || st.Accepted == st.Drafted {
		t.Fatalf("%d of %d drafts committed", st.Accepted, st.Drafted)
	}
	xs := 0
	for _, tok := range got {
		if tok == X {
			xs++
		}
	}
	if xs < st.Accepted {
		t.Fatalf("%d committed drafts but %d tokens %d in %v", st.Accepted, xs, X, got)
	}
	plain := newSess(t, be, engine.Options{ChunkSize: 5})
	if err := plain.Prefill(ctx, s.Tokens()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plain.Logits(), s.Logits()) {
		t.Fatal("logits differ from a plain session fed the same tokens")
	}
	// Off: one token a pass, no drafts.
	if !s.SetSpeculate(false) {
		t.Fatal("SetSpeculate on a drafting session")
	}
	want := greedyRun(t, plain, 10)
	if got := greedyRun(t, s, 10); !slices.Equal(got, want) || s.Stats().Drafted != st.Drafted {
		t.Fatalf("speculation off: %v (%d drafts), want %v", got, s.Stats().Drafted-st.Drafted, want)
	}
	if newSess(t, be, engine.Options{}).SetSpeculate(true) {
		t.Error("SetSpeculate reports drafting on a session without Draft")
	}
}
