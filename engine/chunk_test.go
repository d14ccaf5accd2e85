package engine_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"ds4go/engine"
)

// chunkyBackend prefers a chunk size of its own (engine.ChunkSizer) and
// records the batch capacity the session asks for.
type chunkyBackend struct {
	engine.Backend
	prefer int
	asked  *int
}

func (c chunkyBackend) PreferredChunk() int { return c.prefer }

func (c chunkyBackend) NewBatch(n int) (engine.Batch, error) {
	*c.asked = n
	return c.Backend.NewBatch(n)
}

func TestPreferredChunk(t *testing.T) {
	be := tinyBackend(t, nil)
	for _, c := range []struct{ prefer, opt, want int }{
		{0, 0, engine.DefaultChunkSize}, // no preference
		{40, 0, 40},                     // the backend's
		{40, 7, 7},                      // the caller's wins
	} {
		var asked int
		s, err := engine.NewSession(chunkyBackend{be, c.prefer, &asked}, engine.Options{ChunkSize: c.opt, MaxContext: 256})
		if err != nil {
			t.Fatal(err)
		}
		if asked != c.want {
			t.Errorf("preference %d, option %d: batch of %d, want %d", c.prefer, c.opt, asked, c.want)
		}
		s.Close()
	}
}

// headFailBackend fails its next Head call after scribbling over the
// logits it was given, when fail is set.
type headFailBackend struct {
	engine.Backend
	fail *bool
}

func (h headFailBackend) Head(b engine.Batch, rows []int, logits []float32) error {
	if *h.fail {
		*h.fail = false
		for i := range logits {
			logits[i] = 12345
		}
		return errors.New("head failed")
	}
	return h.Backend.Head(b, rows, logits)
}

// TestDecodeHeadFailure: the decode step's logits are written in place, so
// a failed Head leaves none (Logits is nil, not the scribbled values), and
// Rewind(ctx, Pos()) recomputes the same logits as before the failure.
func TestDecodeHeadFailure(t *testing.T) {
	fail := false
	s, err := engine.NewSession(headFailBackend{tinyBackend(t, nil), &fail}, engine.Options{MaxContext: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Prefill(ctx, []int32{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
	want := append([]float32(nil), s.Logits()...)
	fail = true
	if err := s.Decode(ctx, 6); err == nil {
		t.Fatal("decode with a failing head succeeded")
	}
	if l := s.Logits(); l != nil {
		t.Fatalf("logits after a failed head: %v…", l[:4])
	}
	if s.Pos() != 5 {
		t.Fatalf("position %d after the failed decode, want 5", s.Pos())
	}
	if err := s.Rewind(ctx, s.Pos()); err != nil {
		t.Fatal(err)
	}
	got := s.Logits()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("logit %d after the rewind: %v, want %v", i, got[i], want[i])
		}
	}
	// and the next decode works, its logits in place
	if err := s.Decode(ctx, 6); err != nil {
		t.Fatal(err)
	}
	if s.Logits() == nil || s.Logits()[0] == 12345 {
		t.Fatal("no logits after the decode")
	}
}
