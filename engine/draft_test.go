package engine_test

import (
	"context"
	"errors"
	"fmt"
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
	onHostPath(t, draftSameTokens)
}

// TestDraftPipelinedSameTokens is TestDraftSameTokens through the engine's
// pipelined pass (SpecPipeliner), on an adapter that makes its device-side
// choices with the CPU backend's Head and Greedy; its drafts overridden by
// the adapter, since Options.DraftOverride takes the host path.
func TestDraftPipelinedSameTokens(t *testing.T) {
	onPipelinedPath(t, draftSameTokens)
}

// draftCase is a speculative decoding check run on a backend, with
// setOverride installing a drafts' override for a session's options.
type draftCase func(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32))

// onHostPath runs c on the CPU backend, overrides through
// Options.DraftOverride (the host path).
func onHostPath(t *testing.T, c draftCase) {
	c(t, mtpBackend(t), func(o *engine.Options, f func(int, int32) int32) { o.DraftOverride = f })
}

// onPipelinedPath runs c through the engine's pipelined pass on hostSpec,
// overrides through the adapter, and checks that the pass ran.
func onPipelinedPath(t *testing.T, c draftCase) {
	h := newHostSpec(mtpBackend(t))
	onPipelined(t, h, c, func(o *engine.Options, f func(int, int32) int32) { h.override = f })
}

// onPipelined runs c on h with setOverride and checks that the pipelined
// pass ran and left no verification filter set.
func onPipelined(t *testing.T, h *hostSpec, c draftCase, setOverride func(*engine.Options, func(int, int32) int32)) {
	c(t, h, setOverride)
	if h.passes == 0 {
		t.Fatal("no pipelined pass")
	}
	if h.filter != nil {
		t.Fatal("a verification filter left set after the run")
	}
}

// onBothPaths runs c on the host path, then on the pipelined one.
func onBothPaths(t *testing.T, c draftCase) {
	onHostPath(t, c)
	onPipelinedPath(t, c)
}

// hostSpec is a backend with an MTP block whose SpecPipeliner ops run
// through the host (MTPHead, Head and Greedy): the engine's pipelined
// speculative loop on the CPU backend, up to deep drafts a pass
// (DeepSpecPipeliner; 3 unless set). override, when set, replaces the
// draft for position pos (as Options.DraftOverride does on the host path).
type hostSpec struct {
	engine.Backend
	dr         engine.Drafter
	override   func(pos int, d int32) int32
	deep       int
	mpos       int     // the MTP chunk's first position
	drafts     []int32 // the drafts not embedded yet
	res        []int32 // the latest verification's drafts
	choices    []int32 // … and greedy choices after its rows
	n          int     // the verification chunk's tokens
	logits     []float32
	passes     int
	deepPasses int                // passes of more than one draft
	filter     *engine.PickFilter // SetVerifyFilter's
	cands      int                // VerifyCandidates calls with a filter
	failLogits bool               // VerifyLogits fails
}

func newHostSpec(be engine.Backend) *hostSpec {
	return &hostSpec{Backend: be, dr: be.(engine.Drafter), deep: 3}
}

func (h *hostSpec) HasMTP() bool { return h.dr.HasMTP() }
func (h *hostSpec) StageMTP(mb, src engine.Batch, first, n int) error {
	return h.dr.StageMTP(mb, src, first, n)
}
func (h *hostSpec) DropStagedMTP(mb engine.Batch, keep int) error {
	return h.dr.DropStagedMTP(mb, keep)
}
func (h *hostSpec) MTPEmbed(mb engine.Batch, pos int, tokens []int32) error {
	return h.dr.MTPEmbed(mb, pos, tokens)
}
func (h *hostSpec) MTPEmbedDraft(mb engine.Batch, pos int, tokens []int32) error {
	if len(h.drafts) != 0 {
		return errors.New("an MTP draft chunk after drafts not embedded")
	}
	h.mpos = pos
	return h.dr.MTPEmbed(mb, pos, tokens)
}
func (h *hostSpec) MTPHead(mb engine.Batch, rows []int, logits []float32) error {
	return h.dr.MTPHead(mb, rows, logits)
}

