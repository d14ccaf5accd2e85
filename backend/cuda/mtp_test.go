package cuda

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/model"
	"ds4go/synth"
)

// The MTP block (engine.Drafter) on the GPU against the CPU backend.

func mtpWeights(t testing.TB, c model.Config, scheme model.Scheme) *model.Weights {
	t.Helper()
	f, err := synth.BuildFile(synth.Options{Config: c, Scheme: scheme, Seed: 7, MTP: synth.MTPInclude})
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if w.MTP == nil {
		t.Fatal("no MTP block")
	}
	return w
}

// eachMode runs f on a backend of w in exact and then in fast mode, each
// backend closed after its run.
func eachMode(t testing.TB, w *model.Weights, f func(be *Backend, fast bool)) {
	for _, fast := range []bool{false, true} {
		func() {
			be := testBackend(t, w, Options{Fast: fast})
			defer be.Close()
			f(be, fast)
		}()
	}
}

// mtpForward runs blocks [from, to) on b, the chunk at pos, as the engine
// does (engine.RunBlocks).
func mtpForward(t testing.TB, be engine.Backend, b engine.Batch, st engine.State, from, to, pos int) {
	t.Helper()
	if err := engine.RunBlocks(context.Background(), be, b, st, from, to, pos, nil); err != nil {
		t.Fatal(err)
	}
}

// mtpRows returns the MTP block's logits at every position 0 … len(toks)−2
// (row p reads the main model's streams at p and toks[p+1]): the main model
// over toks in chunks of 50, the block over the positions in chunks of
// `chunk` (the last ones one by one), its head over every row; and the main
// model's logits of every row.
func mtpRows(t testing.TB, be engine.Backend, toks []int32, chunk int) (mtp, main [][]float32) {
	t.Helper()
	dr := be.(engine.Drafter)
	c := be.Config()
	n := len(toks)
	layout, err := engine.NewStateLayout(c, n, engine.DefaultRewindSlack)
	if err != nil {
		t.Fatal(err)
	}
	ml := *layout
	ml.MTP = true
	st, err := be.NewState(layout)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Release()
	mst, err := be.NewState(&ml)
	if err != nil {
		t.Fatal(err)
	}
	defer mst.Release()
	const mainChunk = 50 // (fast mode's prompt kernels on chunks past 64 round further from the CPU)
	b, err := be.NewBatch(mainChunk)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	mb, err := be.NewBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Release()
	for p0 := 0; p0 < n; p0 += mainChunk {
		p1 := min(p0+mainChunk, n)
		if err := be.Embed(b, p0, toks[p0:p1]); err != nil {
			t.Fatal(err)
		}
		mtpForward(t, be, b, st, 0, c.Layers, p0)
		// staged before the head, as the engine does (the last row has no
		// next token)
		if err := dr.StageMTP(mb, b, 0, min(p1, n-1)-p0); err != nil {
			t.Fatal(err)
		}
		rows := make([]int, p1-p0)
		for i := range rows {
			rows[i] = i
		}
		lg := make([]float32, len(rows)*c.Vocab)
		if err := be.Head(b, rows, lg); err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			main = append(main, slices.Clone(lg[i*c.Vocab:(i+1)*c.Vocab]))
		}
	}
	for p0 := 0; p0 < n-1; {
		p1 := min(p0+chunk, n-1)
		if p0 >= n-1-4 {
			p1 = p0 + 1
		}
		if err := dr.MTPEmbed(mb, p0, toks[p0+1:p1+1]); err != nil {
			t.Fatal(err)
		}
		mtpForward(t, be, mb, mst, c.Layers, c.Layers+1, p0)
		rows := make([]int, p1-p0)
		for i := range rows {
			rows[i] = i
		}
		lg := make([]float32, len(rows)*c.Vocab)
		if err := dr.MTPHead(mb, rows, lg); err != nil {
			t.Fatal(err)
		}
		for i := range rows {
			mtp = append(mtp, slices.Clone(lg[i*c.Vocab:(i+1)*c.Vocab]))
		}
		p0 = p1
	}
	return mtp, main
}

