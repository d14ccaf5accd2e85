package engine_test

import (
	"context"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
)

// costlyBackend is the CPU backend reporting a verifying pass's cost
// (engine.DraftCoster); every other method, optional interfaces included,
// is the CPU backend's.
type costlyBackend struct {
	*cpu.Backend
	cost float64
}

func (b costlyBackend) DraftPassCost() float64 { return b.cost }

// TestDraftCoster: a session takes its pause bounds from the backend's
// DraftCoster. With drafts committed two times in three (ForceAccept) the
// default bounds (pause below 0.25) never pause speculation; a backend
// whose pass costs 1.9 one-token passes (break-even 0.9) pauses it, and
// the paused passes only check their drafts (Stats.Checked). (ForceAccept
// commits wrong drafts, so the two runs' tokens differ; TestDraftSameTokens
// holds paused and verifying passes to plain decoding's tokens.)
func TestDraftCoster(t *testing.T) {
	ctx := context.Background()
	be, ok := mtpBackend(t).(*cpu.Backend)
	if !ok {
		t.Fatal("mtpBackend is not the CPU backend")
	}
	run := func(b engine.Backend) engine.Stats {
		o := engine.Options{ChunkSize: 8, Draft: true, ForceAccept: func(pos int) bool { return pos%3 != 0 }}
		s := newSess(t, b, o)
		if err := s.Prefill(ctx, tokens(30, 512)); err != nil {
			t.Fatal(err)
		}
		greedyRun(t, s, 60)
		return s.Stats()
	}
	def := run(be)
	if def.Checked != 0 || def.Drafted == 0 {
		t.Fatalf("default bounds: %d drafts verified, %d only checked (want all verified)", def.Drafted, def.Checked)
	}
	costly := run(costlyBackend{be, 1.9})
	if costly.Checked == 0 {
		t.Fatalf("cost 1.9: %d drafts verified (%d committed), none only checked: speculation never paused", costly.Drafted, costly.Accepted)
	}
}

// depthBackend is a chunkCounter reporting the costs of verifying passes
// of k drafts (engine.DraftDepthCoster).
type depthBackend struct {
	*chunkCounter
	costs []float64 // by drafts; 0: not measured
}

func (b depthBackend) DraftDepthCost(k int) float64 {
	if k < len(b.costs) {
		return b.costs[k]
	}
	return 0
}

// TestDraftDepthCoster: with Options.DraftDepth 3 and drafts always right
// (an oracle), a backend whose deeper passes cost nearly what they commit
// (CUDA exact mode's v69 figures) gets passes of one draft — no chunk of
// more than two tokens — and one whose deeper passes are cheap gets passes
// of three; DraftAlways drafts as many as asked whatever the costs. The
// tokens are plain decoding's every time.
func TestDraftDepthCoster(t *testing.T) {
	ctx := context.Background()
	be, ok := mtpBackend(t).(*cpu.Backend)
	if !ok {
		t.Fatal("mtpBackend is not the CPU backend")
	}
	prompt := tokens(30, 512)
	plain := newSess(t, be, engine.Options{})
	if err := plain.Prefill(ctx, prompt); err != nil {
		t.Fatal(err)
	}
	want := greedyRun(t, plain, 40)
	for _, c := range []struct {
		name    string
		costs   []float64
		always  bool
		deepest int // the largest chunk's tokens
	}{
		{"costly deep passes", []float64{0, 1.33, 2.19, 2.66}, false, 2},
		{"cheap deep passes", []float64{0, 1.3, 1.5, 1.7}, false, 4},
		{"costly, DraftAlways", []float64{0, 1.33, 2.19, 2.66}, true, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := depthBackend{&chunkCounter{Backend: be, Drafter: be, sizes: map[int]int{}}, c.costs}
			o := engine.Options{Draft: true, DraftDepth: 3, DraftAlways: c.always, DraftOverride: oracleDrafts(prompt, want, nil)}
			countedRun(t, b, b.sizes, o, prompt, want)
			deepest := 0
			for n := range b.sizes {
				deepest = max(deepest, n)
			}
			if deepest != c.deepest {
				t.Fatalf("chunks by size %v: the largest %d tokens, want %d", b.sizes, deepest, c.deepest)
			}
		})
	}
}
