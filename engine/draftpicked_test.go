package engine_test

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"ds4go/engine"
)

// pickedOptions are the draws of pickedRun with seed: with a top-k cap
// (no PickFilter: the logits whole) for odd seeds, else min-p alone (a
// filter: a SpecCandidater's candidates).
func pickedOptions(seed uint64) engine.SamplerOptions {
	o := engine.SamplerOptions{Temperature: 1.3, MinP: 0.01, Seed: seed}
	if seed%2 == 1 {
		o.TopK = 40
	}
	return o
}

// pickedRun decodes n tokens through DecodePicked, each drawn by a sampler
// with pickedOptions(seed), and returns them with the top logit of every
// step the draws read (the greedy choice's, through the candidates when
// they came), in order.
func pickedRun(t *testing.T, s *engine.Session, n int, seed uint64) (toks []int32, seen []uint64) {
	t.Helper()
	o := pickedOptions(seed)
	sm := engine.NewSampler(o)
	got, err := s.DecodePicked(context.Background(), n, engine.FilterFor(o), func(l *engine.Logits) (int32, bool) {
		if c := l.Candidates(); c != nil {
			seen = append(seen, uint64(c.Top)<<32|uint64(math.Float32bits(c.TopLogit)))
		} else {
			top := engine.Greedy(l.All())
			seen = append(seen, uint64(top)<<32|uint64(math.Float32bits(l.All()[top])))
		}
		tok := sm.SampleLogits(l, o)
		toks = append(toks, tok)
		return tok, true
	})
	if err != nil || got != n || len(toks) != n {
		t.Fatalf("decoded %d (%d picked) of %d: %v", got, len(toks), n, err)
	}
	return toks, seen
}

// TestDraftPickedSameTokens: speculative sampled decoding (DecodePicked
// with Options.Draft) draws plain DecodePicked's tokens from the same seed,
// its picks reading the same steps' logits in the same order (each step's
// greedy choice and top logit compared, the whole rows or their
// candidates), and ends with plain decoding's logits, whatever the drafts:
// the MTP block's own (rejected on random weights), always right (an
// oracle of plain decoding's draws), right every other time, or wrong
// until speculation pauses and right after; across a prefill, a continued
// prompt and a rewind.
func TestDraftPickedSameTokens(t *testing.T) {
	onHostPath(t, draftPickedSameTokens)
}

// TestDraftPickedPipelinedSameTokens is TestDraftPickedSameTokens through
// the pipelined pass (SpecPipeliner: the draft made by the adapter's
// device-side ops; SpecCandidater: the rows' candidates where the draws
// have a filter, every third time too many of them, the rows then read
// with VerifyLogits).
func TestDraftPickedPipelinedSameTokens(t *testing.T) {
	onPipelinedPath(t, draftPickedSameTokens)
}

