package server

import (
	"testing"

	"ds4go/engine"
)

func TestSampler(t *testing.T) {
	logits := engine.DenseLogits([]float32{1, 5, 4.9, -3, 0})
	if got := newSampler(1).sample(logits, DefaultSampling(), true); got != 1 {
		t.Fatalf("greedy: %d", got)
	}
	if got := newSampler(1).sample(logits, SamplingParams{Temperature: 0}, false); got != 1 {
		t.Fatalf("temperature 0: %d", got)
	}
	if got := newSampler(1).sample(logits, SamplingParams{Temperature: 1, TopK: 1}, false); got != 1 {
		t.Fatalf("top_k 1: %d", got)
	}
	// min_p 0.5 keeps tokens 1 and 2 only; top_p 0.5 keeps token 1 only.
	seen := map[int32]int{}
	s := newSampler(7)
	for range 2000 {
		seen[s.sample(logits, SamplingParams{Temperature: 1, TopP: 1, MinP: 0.5}, false)]++
	}
	if len(seen) != 2 || seen[1] == 0 || seen[2] == 0 {
		t.Fatalf("min_p: %v", seen)
	}
	for range 200 {
		if got := s.sample(logits, SamplingParams{Temperature: 1, TopP: 0.5}, false); got != 1 {
			t.Fatalf("top_p: %d", got)
		}
	}
	// Same seed, same draws.
	a, b := newSampler(42), newSampler(42)
	p := SamplingParams{Temperature: 1.5, TopP: 1}
	for range 100 {
		if a.sample(logits, p, false) != b.sample(logits, p, false) {
			t.Fatal("seeded sampling not reproducible")
		}
	}
}