// MTPHeadDraft drafts the greedy choice of row (at position mpos + row,
// predicting the token at mpos + row + 2), or override's.
func (h *hostSpec) MTPHeadDraft(mb, b engine.Batch, row int) error {
	lg := make([]float32, h.Config().Vocab)
	if err := h.dr.MTPHead(mb, []int{row}, lg); err != nil {
		return err
	}
	d := engine.Greedy(lg)
	if h.override != nil {
		d = h.override(h.mpos+row+2, d)
	}
	h.drafts = append(h.drafts, d)
	return nil
}

func (h *hostSpec) PassDrafts() int { return h.deep }

func (h *hostSpec) MTPEmbedNext(mb, b engine.Batch, pos int) error {
	if len(h.drafts) == 0 || len(h.drafts) >= h.deep {
		return fmt.Errorf("MTPEmbedNext after %d drafts (at most %d)", len(h.drafts), h.deep)
	}
	h.mpos = pos
	return h.dr.MTPEmbed(mb, pos, h.drafts[len(h.drafts)-1:])
}

func (h *hostSpec) EmbedDraft(b engine.Batch, pos int, tok int32) error {
	if len(h.drafts) == 0 {
		return errors.New("EmbedDraft without a draft")
	}
	if len(h.drafts) > 1 {
		h.deepPasses++
	}
	h.res, h.drafts = h.drafts, nil
	return h.Embed(b, pos, append([]int32{tok}, h.res...))
}

// Embed is the backend's, noting the chunk's tokens for HeadVerify.
func (h *hostSpec) Embed(b engine.Batch, pos int, tokens []int32) error {
	h.n = len(tokens)
	return h.Backend.Embed(b, pos, tokens)
}

func (h *hostSpec) EmbedAfterDraft(b engine.Batch, pos int, tok int32) error {
	if len(h.drafts) != 1 {
		return fmt.Errorf("EmbedAfterDraft after %d drafts", len(h.drafts))
	}
	h.res, h.drafts = h.drafts, nil
	return h.Embed(b, pos, []int32{tok})
}

func (h *hostSpec) HeadVerify(b engine.Batch) error {
	V := h.Config().Vocab
	rows := make([]int, h.n)
	for i := range rows {
		rows[i] = i
	}
	h.logits = make([]float32, h.n*V)
	if err := h.Head(b, rows, h.logits); err != nil {
		return err
	}
	h.choices = h.choices[:0]
	for r := range rows {
		h.choices = append(h.choices, engine.Greedy(h.logits[r*V:(r+1)*V]))
	}
	h.passes++
	return nil
}

func (h *hostSpec) VerifyResult(engine.Batch) (int32, int32, int32, error) {
	c1 := int32(-1)
	if len(h.choices) > 1 {
		c1 = h.choices[1]
	}
	return h.res[0], h.choices[0], c1, nil
}

func (h *hostSpec) VerifyResults(_ engine.Batch, drafts, choices []int32) error {
	if len(drafts) > len(h.res) || len(choices) > len(h.choices) {
		return fmt.Errorf("%d drafts and %d choices of a chunk of %d", len(drafts), len(choices), h.n)
	}
	copy(drafts, h.res)
	copy(choices, h.choices)
	return nil
}

func (h *hostSpec) VerifyLogits(_ engine.Batch, row int, dst []float32) error {
	if h.failLogits {
		return errors.New("verification logits lost")
	}
	if row < 0 || row >= h.n {
		return fmt.Errorf("verification logits of row %d of %d", row, h.n)
	}
	V := h.Config().Vocab
	copy(dst, h.logits[row*V:(row+1)*V])
	return nil
}

func (h *hostSpec) SetVerifyFilter(_ engine.Batch, f *engine.PickFilter) error {
	h.filter = f
	return nil
}