func draftPickedSameTokens(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32)) {
	ctx := context.Background()
	prompt := tokens(45, 512)
	more := tokens(70, 512)[50:]
	type step struct {
		name  string
		start func(s *engine.Session) // what comes before the decode
		gen   int
	}
	steps := []step{
		{"prefill", func(s *engine.Session) {
			if err := s.Prefill(ctx, prompt); err != nil {
				t.Fatal(err)
			}
		}, 31},
		{"continue", func(s *engine.Session) {
			if err := s.Prefill(ctx, more); err != nil {
				t.Fatal(err)
			}
		}, 9},
		{"rewind", func(s *engine.Session) {
			if err := s.Rewind(ctx, s.Pos()-7); err != nil {
				t.Fatal(err)
			}
		}, 40},
	}
	plain := newSess(t, be, engine.Options{ChunkSize: 7})
	var want [][]int32
	var wantSeen [][]uint64
	var wantLogits [][]float32
	starts := make([]int, len(steps))
	for i, st := range steps {
		st.start(plain)
		starts[i] = plain.Pos()
		toks, seen := pickedRun(t, plain, st.gen, uint64(i+1))
		want, wantSeen = append(want, toks), append(wantSeen, seen)
		wantLogits = append(wantLogits, slices.Clone(plain.Logits()))
	}
	for _, mode := range []string{"model", "oracle", "alternate", "wrong, then oracle"} {
		t.Run(mode, func(t *testing.T) {
			var truth map[int]int32
			step := 0
			o := engine.Options{ChunkSize: 7, Draft: true}
			if mode != "model" {
				setOverride(&o, func(pos int, d int32) int32 {
					oracle := mode == "oracle" || (mode == "alternate" && pos%2 == 0) || (mode == "wrong, then oracle" && step >= 2)
					if tok, ok := truth[pos]; ok && oracle {
						return tok
					}
					return (d + 1) % 512
				})
			}
			s := newSess(t, be, o)
			var byStep []engine.Stats
			for i, st := range steps {
				step = i
				st.start(s)
				truth = map[int]int32{}
				for j, tok := range want[i] {
					truth[starts[i]+j] = tok
				}
				got, seen := pickedRun(t, s, st.gen, uint64(i+1))
				if !slices.Equal(got, want[i]) {
					t.Fatalf("%s: tokens %v, want %v", st.name, got, want[i])
				}
				if !slices.Equal(seen, wantSeen[i]) {
					t.Fatalf("%s: the picks read other logits (or in another order)", st.name)
				}
				if !slices.Equal(s.Logits(), wantLogits[i]) {
					t.Fatalf("%s: logits differ", st.name)
				}
				if want := append(slices.Clone(plain.Tokens()[:starts[i]]), want[i]...); !slices.Equal(s.Tokens(), want) {
					t.Fatalf("%s: session tokens differ", st.name)
				}
				byStep = append(byStep, s.Stats())
			}
			if h, ok := be.(*hostSpec); ok && h.cands == 0 {
				t.Fatal("the pipelined pass read no candidates")
			}
			st := s.Stats()
			t.Logf("%s: %d drafts, %d accepted; %d checked, %d matched", mode, st.Drafted, st.Accepted, st.Checked, st.CheckAccepted)
			if st.Drafted == 0 {
				t.Fatal("nothing drafted")
			}
			switch mode {
			case "oracle":
				if st.Accepted != st.Drafted || st.Checked != 0 {
					t.Errorf("oracle drafts: %d of %d accepted, %d only checked", st.Accepted, st.Drafted, st.Checked)
				}
			case "alternate":
				if st.Accepted == 0 || st.Accepted == st.Drafted {
					t.Errorf("alternate drafts: %d of %d accepted", st.Accepted, st.Drafted)
				}
			case "wrong, then oracle":
				if byStep[1].Checked == 0 || byStep[1].Accepted != 0 {
					t.Errorf("wrong drafts: %d only checked, %d of %d verified accepted", byStep[1].Checked, byStep[1].Accepted, byStep[1].Drafted)
				}
				if last, before := byStep[2], byStep[1]; last.Accepted == before.Accepted {
					t.Errorf("oracle drafts after wrong ones: none accepted in the last step (%+v)", last)
				}
			}
		})
	}
}

// TestDraftPickedRefused: a pick that refuses the token after a verified
// pass, the confirmed draft or the token after it, ends the run with the
// session holding the tokens picked before (plain decoding's draws) and the
// logits after the last of them. On the host path and the pipelined one.
func TestDraftPickedRefused(t *testing.T) {
	onBothPaths(t, draftPickedRefused)
}

func draftPickedRefused(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32)) {
	ctx := context.Background()
	prompt := tokens(30, 512)
	want, _ := pickedRun(t, prefilled(t, be, engine.Options{}, prompt), 12, 9)
	for _, stop := range []int{1, 2, 3, 4, 5} {
		o := engine.Options{Draft: true}
		setOverride(&o, func(pos int, d int32) int32 { return want[pos-len(prompt)] })
		s := prefilled(t, be, o, prompt)
		so := pickedOptions(9)
		sm := engine.NewSampler(so)
		var got []int32
		n, err := s.DecodePicked(ctx, 12, engine.FilterFor(so), func(l *engine.Logits) (int32, bool) {
			tok := sm.SampleLogits(l, so)
			if len(got) == stop {
				return tok, false
			}
			got = append(got, tok)
			return tok, true
		})
		if err != nil || n != stop || !slices.Equal(got, want[:stop]) {
			t.Fatalf("stop %d: decoded %d %v (%v), want %v", stop, n, got, err, want[:stop])
		}
		if !slices.Equal(s.Tokens()[len(prompt):], want[:stop]) {
			t.Fatalf("stop %d: session holds %v", stop, s.Tokens()[len(prompt):])
		}
		if ref := prefilled(t, be, engine.Options{}, s.Tokens()); !slices.Equal(s.Logits(), ref.Logits()) {
			t.Fatalf("stop %d: logits are not those after the session's tokens", stop)
		}
		if s.Stats().Drafted == 0 && stop > 2 {
			t.Fatalf("stop %d: nothing drafted", stop)
		}
	}
}

