package engine

import (
	"math"
	"testing"
)

// TestDraftPolicy pins draftPolicy's switches: from its start (0.5) eleven
// misses in a row pause speculation (0.5·(15/16)^11 < 0.25 < 0.5·(15/16)^10),
// three hits then resume it (past 0.35), and a switch happens only where
// the rate crosses the bound of its direction (the hysteresis).
func TestDraftPolicy(t *testing.T) {
	var p draftPolicy
	for i := 1; i <= 11; i++ {
		if p.paused {
			t.Fatalf("paused after %d misses (rate %.3f)", i-1, p.rate)
		}
		p.observe(false)
	}
	if !p.paused {
		t.Fatalf("not paused after 11 misses (rate %.3f)", p.rate)
	}
	for i := 1; i <= 3; i++ {
		if !p.paused {
			t.Fatalf("resumed after %d hits (rate %.3f)", i-1, p.rate)
		}
		p.observe(true)
	}
	if p.paused {
		t.Fatalf("still paused after 3 hits (rate %.3f)", p.rate)
	}
	// a switch only where the rate crossed its bound: pausing below
	// draftPauseBelow, resuming above draftResumeAbove, never between
	q := draftPolicy{rate: 0.3, seen: true}
	switches := 0
	for i := 0; i < 400; i++ {
		was := q.paused
		q.observe(i%10 < 3 || (i/100)%2 == 1 && i%10 < 6) // ≈ 30 %, then ≈ 60 %, …
		switch {
		case !was && q.paused:
			switches++
			if q.rate >= draftPauseBelow {
				t.Fatalf("paused at rate %.3f", q.rate)
			}
		case was && !q.paused:
			switches++
			if q.rate <= draftResumeAbove {
				t.Fatalf("resumed at rate %.3f", q.rate)
			}
		}
	}
	if switches == 0 {
		t.Fatal("no switch in 400 passes of 30 % and 60 % hits")
	}
}

// TestDraftPolicyCost: a backend's pass cost (DraftCoster) moves the
// bounds to its break-even acceptance, cost − 1, and 0.1 above it (the
// defaults' gap); a cost outside (1, 2) keeps the defaults. With a cost of
// 1.4 a rate of 0.34, which stays verifying under the defaults, pauses.
func TestDraftPolicyCost(t *testing.T) {
	for _, c := range []struct{ cost, pause, resume float64 }{
		{1.4, 0.4, 0.5}, {1.25, 0.25, 0.35}, {1.02, 0.05, 0.15}, {1.95, 0.85, 0.95},
		{0, draftPauseBelow, draftResumeAbove}, {2.5, draftPauseBelow, draftResumeAbove}, {1, draftPauseBelow, draftResumeAbove},
	} {
		var p draftPolicy
		p.withCost(c.cost)
		pause, resume := p.bounds()
		if math.Abs(pause-c.pause) > 1e-12 || math.Abs(resume-c.resume) > 1e-12 {
			t.Errorf("cost %v: bounds %v, %v; want %v, %v", c.cost, pause, resume, c.pause, c.resume)
		}
	}
	var p, q draftPolicy
	p.withCost(1.4)
	p.rate, p.seen, q.rate, q.seen = 0.36, true, 0.36, true
	p.observe(false) // 0.36 − 0.36/16 = 0.3375: below 0.4, above 0.25
	q.observe(false)
	if !p.paused || q.paused {
		t.Fatalf("rate %.4f: paused %v with cost 1.4 (want true), %v with the defaults (want false)", p.rate, p.paused, q.paused)
	}
	for p.rate <= 0.5 {
		if !p.paused {
			t.Fatalf("resumed at rate %.3f (cost 1.4: above 0.5 only)", p.rate)
		}
		p.observe(true)
	}
	if p.paused {
		t.Fatalf("still paused at rate %.3f", p.rate)
	}
}

// TestDraftPolicyDepth: with the backend's costs of verifying passes of k
// drafts (DraftDepthCoster), depthFor picks the depth of the most tokens
// per cost at the rate, 1 + a + … + a^k tokens a pass: v69's CUDA exact
// costs (1.33, 2.19, 2.66) keep one draft at every rate below 1; passes whose cost
// grows slowly go deep at high rates and stay at one draft at low ones;
// depths of unknown cost are not chosen, and with no deeper one known, or
// no costs at all, a pass drafts as many as asked.
func TestDraftPolicyDepth(t *testing.T) {
	costs := func(c ...float64) func(int) float64 {
		return func(k int) float64 {
			if k < len(c) {
				return c[k]
			}
			return 0
		}
	}
	cases := []struct {
		name  string
		cost  func(int) float64
		rate  float64
		limit int
		want  int
	}{
		{"cuda exact v69, 0.5", costs(0, 1.33, 2.19, 2.66), 0.5, 3, 1},
		{"cuda exact v69, 0.95", costs(0, 1.33, 2.19, 2.66), 0.95, 3, 1},
		{"cheap deep, 0.8", costs(0, 1.3, 1.5, 1.7), 0.8, 3, 3},
		{"cheap deep, 0.8, limit 2", costs(0, 1.3, 1.5, 1.7), 0.8, 2, 2},
		{"cheap deep, 0.3", costs(0, 1.3, 1.5, 1.7), 0.3, 3, 1},
		{"cheap deep, 0.6", costs(0, 1.3, 1.5, 1.7), 0.6, 3, 2},
		{"a gap at 2", costs(0, 1.3, 0, 1.7), 0.8, 3, 3},
		{"deep passes not measured", costs(0, 1.3), 0.9, 3, 3},
		{"one draft not measured", costs(0, 0, 1.5, 1.7), 0.9, 3, 3},
		{"no costs", nil, 0.9, 3, 3},
		{"limit 1", costs(0, 1.3, 1.0), 0.9, 1, 1},
	}
	for _, c := range cases {
		p := draftPolicy{depthCost: c.cost, rate: c.rate, seen: true}
		if got := p.depthFor(c.limit); got != c.want {
			t.Errorf("%s: depth %d, want %d", c.name, got, c.want)
		}
	}
	// before any observation: the starting rate (0.5)
	p := draftPolicy{depthCost: costs(0, 1.3, 1.5, 1.7)}
	q := draftPolicy{depthCost: costs(0, 1.3, 1.5, 1.7), rate: draftRateStart, seen: true}
	if got, want := p.depthFor(3), q.depthFor(3); got != want {
		t.Errorf("unseen rate: depth %d, want %d (the starting rate's)", got, want)
	}
}