// VerifyCandidates sends a row's candidates as a device may (candidates),
// but every third time none, as for too many.
func (h *hostSpec) VerifyCandidates(_ engine.Batch, row int) (*engine.Candidates, error) {
	if h.filter == nil || row >= h.n {
		return nil, nil
	}
	if h.cands++; h.cands%3 == 0 {
		return nil, nil
	}
	V := h.Config().Vocab
	return candidates(h.logits[row*V:(row+1)*V], h.filter), nil
}

var (
	_ engine.DeepSpecPipeliner = (*hostSpec)(nil)
	_ engine.SpecCandidater    = (*hostSpec)(nil)
)

// draftSameTokens runs TestDraftSameTokens on be, setOverride installing
// the drafts' override for a session's options.
func draftSameTokens(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32)) {
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
	// "wrong, then oracle": drafts wrong until the third step, then the
	// oracle's (the policy pauses speculation, then resumes it);
	// "model, always": the model's drafts, every one verified
	// (Options.DraftAlways).
	for _, mode := range []string{"model", "model, always", "oracle", "alternate", "wrong, then oracle"} {
		t.Run(mode, func(t *testing.T) {
			// The oracle knows plain decoding's next token at every
			// position of every step (recorded per step below).
			var truth map[int]int32
			step := 0
			o := engine.Options{ChunkSize: 7, Draft: true, DraftAlways: mode == "model, always"}
			var f func(int, int32) int32
			switch mode {
			case "oracle", "alternate", "wrong, then oracle":
				f = func(pos int, d int32) int32 {
					oracle := mode == "oracle" || (mode == "alternate" && pos%2 == 0) || (mode != "alternate" && step >= 2)
					if tok, ok := truth[pos]; ok && oracle {
						return tok
					}
					return (d + 1) % 512 // surely wrong unless the model agrees
				}
			}
			setOverride(&o, f)
			s := newSess(t, be, o)
			var byStep []engine.Stats
			for i, st := range steps {
				step = i
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
				byStep = append(byStep, s.Stats())
			}
			stats := s.Stats()
			t.Logf("%s: %d drafts, %d accepted; %d checked, %d matched", mode, stats.Drafted, stats.Accepted, stats.Checked, stats.CheckAccepted)
			if stats.Drafted == 0 {
				t.Error("nothing drafted")
			}
			switch mode {
			case "model, always":
				if stats.Checked != 0 {
					t.Errorf("DraftAlways: %d drafts only checked", stats.Checked)
				}
			case "oracle":
				if stats.Accepted != stats.Drafted || stats.Checked != 0 {
					t.Errorf("oracle drafts: %d of %d accepted, %d only checked", stats.Accepted, stats.Drafted, stats.Checked)
				}
			case "alternate":
				if stats.Accepted == 0 || stats.Accepted == stats.Drafted || stats.Checked != 0 {
					t.Errorf("alternate drafts: %d of %d accepted, %d only checked", stats.Accepted, stats.Drafted, stats.Checked)
				}
			case "wrong, then oracle":
				// paused within the first two steps' 32 tokens of wrong
				// drafts; verifying again by the last step
				if c := byStep[1].Checked; c == 0 || byStep[1].Accepted != 0 || byStep[1].CheckAccepted != 0 {
					t.Errorf("wrong drafts: %d only checked (%d matched), %d of %d verified accepted", c, byStep[1].CheckAccepted, byStep[1].Accepted, byStep[1].Drafted)
				}
				if last, before := byStep[len(byStep)-1], byStep[len(byStep)-2]; last.Accepted == before.Accepted || stats.CheckAccepted == 0 {
					t.Errorf("oracle drafts after wrong ones: no verified draft accepted in the last step (%+v, before %+v)", last, before)
				}
			}
		})
	}
}

// TestDraftRefusedToken: a confirmed draft that emit refuses is not
// decoded; the session holds the token before it, with its logits. On the
// host path and the pipelined one (hostSpec).
func TestDraftRefusedToken(t *testing.T) {
	onBothPaths(t, draftRefusedToken)
}