// TestMTPMatchesCPU: the MTP block's logits (chunks and single positions)
// and speculative greedy decoding against the CPU backend, in exact and
// fast mode, and in exact mode with the attention in the serial order
// (/serial: OptAttnOrder 0 and cpu.Options.AttnSerial; the others use both
// backends' default, the segmented order).
func TestMTPMatchesCPU(t *testing.T) {
	gpu(t)
	cases := []schemeCase{
		{synth.Tiny(), model.SchemeQ8, false, false},
		{quantTiny(), model.SchemeQ2, false, false},
		{synth.Tiny(), model.SchemeF16, true, false},
		{synth.Tiny(), model.SchemeQ8, false, true},
	}
	defer func() { strict, fastBounds = true, false }()
	for _, tc := range cases {
		t.Run(tc.name(), func(t *testing.T) {
			strict, fastBounds = true, tc.fast
			w := mtpWeights(t, tc.cfg, tc.scheme)
			ref, err := cpu.New(w, tc.refOptions(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			be := testBackend(t, w, Options{Fast: tc.fast})
			if !be.HasMTP() {
				t.Fatal("no MTP block on the GPU")
			}
			toks := testTokens(150, tc.cfg.Vocab)
			want, wantMain := mtpRows(t, ref, toks, 37)
			got, gotMain := mtpRows(t, be, toks, 37)
			checkAgree(t, "main rows", wantMain, gotMain)
			// fast mode's MTP chunks multiply h_proj's n·HC rows in f16
			// (MatMulHalf from 8 rows): held to median 1e-3, top-1 0.99
			mtpCheck := func(what string, want, got [][]float32) {
				t.Helper()
				if !tc.fast {
					checkAgree(t, what, want, got)
					return
				}
				a := agree(want, got)
				t.Logf("%s: %v", what, a)
				if a.median > 1e-3 || a.top1 < 0.99 {
					t.Errorf("%s: outside median 1e-3, top-1 0.99", what)
				}
			}
			mtpCheck("MTP rows, chunks of 37", want, got)
			got, _ = mtpRows(t, be, toks, 1)
			mtpCheck("MTP rows, chunks of 1", want, got)

			// Speculative greedy decoding: the tokens of the CPU's plain
			// greedy decoding (exact mode).
			decode := func(be engine.Backend, draft bool) ([]int32, engine.Stats) {
				r := specDecode(t, be, engine.Options{ChunkSize: 32, MaxContext: 4096, Draft: draft}, toks[:70], 96, 96)
				return r.out, r.stats
			}
			plain, _ := decode(ref, false)
			spec, stats := decode(be, true)
			same := 0
			for same < len(plain) && same < len(spec) && plain[same] == spec[same] {
				same++
			}
			t.Logf("speculative greedy on the GPU: %d of %d tokens as the CPU's plain greedy; %d drafts, %d accepted",
				same, len(plain), stats.Drafted, stats.Accepted)
			if stats.Drafted == 0 {
				t.Error("nothing drafted")
			}
			if !tc.fast && same < len(plain) {
				t.Errorf("tokens differ at %d: cpu %v… gpu %v…", same, plain[same:min(same+8, len(plain))], spec[same:min(same+8, len(spec))])
			}
		})
	}
}

// mixedLogits prefills toks[:from] in chunks of 64, then walks the rest in
// passes of 1 and 2 tokens (alternating every step, as speculative
// decoding's plain steps and verifications do; all ones when mixed is
// false), and returns the logits after every token from `from` on.
func mixedLogits(t testing.TB, be engine.Backend, toks []int32, from int, mixed bool) [][]float32 {
	t.Helper()
	s := session(t, be, 64)
	ctx := context.Background()
	if err := s.Prefill(ctx, toks[:from]); err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	for p, i := from, 0; p < len(toks); i++ {
		n := 1
		if mixed && i%2 == 1 && p+2 <= len(toks) {
			n = 2
		}
		if err := s.PrefillAll(ctx, toks[p:p+n], func(_ int, l []float32) { out = append(out, slices.Clone(l)) }); err != nil {
			t.Fatal(err)
		}
		p += n
	}
	return out
}

// TestSpecPassesFlashLayers: on Flash-shaped layers (a ratio-4 layer whose
// indexer selects, a ratio-128 layer completing a row), decode passes of two
// tokens between one-token steps — speculative decoding's pattern, both as
// graphs — give the logits of one-token steps bit for bit in exact mode. In
// fast mode the two-token passes take other kernels (summing in other
// orders), and random q2 layers carry that drift far (median 2e-2, top-1
// 0.97 measured, as fast mode's chunks against exact mode in cuda/NOTES.md
// v15–v17): reported only.
func TestSpecPassesFlashLayers(t *testing.T) {
	gpu(t)
	if testing.Short() {
		t.Skip("short")
	}
	c := flash4(32)
	w := mtpWeights(t, c, model.SchemeQ2)
	toks := testTokens(300, c.Vocab)
	defer func() { strict, fastBounds = true, false }()
	eachMode(t, w, func(be *Backend, fast bool) {
		strict, fastBounds = !fast, fast
		ones := mixedLogits(t, be, toks, 100, false)
		mixed := mixedLogits(t, be, toks, 100, true)
		what := "exact"
		if fast {
			what = "fast"
		}
		checkAgree(t, what+": passes of 1 and 2 against passes of 1", ones, mixed)
	})
}

// TestSpecPipelinedMatchesHost: speculative decoding's pass with its
// choices on the device (SpecPipeliner: the draft straight into the
// verification chunk, three words read a pass) gives the tokens, drafts,
// acceptances and final logits of the host path (Options.DraftOverride,
// here the identity, takes it: MTPHead and Head's rows downloaded and
// Greedy on the host), bit for bit, in exact and fast mode; with drafts
// committed whatever the model chose (ForceAccept) both ways of a pass run,
// and a run cut short by emit leaves the logits of its last token. With
// no draft committed the policy pauses speculation: the passes that only
// check their draft (EmbedAfterDraft, a one-row HeadVerify) run too, the
// same ones both ways.
func TestSpecPipelinedMatchesHost(t *testing.T) {
	gpu(t)
	c := quantTiny()
	w := mtpWeights(t, c, model.SchemeQ2)
	toks := testTokens(120, c.Vocab)
	eachMode(t, w, func(be *Backend, fast bool) {
		for _, accept := range []struct {
			name   string
			commit func(pos int) bool
			check  bool // the policy pauses
		}{{"2 in 3", func(pos int) bool { return pos%3 != 0 }, false}, {"none", func(int) bool { return false }, true}} {
			o := engine.Options{ChunkSize: 32, MaxContext: 4096, Draft: true, ForceAccept: accept.commit}
			for _, limit := range []int{60, 23} {
				dev, host, _ := specDevHost(t, be, o, toks, limit, fmt.Sprintf("fast %v", fast))
				t.Logf("fast %v, %d tokens, commits %s: %d drafts, %d committed; %d checked", fast, limit, accept.name, dev.stats.Drafted, dev.stats.Accepted, dev.stats.Checked)
				if !slices.Equal(dev.toks, host.toks) {
					t.Fatalf("fast %v: tokens differ: device %v, host %v", fast, dev.toks[70:], host.toks[70:])
				}
				paused, verified := dev.stats.Checked > 0, dev.stats.Accepted > 0
				if dev.stats != host.stats || paused != accept.check || (!accept.check && !verified) {
					t.Fatalf("fast %v, commits %s: stats %+v on the device, %+v on the host", fast, accept.name, dev.stats, host.stats)
				}
				if k, ok := firstBitDiff(dev.logits, host.logits); !ok {
					t.Fatalf("fast %v, %d tokens: final logits differ at %d", fast, limit, k)
				}
			}
		}
	})
}

// TestSpecDeepPipelinedMatchesHost: passes of two and three drafts with
// their choices on the device (DeepSpecPipeliner: each next draft's token
// copied from the word of the one before, the drafts into the
// verification chunk, the words read once a pass) give the tokens, drafts,
// acceptances and final logits of the host path (Options.DraftOverride,
// the identity: draftChain and verifyChain with the rows downloaded), bit
// for bit, in exact and fast mode, with commits forced two in three (so
// passes end at every draft) and a run cut short by emit.
func TestSpecDeepPipelinedMatchesHost(t *testing.T) {
	gpu(t)
	c := quantTiny()
	w := mtpWeights(t, c, model.SchemeQ2)
	toks := testTokens(120, c.Vocab)
	eachMode(t, w, func(be *Backend, fast bool) {
		for _, depth := range []int{2, 3} {
			o := engine.Options{ChunkSize: 32, MaxContext: 4096, Draft: true, DraftDepth: depth, DraftAlways: true,
				ForceAccept: func(pos int) bool { return pos%3 != 0 }}
			for _, limit := range []int{60, 23} {
				dev, host, passes := specDevHost(t, be, o, toks, limit, fmt.Sprintf("fast %v, depth %d", fast, depth))
				t.Logf("fast %v, depth %d, %d tokens: %d drafts, %d committed; %d passes on the device", fast, depth, limit,
					dev.stats.Drafted, dev.stats.Accepted, passes)
				if !slices.Equal(dev.toks, host.toks) {
					t.Fatalf("fast %v, depth %d: tokens differ: device %v, host %v", fast, depth, dev.toks[70:], host.toks[70:])
				}
				if dev.stats != host.stats || dev.stats.Accepted == 0 || dev.stats.Accepted == dev.stats.Drafted {
					t.Fatalf("fast %v, depth %d: stats %+v on the device, %+v on the host", fast, depth, dev.stats, host.stats)
				}
				if k, ok := firstBitDiff(dev.logits, host.logits); !ok {
					t.Fatalf("fast %v, depth %d, %d tokens: final logits differ at %d", fast, depth, limit, k)
				}
			}
		}
	})
}

// specDevHost decodes up to limit of 60 tokens greedily after toks[:70]
// with o on be twice: through the device's pass, which must have run
// (GraphStats.SpecHeads), then on the host path (Options.DraftOverride, the
// identity); it returns both and the device's passes (what: the case, for
// the failure).
func specDevHost(t *testing.T, be *Backend, o engine.Options, toks []int32, limit int, what string) (dev, host specResult, passes int64) {
	t.Helper()
	heads := be.GraphStats().SpecHeads
	dev = specDecode(t, be, o, toks[:70], 60, limit)
	if passes = be.GraphStats().SpecHeads - heads; passes == 0 {
		t.Fatalf("%s: no pass with its choices on the device", what)
	}
	o.DraftOverride = func(_ int, d int32) int32 { return d }
	host = specDecode(t, be, o, toks[:70], 60, limit)
	return dev, host, passes
}

// TestSpecPassesFastTiny: fast mode's two-token passes (the pipelined Q8_0
// pairs, the split small products, the mixing products formed in HCPost
// for both tokens) between one-token steps, against one-token steps only,
// on the tiny models with Q8_0 and F16 weights, where fast mode's float
// orders move logits by rounding only: held to the bound of
// TestHCPostMixModel (median 1e-3, top-1 0.99); a token's parts or rows
// taken from the other token move them by far more.
func TestSpecPassesFastTiny(t *testing.T) {
	gpu(t)
	for _, scheme := range []model.Scheme{model.SchemeQ8, model.SchemeF16} {
		c := synth.Tiny()
		w := mtpWeights(t, c, scheme)
		toks := testTokens(260, c.Vocab)
		be := testBackend(t, w, Options{Fast: true})
		ones := mixedLogits(t, be, toks, 100, false)
		mixed := mixedLogits(t, be, toks, 100, true)
		a := agree(ones, mixed)
		t.Logf("%s: passes of 1 and 2 against passes of 1: %v", scheme.Name, a)
		if a.median > 1e-3 || a.top1 < 0.99 {
			t.Errorf("%s: median %g, top-1 %g: outside median 1e-3, top-1 0.99", scheme.Name, a.median, a.top1)
		}
		be.Close()
	}
}

// specResult is what specDecode returns.
type specResult struct {
	out, toks []int32 // the tokens emitted; the session's at the end
	logits    []float32
	stats     engine.Stats
}

// specDecode opens a session on be with options o, prefills prompt and
// decodes greedily up to max tokens, emit refusing the token after limit
// of them, and returns the tokens, the session's tokens and logits at the
// end, and its stats.
func specDecode(t *testing.T, be engine.Backend, o engine.Options, prompt []int32, max, limit int) specResult {
	t.Helper()
	ctx := context.Background()
	s, err := engine.NewSession(be, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	var out []int32
	if _, err := s.DecodeGreedy(ctx, max, func(tok int32) bool {
		if len(out) == limit {
			return false
		}
		out = append(out, tok)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return specResult{out, s.Tokens(), slices.Clone(s.Logits()), s.Stats()}
}

// TestSpecPickedMatchesHost: sampled speculative decoding (DecodePicked
// with Options.Draft) through the device's pass (the draft made on the GPU,
// the draws from the rows' min-p candidates found there) draws the host
// path's tokens (from the rows whole), with its stats and final logits,
// drafts committed or not; with no commits forced (every draft verified,
// DraftAlways; the random block's drafts taken only where a draw lands on
// them) exact mode's are plain sampled decoding's, the same seed drawing the
// same tokens. Exact and fast mode, passes of one draft and of three (the
// device's deep pass, its four rows' candidates, against the host path's
// draftChain and verifyChain; v73).
func TestSpecPickedMatchesHost(t *testing.T) {
	gpu(t)
	c := quantTiny()
	w := mtpWeights(t, c, model.SchemeQ2)
	toks := testTokens(120, c.Vocab)
	so := engine.SamplerOptions{Temperature: 0.8, MinP: 0.02, Seed: 5}
	ctx := context.Background()
	cands := 0 // draws from the device's candidates
	decode := func(be engine.Backend, o engine.Options) specResult {
		s, err := engine.NewSession(be, o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Prefill(ctx, toks[:70]); err != nil {
			t.Fatal(err)
		}
		sm := engine.NewSampler(so)
		var out []int32
		if _, err := s.DecodePicked(ctx, 50, engine.FilterFor(so), func(l *engine.Logits) (int32, bool) {
			if l.Candidates() != nil {
				cands++
			}
			tok := sm.SampleLogits(l, so)
			out = append(out, tok)
			return tok, true
		}); err != nil {
			t.Fatal(err)
		}
		return specResult{out, s.Tokens(), slices.Clone(s.Logits()), s.Stats()}
	}
	eachMode(t, w, func(be *Backend, fast bool) {
		plain := decode(be, engine.Options{ChunkSize: 32, MaxContext: 4096})
		for _, depth := range []int{1, 3} {
			for _, accept := range []struct {
				name   string
				commit func(pos int) bool
			}{{"none", nil}, {"2 in 3", func(pos int) bool { return pos%3 != 0 }}} {
				o := engine.Options{ChunkSize: 32, MaxContext: 4096, Draft: true, DraftAlways: true, DraftDepth: depth, ForceAccept: accept.commit}
				heads := be.GraphStats().SpecHeads
				cands = 0
				dev := decode(be, o)
				passes := be.GraphStats().SpecHeads - heads
				if passes == 0 || cands == 0 {
					t.Fatalf("fast %v, depth %d: no pass with its draft on the device (%d draws from its candidates)", fast, depth, cands)
				}
				// (with commits, a pass of three drafts observes more than one)
				if depth > 1 && accept.commit != nil && int64(dev.stats.Drafted) <= passes {
					t.Fatalf("fast %v, depth %d: %d drafts observed in %d passes", fast, depth, dev.stats.Drafted, passes)
				}
				o.DraftOverride = func(_ int, d int32) int32 { return d }
				host := decode(be, o)
				name := fmt.Sprintf("fast %v, depth %d, commits %s", fast, depth, accept.name)
				t.Logf("%s: %d drafts, %d committed", name, dev.stats.Drafted, dev.stats.Accepted)
				if !slices.Equal(dev.toks, host.toks) || dev.stats != host.stats {
					t.Fatalf("%s: device %v %+v, host %v %+v", name, dev.toks[70:], dev.stats, host.toks[70:], host.stats)
				}
				if k, ok := firstBitDiff(dev.logits, host.logits); !ok {
					t.Fatalf("%s: final logits differ at %d", name, k)
				}
				if dev.stats.Drafted == 0 || (accept.commit != nil && dev.stats.Accepted == 0) {
					t.Fatalf("%s: stats %+v", name, dev.stats)
				}
				if accept.commit == nil && !fast && !slices.Equal(dev.toks, plain.toks) {
					t.Fatalf("exact, depth %d, no draft committed: %v, plain sampled decoding %v", depth, dev.toks[70:], plain.toks[70:])
				}
			}
		}
	})
}

// TestSpecDeepMatchesCPU: deeper drafts (Options.DraftDepth 2 and 3: the
// MTP block run again over its own output streams, StageMTP from its own
// batch) on the GPU in exact mode make the CPU backend's drafts, position
// by position, and decode the CPU's plain greedy tokens; with every draft
// committed (ForceAccept) the session's final logits are the CPU's after
// the same tokens. Fast mode: the CPU's tokens up to its near ties, drafts
// made.
func TestSpecDeepMatchesCPU(t *testing.T) {
	gpu(t)
	c := quantTiny()
	w := mtpWeights(t, c, model.SchemeQ2)
	toks := testTokens(120, c.Vocab)
	defer func() { strict, fastBounds = true, false }()
	for _, fast := range []bool{false, true} {
		for _, depth := range []int{2, 3} {
			t.Run(fmt.Sprintf("fast %v, depth %d", fast, depth), func(t *testing.T) {
				strict, fastBounds = true, fast
				ref, err := cpu.New(w, schemeCase{c, model.SchemeQ2, fast, false}.refOptions(t))
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				be := testBackend(t, w, Options{Fast: fast})
				plain := specDecode(t, ref, engine.Options{ChunkSize: 32, MaxContext: 4096}, toks[:60], 80, 80)
				run := func(be engine.Backend, force bool) (specResult, map[int]int32) {
					drafts := map[int]int32{}
					o := engine.Options{ChunkSize: 32, MaxContext: 4096, Draft: true, DraftDepth: depth, DraftAlways: true,
						DraftOverride: func(pos int, d int32) int32 { drafts[pos] = d; return d }}
					if force {
						o.ForceAccept = func(pos int) bool { return pos%4 != 0 }
					}
					return specDecode(t, be, o, toks[:60], 80, 80), drafts
				}
				for _, force := range []bool{false, true} {
					want, wantDrafts := run(ref, force)
					got, gotDrafts := run(be, force)
					same := 0
					for same < len(want.out) && same < len(got.out) && want.out[same] == got.out[same] {
						same++
					}
					agreeDrafts := 0
					for pos, d := range wantDrafts {
						if gotDrafts[pos] == d {
							agreeDrafts++
						}
					}
					t.Logf("force %v: %d of %d tokens as the CPU's; drafts at %d positions, %d the CPU's; %d drafts, %d accepted",
						force, same, len(want.out), len(gotDrafts), agreeDrafts, got.stats.Drafted, got.stats.Accepted)
					if got.stats.Drafted == 0 || len(gotDrafts) == 0 {
						t.Fatal("nothing drafted")
					}
					if !force && !slices.Equal(want.out, plain.out) {
						t.Fatalf("the CPU's deep speculative tokens differ from its plain greedy ones")
					}
					if fast {
						continue
					}
					if same < len(want.out) || agreeDrafts != len(wantDrafts) || len(gotDrafts) != len(wantDrafts) {
						t.Fatalf("exact mode: tokens or drafts differ from the CPU's")
					}
					if force {
						checkAgree(t, "final logits", [][]float32{want.logits}, [][]float32{got.logits})
					}
				}
			})
		}
	}
}
