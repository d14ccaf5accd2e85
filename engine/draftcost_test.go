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