func draftRefusedToken(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32)) {
	ctx := context.Background()
	prompt := tokens(30, 512)
	plain := newSess(t, be, engine.Options{})
	if err := plain.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	want := greedyRun(t, plain, 6)
	o := engine.Options{Draft: true}
	setOverride(&o, func(pos int, d int32) int32 {
		if i := pos - len(prompt); i < len(want) {
			return want[i]
		}
		return d // (deeper drafts past the run)
	})
	s := newSess(t, be, o)
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
// and on. On the host path and the pipelined one (hostSpec).
func TestDraftForceAccept(t *testing.T) {
	onBothPaths(t, draftForceAccept)
}

func draftForceAccept(t *testing.T, be engine.Backend, setOverride func(*engine.Options, func(int, int32) int32)) {
	ctx := context.Background()
	prompt := tokens(30, 512)
	const X = 77
	o := engine.Options{ChunkSize: 8, Draft: true, ForceAccept: func(pos int) bool { return pos%3 != 0 && pos%5 != 0 }}
	setOverride(&o, func(int, int32) int32 { return X })
	s := newSess(t, be, o)
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

// TestDraftDeep runs TestDraftSameTokens, TestDraftRefusedToken and
// TestDraftForceAccept with 2 and 3 drafts a pass (Options.DraftDepth: the
// block run again over its own output streams), on the host path and on
// the pipelined one (atDepths).
func TestDraftDeep(t *testing.T) {
	atDepths(t, []namedCase{{"same tokens", draftSameTokens}, {"refused", draftRefusedToken}, {"force accept", draftForceAccept}})
}

// namedCase is a draftCase with its subtests' name.
type namedCase struct {
	name string
	c    draftCase
}

// atDepths runs each case with 2 and 3 drafts a pass on the host path and
// on the pipelined one (hostSpec as a DeepSpecPipeliner of that depth),
// which must have run passes of several drafts.
func atDepths(t *testing.T, cases []namedCase) {
	for _, depth := range []int{2, 3} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/depth %d", c.name, depth), func(t *testing.T) {
				c.c(t, mtpBackend(t), func(o *engine.Options, f func(int, int32) int32) {
					o.DraftOverride, o.DraftDepth = f, depth
				})
			})
			t.Run(fmt.Sprintf("%s/depth %d/pipelined", c.name, depth), func(t *testing.T) {
				h := newHostSpec(mtpBackend(t))
				h.deep = depth
				onPipelined(t, h, c.c, func(o *engine.Options, f func(int, int32) int32) {
					h.override, o.DraftDepth = f, depth
				})
				if h.deepPasses == 0 {
					t.Fatal("no pipelined pass of several drafts")
				}
			})
		}
	}
}

// chunkCounter counts a backend's chunks by their token count.
type chunkCounter struct {
	engine.Backend
	engine.Drafter
	sizes map[int]int
}

func (c *chunkCounter) Embed(b engine.Batch, pos int, toks []int32) error {
	c.sizes[len(toks)]++
	return c.Backend.Embed(b, pos, toks)
}

// oracleDrafts returns a DraftOverride that drafts want's tokens (plain
// decoding's after prompt), seen recording each draft's position after
// the prompt (when not nil).
func oracleDrafts(prompt, want []int32, seen *[]int) func(int, int32) int32 {
	return func(pos int, d int32) int32 {
		i := pos - len(prompt)
		if seen != nil {
			*seen = append(*seen, i)
		}
		if i < len(want) {
			return want[i]
		}
		return d
	}
}

