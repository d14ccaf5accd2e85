package engine

import "testing"

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