// TestDraftPickedFetchError: a verification row that cannot be fetched
// when a pick asks for it ends the run with the error, and the session
// without logits (no draw from stale ones); with passes of one draft and
// of three.
func TestDraftPickedFetchError(t *testing.T) {
	ctx := context.Background()
	for _, depth := range []int{1, 3} {
		h := newHostSpec(mtpBackend(t))
		s := prefilled(t, h, engine.Options{Draft: true, DraftAlways: true, DraftDepth: depth}, tokens(30, 512))
		so := pickedOptions(2) // a filter: the rows' candidates come first
		sm := engine.NewSampler(so)
		picks, fails := 0, false
		_, err := s.DecodePicked(ctx, 20, engine.FilterFor(so), func(l *engine.Logits) (int32, bool) {
			picks++
			if l.Candidates() != nil && !fails {
				h.failLogits, fails = true, true
				if l.All() != nil {
					t.Error("logits fetched from a failing backend")
				}
				h.failLogits = false // only this fetch fails
			}
			return sm.SampleLogits(l, so), true
		})
		if err == nil || !strings.Contains(err.Error(), "verification logits lost") {
			t.Fatalf("depth %d: got %v after %d picks", depth, err, picks)
		}
		if s.Logits() != nil {
			t.Fatalf("depth %d: the session has logits after the failed fetch", depth)
		}
	}
}

// TestDraftPickedDeep runs TestDraftPickedSameTokens and
// TestDraftPickedRefused with 2 and 3 drafts a pass (Options.DraftDepth),
// on the host path and on the pipelined one (atDepths; hostSpec is a
// SpecCandidater too): each draft taken only when the pick's own draw
// lands on it, the tokens plain decoding's draws.
func TestDraftPickedDeep(t *testing.T) {
	atDepths(t, []namedCase{{"same tokens", draftPickedSameTokens}, {"refused", draftPickedRefused}})
}

// TestDraftPickedContextFills: sampled speculative decoding with three
// drafts a pass that runs into the session's context limit (drafts always
// right, so passes reach the limit's last positions) stops where plain
// DecodePicked stops, with the same tokens, the same error and the same
// logits; on the host path and the pipelined one.
func TestDraftPickedContextFills(t *testing.T) {
	ctx := context.Background()
	prompt := tokens(30, 512)
	const maxCtx = 30 + 23
	so := pickedOptions(4)
	decode := func(be engine.Backend, o engine.Options) ([]int32, int, error, *engine.Session) {
		o.MaxContext = maxCtx
		s := prefilled(t, be, o, prompt)
		sm := engine.NewSampler(so)
		var got []int32
		n, err := s.DecodePicked(ctx, 40, engine.FilterFor(so), func(l *engine.Logits) (int32, bool) {
			tok := sm.SampleLogits(l, so)
			got = append(got, tok)
			return tok, true
		})
		return got, n, err, s
	}
	want, wn, werr, ws := decode(mtpBackend(t), engine.Options{})
	if werr == nil || wn != maxCtx-len(prompt) {
		t.Fatalf("plain: %d decoded, err %v (want %d and the context full)", wn, werr, maxCtx-len(prompt))
	}
	oracle := func(pos int, d int32) int32 {
		if i := pos - len(prompt); i >= 0 && i < len(want) {
			return want[i]
		}
		return d
	}
	onBothPaths(t, func(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32)) {
		o := engine.Options{Draft: true, DraftAlways: true, DraftDepth: 3}
		setOverride(&o, oracle)
		got, n, err, s := decode(be, o)
		if n != wn || !slices.Equal(got, want) || (err == nil) != (werr == nil) || err.Error() != werr.Error() {
			t.Fatalf("decoded %d %v (%v), want %d %v (%v)", n, got, err, wn, want, werr)
		}
		if !slices.Equal(s.Tokens(), ws.Tokens()) || !slices.Equal(s.Logits(), ws.Logits()) {
			t.Fatal("the session's tokens or logits differ from plain decoding's")
		}
		if st := s.Stats(); st.Accepted == 0 {
			t.Fatalf("no draft taken: %+v", st)
		}
	})
}