// countedRun opens a session on be (a chunkCounter's, or a wrapper of one,
// counting into sizes) with o, prefills prompt, and decodes len(want)
// tokens greedily, which must be want, sizes counting only the decode's
// chunks.
func countedRun(t *testing.T, be engine.Backend, sizes map[int]int, o engine.Options, prompt, want []int32) *engine.Session {
	t.Helper()
	s := newSess(t, be, o)
	if err := s.Prefill(context.Background(), prompt); err != nil {
		t.Fatal(err)
	}
	clear(sizes)
	if got := greedyRun(t, s, len(want)); !slices.Equal(got, want) {
		t.Fatalf("tokens %v, want %v", got, want)
	}
	return s
}

// TestDraftDeepPasses: with drafts always right, a pass of depth k commits
// k + 1 tokens — every verification is a chunk of k + 1 tokens but a last
// shorter one within the run's length — and the drafts reach the
// positions after the token of the pass (Options.DraftOverride's pos);
// with the model's own drafts (rejected on random weights) every
// verification still drafts k, and the tokens are plain decoding's.
func TestDraftDeepPasses(t *testing.T) {
	ctx := context.Background()
	prompt := tokens(40, 512)
	plain := newSess(t, mtpBackend(t), engine.Options{})
	if err := plain.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	want := greedyRun(t, plain, 22)
	for _, depth := range []int{2, 3, 5} {
		for _, c := range []struct{ oracle, pipelined bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
			oracle := c.oracle
			t.Run(fmt.Sprintf("depth %d, oracle %v, pipelined %v", depth, oracle, c.pipelined), func(t *testing.T) {
				be := mtpBackend(t)
				cc := &chunkCounter{Backend: be, Drafter: be.(engine.Drafter), sizes: map[int]int{}}
				var seen []int
				o := engine.Options{Draft: true, DraftDepth: depth, DraftAlways: true}
				var f func(int, int32) int32
				if oracle {
					f = oracleDrafts(prompt, want, &seen)
				} else {
					f = func(pos int, d int32) int32 { seen = append(seen, pos-len(prompt)); return d }
				}
				var run engine.Backend = cc
				h := newHostSpec(cc)
				if c.pipelined { // (hostSpec's passes of up to depth drafts)
					h.deep, h.override, run = depth, f, h
				} else {
					o.DraftOverride = f
				}
				st := countedRun(t, run, cc.sizes, o, prompt, want).Stats()
				if c.pipelined && h.deepPasses == 0 {
					t.Fatal("no pipelined pass of several drafts")
				}
				t.Logf("chunks by size %v; %d drafts, %d accepted", cc.sizes, st.Drafted, st.Accepted)
				if oracle {
					// passes of depth+1 tokens from the first; a shorter last
					full := (len(want) - 1) / (depth + 1)
					if cc.sizes[depth+1] != full || st.Accepted != st.Drafted {
						t.Fatalf("oracle: %d chunks of %d tokens, want %d; %d of %d drafts accepted", cc.sizes[depth+1], depth+1, full, st.Accepted, st.Drafted)
					}
					// each pass drafts positions P+1 … P+k, the next pass
					// from past them
					for i := 1; i < len(seen); i++ {
						if seen[i] <= seen[i-1] {
							t.Fatalf("oracle passes drafted positions %v", seen)
						}
					}
				} else {
					// a token a pass: depth+1-token passes while the run has
					// room for them, then one of each shorter size, the last
					// a single step
					for size := 1; size <= depth+1; size++ {
						w := 1
						if size == depth+1 {
							w = len(want) - depth
						}
						if cc.sizes[size] != w {
							t.Fatalf("model drafts: chunks by size %v, want %d of %d tokens", cc.sizes, w, size)
						}
					}
				}
			})
		}
	}
}

// TestDraftDepthOption: a depth outside [0, MaxDraftDepth] is refused.
func TestDraftDepthOption(t *testing.T) {
	for _, d := range []int{-1, engine.MaxDraftDepth + 1} {
		if _, err := engine.NewSession(mtpBackend(t), engine.Options{Draft: true, DraftDepth: d}); err == nil || !strings.Contains(err.Error(), "draft depth") {
			t.Errorf("depth %d: %v", d, err)
		}
	}
}
