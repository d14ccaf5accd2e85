package cpu_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/score"
)

// Session features on the CPU backend, on the flash6_w16_k8 golden model
// (window 16, ratios 0,0,4,128,4,128): everything here must hold bit for bit,
// because the CPU backend computes every token the same way whatever the
// chunking.

// prefillLogits runs a fresh session over toks and returns the logits after
// every token.
func prefillLogits(t *testing.T, be engine.Backend, opts engine.Options, toks []int32) [][]float32 {
	t.Helper()
	s := newSession(t, be, opts)
	out := make([][]float32, len(toks))
	if err := s.PrefillAll(context.Background(), toks, func(p int, l []float32) { out[p] = slices.Clone(l) }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Logits(), out[len(toks)-1]) {
		t.Fatal("Logits() differs from the last PrefillAll row")
	}
	return out
}

func sameRows(t *testing.T, what string, want, got [][]float32) {
	t.Helper()
	for p := range want {
		if !slices.Equal(want[p], got[p]) {
			t.Fatalf("%s: logits at position %d differ (max rel %.3g)", what, p, score.RowError(want[p], got[p]))
		}
	}
}

func TestChunkingInvariance(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	toks := g.Tokens["long"][:300]
	ref := prefillLogits(t, be, engine.Options{ChunkSize: len(toks)}, toks)
	for _, cs := range []int{1, 3, 16, 37, 128} {
		got := prefillLogits(t, be, engine.Options{ChunkSize: cs}, toks)
		sameRows(t, "chunk size "+strconv.Itoa(cs), ref, got)
	}
	// Token-by-token decode after a prefix, and mixed Prefill/Decode calls.
	s := newSession(t, be, engine.Options{ChunkSize: 7})
	ctx := context.Background()
	if err := s.Prefill(ctx, toks[:50]); err != nil {
		t.Fatal(err)
	}
	for p := 50; p < len(toks); {
		if p%3 == 0 {
			if err := s.Decode(ctx, toks[p]); err != nil {
				t.Fatal(err)
			}
			p++
		} else {
			n := min(11, len(toks)-p)
			if err := s.Prefill(ctx, toks[p:p+n]); err != nil {
				t.Fatal(err)
			}
			p += n
		}
		if !slices.Equal(s.Logits(), ref[p-1]) {
			t.Fatalf("mixed prefill/decode: logits at %d differ", p-1)
		}
	}
	// Several threads or one: the same bits.
	be1 := newBackend(t, g.w, cpu.Options{Threads: 1})
	sameRows(t, "one thread", ref, prefillLogits(t, be1, engine.Options{ChunkSize: 64}, toks))
}

func TestSnapshotRestore(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	toks := g.Tokens["long"]
	ctx := context.Background()
	ref := prefillLogits(t, be, engine.Options{}, toks)

	s := newSession(t, be, engine.Options{ChunkSize: 32})
	if err := s.Prefill(ctx, toks[:203]); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot at 203 tokens: %d bytes", len(snap))
	// Continue the original session.
	for p := 203; p < 260; p++ {
		if err := s.Decode(ctx, toks[p]); err != nil {
			t.Fatal(err)
		}
	}
	// Restore into a fresh session with other options, and into the used one.
	for i, opts := range []engine.Options{{}, {ChunkSize: 5, RewindSlack: -1}, {RewindSlack: 300}} {
		s2 := newSession(t, be, opts)
		if i == 0 {
			s2 = s
		}
		if err := s2.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if s2.Pos() != 203 || !slices.Equal(s2.Tokens(), toks[:203]) {
			t.Fatalf("restored %d tokens", s2.Pos())
		}
		if !slices.Equal(s2.Logits(), ref[202]) {
			t.Fatalf("restore %d: logits differ", i)
		}
		if err := s2.Prefill(ctx, toks[203:240]); err != nil {
			t.Fatal(err)
		}
		for p := 240; p < len(toks); p++ {
			if !slices.Equal(s2.Logits(), ref[p-1]) {
				t.Fatalf("restore %d: logits at %d differ", i, p-1)
			}
			if err := s2.Decode(ctx, toks[p]); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(s2.Logits(), ref[len(toks)-1]) {
			t.Fatalf("restore %d: last logits differ", i)
		}
		if st := s2.Stats(); st.Rederivations != 0 {
			t.Errorf("restore %d: %d re-derivations", i, st.Rederivations)
		}
	}
	// An empty session round-trips too.
	e := newSession(t, be, engine.Options{})
	es, err := e.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(es); err != nil || s.Pos() != 0 || s.Logits() != nil {
		t.Fatalf("restore of an empty snapshot: %v, pos %d", err, s.Pos())
	}

	// Corruption, truncation and another model are refused.
	bad := slices.Clone(snap)
	bad[len(bad)/2] ^= 1
	if err := s.Restore(bad); !errors.Is(err, engine.ErrSnapshot) {
		t.Errorf("corrupted snapshot: %v", err)
	}
	if err := s.Restore(snap[:len(snap)-9]); !errors.Is(err, engine.ErrSnapshot) {
		t.Errorf("truncated snapshot: %v", err)
	}
	other := loadGolden(t, "flash4_w128_k512")
	so := newSession(t, newBackend(t, other.w, cpu.Options{}), engine.Options{})
	if err := so.Restore(snap); !errors.Is(err, engine.ErrSnapshot) {
		t.Errorf("snapshot of another model: %v", err)
	}
}

func TestRewind(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	toks := g.Tokens["long"]
	ctx := context.Background()
	ref := prefillLogits(t, be, engine.Options{}, toks)

	s := newSession(t, be, engine.Options{ChunkSize: 64, RewindSlack: 40})
	if err := s.Prefill(ctx, toks[:400]); err != nil {
		t.Fatal(err)
	}
	check := func(what string, n int, rederived bool) {
		t.Helper()
		before := s.Stats().Rederivations
		if err := s.Rewind(ctx, n); err != nil {
			t.Fatal(err)
		}
		if s.Pos() != n || !slices.Equal(s.Tokens(), toks[:n]) {
			t.Fatalf("%s: at %d tokens, want %d", what, s.Pos(), n)
		}
		if got := s.Stats().Rederivations > before; got != rederived {
			t.Errorf("%s: re-derived %v, want %v", what, got, rederived)
		}
		if n > 0 && !slices.Equal(s.Logits(), ref[n-1]) {
			t.Fatalf("%s: logits after rewind differ", what)
		}
		// Continue: the same logits as an uninterrupted run.
		if err := s.Prefill(ctx, toks[n:n+20]); err != nil {
			t.Fatal(err)
		}
		for p := n + 20; p < n+30; p++ {
			if err := s.Decode(ctx, toks[p]); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %+v", what, s.Stats())
		if !slices.Equal(s.Logits(), ref[n+29]) {
			t.Fatalf("%s: logits after re-decoding differ", what)
		}
	}
	check("short rewind", 395, false)   // from 400: within the slack
	check("exact rewind", 390, false)   // from 425
	check("long rewind", 200, true)     // from 420: the ring has moved on
	check("rewind to block", 128, true) // from 230, to a ratio-128 boundary
	check("rewind to 1", 1, false)      // from 158: re-runs token 0 only
	if err := s.Rewind(ctx, 0); err != nil || s.Pos() != 0 || s.Logits() != nil {
		t.Fatalf("rewind to 0: %v", err)
	}
	if err := s.Rewind(ctx, 5); err == nil {
		t.Error("rewind past the end accepted")
	}
	t.Logf("stats: %+v", s.Stats())
}

func TestCancellation(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	toks := g.Tokens["long"]
	ref := prefillLogits(t, be, engine.Options{}, toks)

	for _, slack := range []int{-1, 200} {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		s := newSession(t, be, engine.Options{ChunkSize: 64, RewindSlack: slack, Trace: func(ev engine.TraceEvent) {
			// Cancel in the middle of the third chunk.
			if ev.Pos == 128 && ev.Stage == engine.StageAttnOut && ev.Layer == 3 {
				calls++
				cancel()
			}
		}})
		err := s.Prefill(ctx, toks[:300])
		if !errors.Is(err, context.Canceled) || calls != 1 {
			t.Fatalf("slack %d: prefill returned %v", slack, err)
		}
		if s.Pos() != 128 || !slices.Equal(s.Logits(), ref[127]) {
			t.Fatalf("slack %d: after cancel: %d tokens", slack, s.Pos())
		}
		// A snapshot of the interrupted session restores and continues.
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		s2 := newSession(t, be, engine.Options{})
		if err := s2.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if err := s2.Prefill(context.Background(), toks[128:200]); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s2.Logits(), ref[199]) {
			t.Fatalf("slack %d: restored interrupted session: logits differ", slack)
		}
		if err := s.Prefill(context.Background(), toks[128:300]); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Logits(), ref[299]) {
			t.Fatalf("slack %d: logits after resuming differ", slack)
		}
		t.Logf("slack %d: %+v", slack, s.Stats())
		if re := s.Stats().Rederivations; (slack < 0) != (re > 0) {
			t.Errorf("slack %d: %d re-derivations", slack, re)
		}
	}
	// A cancelled context is reported before any work.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := newSession(t, be, engine.Options{})
	if err := s.Decode(ctx, 1); !errors.Is(err, context.Canceled) || s.Pos() != 0 {
		t.Fatalf("decode with a cancelled context: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	ctx := context.Background()
	s := newSession(t, be, engine.Options{MaxContext: 20})
	V := int32(g.w.Config.Vocab)
	for _, tok := range []int32{V, -1, 1 << 30} {
		if err := s.Decode(ctx, tok); !errors.Is(err, engine.ErrBadToken) {
			t.Errorf("token %d: %v", tok, err)
		}
	}
	if err := s.Prefill(ctx, []int32{1, 2, V}); !errors.Is(err, engine.ErrBadToken) || s.Pos() != 0 {
		t.Errorf("prefill with a bad token: %v (pos %d)", err, s.Pos())
	}
	if err := s.Prefill(ctx, make([]int32, 21)); !errors.Is(err, engine.ErrContextFull) {
		t.Errorf("prefill past max context: %v", err)
	}
	if err := s.Prefill(ctx, make([]int32, 20)); err != nil {
		t.Fatal(err)
	}
	if err := s.Decode(ctx, 0); !errors.Is(err, engine.ErrContextFull) {
		t.Errorf("decode past max context: %v", err)
	}
	if _, err := s.Sample(engine.NewSampler(engine.SamplerOptions{})); err != nil {
		t.Error(err)
	}
	s.Close()
	if err := s.Decode(ctx, 0); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("decode after close: %v", err)
	}
}

// A closed backend still computes (on the calling goroutine) instead of
// waiting for its stopped workers.
func TestClosedBackend(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	toks := g.Tokens["short"]
	ref := prefillLogits(t, be, engine.Options{}, toks)
	be.Close()
	got := prefillLogits(t, be, engine.Options{}, toks)
	sameRows(t, "after Close", ref, got)
}

// Sessions sharing a backend may run concurrently.
func TestConcurrentSessions(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	a, b := g.Tokens["long"][:120], g.Tokens["short"]
	refA := prefillLogits(t, be, engine.Options{}, a)
	refB := prefillLogits(t, be, engine.Options{}, b)
	sa := newSession(t, be, engine.Options{ChunkSize: 16})
	sb := newSession(t, be, engine.Options{ChunkSize: 1})
	errs := make(chan error, 2)
	run := func(s *engine.Session, toks []int32) {
		errs <- s.Prefill(context.Background(), toks)
	}
	go run(sa, a)
	go run(sb, b)
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(sa.Logits(), refA[len(a)-1]) || !slices.Equal(sb.Logits(), refB[len(b)-1]) {
		t.Fatal("concurrent sessions differ from sequential ones")
	}
}

// TestPrefillFrom checks PrefillFrom reports exactly the positions ≥ from,
// with PrefillAll's logits, whatever the chunking, after an earlier prefix.
func TestPrefillFrom(t *testing.T) {
	g := loadGolden(t, "flash6_w16_k8")
	be := newBackend(t, g.w, cpu.Options{})
	toks := g.Tokens["long"][:120]
	ref := prefillLogits(t, be, engine.Options{ChunkSize: 128}, toks)
	for _, cs := range []int{5, 32, 128} {
		s := newSession(t, be, engine.Options{ChunkSize: cs})
		ctx := context.Background()
		if err := s.Prefill(ctx, toks[:10]); err != nil {
			t.Fatal(err)
		}
		var seen []int
		err := s.PrefillFrom(ctx, toks[10:], 70, func(p int, l []float32) {
			seen = append(seen, p)
			if !slices.Equal(l, ref[p]) {
				t.Fatalf("chunk %d: logits at %d differ from PrefillAll's", cs, p)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) != 50 || seen[0] != 70 || seen[49] != 119 {
			t.Fatalf("chunk %d: reported positions %v", cs, seen)
		}
		if !slices.Equal(s.Logits(), ref[119]) {
			t.Fatalf("chunk %d: Logits() is not the last row", cs)
		}
	}
}
