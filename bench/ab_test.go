package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"ds4go/engine"
)

// abFixture is an A/B on the CPU backend's Tiny model: a session of the
// chunk size, rewind slack 16; a 40-token prompt; variants "a" and "b" whose
// Apply appends their names to *applied.
func abFixture(t *testing.T, chunk int, seed uint64, applied *[]string) (*engine.Session, []int32, []Variant) {
	t.Helper()
	be, w := tinyBackend(t)
	s, err := engine.NewSession(be, engine.Options{ChunkSize: chunk, MaxContext: 128, RewindSlack: 16})
	if err != nil {
		t.Fatal(err)
	}
	rec := func(n string) func() error { return func() error { *applied = append(*applied, n); return nil } }
	return s, RandomTokens(40, w.Config.Vocab, seed), []Variant{{Name: "a", Apply: rec("a")}, {Name: "b", Apply: rec("b")}}
}

// TestRunABInterleaves runs two variants for three rounds on the CPU
// backend: each run is preceded by its own variant's Apply, the variants
// alternate round by round after an untimed round of both, every decode
// starts at the frontier (the session is back there at the end, with the
// prompt's tokens), and a failing Apply stops the run with the runs done
// so far.
func TestRunABInterleaves(t *testing.T) {
	var applied []string
	s, prompt, variants := abFixture(t, 16, 3, &applied)
	var seen []ABRun
	runs, err := RunAB(context.Background(), s, prompt, variants, ABOptions{Frontier: 32, Gen: 4, Rounds: 3, Settle: 2, Warmup: 8,
		Progress: func(r ABRun) {
			if s.Pos() != 32 {
				t.Errorf("round %d variant %d: session at %d after the run, want 32", r.Round, r.Variant, s.Pos())
			}
			seen = append(seen, r)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(applied, ""); got != "abababab" {
		t.Errorf("applied %q, want abababab (the untimed round, then three)", got)
	}
	if len(runs) != 6 || len(seen) != 6 {
		t.Fatalf("%d runs (%d reported), want 6", len(runs), len(seen))
	}
	for i, r := range runs {
		if r.Round != i/2+1 || r.Variant != i%2 || !(r.GenTPS > 0) || !(r.GenS > 0) {
			t.Errorf("run %d: %+v", i, r)
		}
	}
	got := s.Tokens()
	if len(got) != 32 {
		t.Fatalf("%d tokens at the end, want 32", len(got))
	}
	for i := range got {
		if got[i] != prompt[i] {
			t.Fatalf("token %d: %d, want %d", i, got[i], prompt[i])
		}
	}

	// a failing Apply (b's third: round 2's): the runs before it come
	// back with the error
	var ignored []string
	s2, _, _ := abFixture(t, 16, 3, &ignored)
	boom := errors.New("boom")
	n := 0
	variants[1].Apply = func() error {
		if n++; n == 3 {
			return boom
		}
		return nil
	}
	runs, err = RunAB(context.Background(), s2, prompt, variants, ABOptions{Frontier: 32, Gen: 2, Rounds: 3})
	if !errors.Is(err, boom) || len(runs) != 3 {
		t.Errorf("failing Apply: %d runs, error %v; want 3 runs and boom", len(runs), err)
	}
}

// TestRunABPrefill times prefills instead of decodes: an untimed round of
// every variant first, then each run prefills the prompt's next 8 tokens
// from the frontier and rewinds there.
func TestRunABPrefill(t *testing.T) {
	var applied []string
	s, prompt, variants := abFixture(t, 4, 5, &applied)
	runs, err := RunAB(context.Background(), s, prompt, variants, ABOptions{Frontier: 32, Prefill: 8, Rounds: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(applied, ""); got != "ababab" {
		t.Errorf("applied %q, want ababab (the untimed round, then two)", got)
	}
	if len(runs) != 4 {
		t.Fatalf("%d runs, want 4", len(runs))
	}
	for i, r := range runs {
		if r.Round != i/2+1 || !(r.PrefillTPS > 0) || r.GenTPS != 0 {
			t.Errorf("run %d: %+v", i, r)
		}
	}
	if s.Pos() != 32 {
		t.Errorf("session at %d, want 32", s.Pos())
	}
	if sum := SummarizeAB(variants, runs, ABPrefill); !(sum[1].MeanTPS > 0) || sum[0].Ratio != 1 {
		t.Errorf("summary %+v", sum)
	}
	// the prompt must hold the prefilled tokens
	s2, _, _ := abFixture(t, 4, 5, &applied)
	if _, err := RunAB(context.Background(), s2, prompt, variants, ABOptions{Frontier: 36, Prefill: 8, Rounds: 1}); err == nil {
		t.Error("prefill past the prompt: no error")
	}
}

func TestRunABRejects(t *testing.T) {
	be, w := tinyBackend(t)
	prompt := RandomTokens(40, w.Config.Vocab, 3)
	v := []Variant{{Name: "a", Apply: func() error { return nil }}}
	for _, o := range []ABOptions{
		{Frontier: 0, Gen: 4, Rounds: 1},
		{Frontier: 41, Gen: 4, Rounds: 1},
		{Frontier: 32, Gen: 0, Rounds: 1},
		{Frontier: 32, Gen: -1, Prefill: 4, Rounds: 1},
		{Frontier: 32, Gen: 4, Rounds: 0},
		{Frontier: 32, Gen: 4, Rounds: 1, Settle: -1},
	} {
		s, err := engine.NewSession(be, engine.Options{MaxContext: 128})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := RunAB(context.Background(), s, prompt, v, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	s, _ := engine.NewSession(be, engine.Options{MaxContext: 128})
	if _, err := RunAB(context.Background(), s, prompt, nil, ABOptions{Frontier: 32, Gen: 4, Rounds: 1}); err == nil {
		t.Error("no variants: no error")
	}
}

func TestSummarizeAB(t *testing.T) {
	vs := []Variant{{Name: "base"}, {Name: "new"}}
	runs := []ABRun{
		{Round: 1, Variant: 0, GenTPS: 100}, {Round: 1, Variant: 1, GenTPS: 102},
		{Round: 2, Variant: 0, GenTPS: 110}, {Round: 2, Variant: 1, GenTPS: 110},
	}
	s := SummarizeAB(vs, runs, ABDecode)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if s[0].Runs != 2 || !near(s[0].MeanTPS, 105) || !near(s[0].Ratio, 1) || !near(s[0].RoundMin, 1) || !near(s[0].RoundMax, 1) {
		t.Errorf("base: %+v", s[0])
	}
	if !near(s[1].MeanTPS, 106) || !near(s[1].Ratio, 106.0/105) || !near(s[1].RoundMin, 1) || !near(s[1].RoundMax, 1.02) {
		t.Errorf("new: %+v", s[1])
	}
	if line := s[1].String(); !strings.Contains(line, "+0.95 %") || !strings.Contains(line, "+2.00 %") {
		t.Errorf("line %q", line)
	}
}

// fakeOptions is an OptionSetter over a map, refusing values above 9.
type fakeOptions struct {
	v   map[string]int
	log []string
}

func (f *fakeOptions) SetOptionEnv(assign string) error {
	n, v, _ := strings.Cut(assign, "=")
	if _, ok := f.v[n]; !ok {
		return fmt.Errorf("%s is not an option", n)
	}
	x, err := strconv.Atoi(v)
	if err != nil || x > 9 {
		return fmt.Errorf("%s: bad value %q", n, v)
	}
	f.v[n] = x
	f.log = append(f.log, assign)
	return nil
}

func (f *fakeOptions) OptionEnv(name string) (int, error) {
	x, ok := f.v[name]
	if !ok {
		return 0, fmt.Errorf("%s is not an option", name)
	}
	return x, nil
}

func TestOptionVariants(t *testing.T) {
	o := &fakeOptions{v: map[string]int{"A": 1, "B": 5, "C": 7}}
	vs, err := OptionVariants("default; A=2 ;B=0 A=3", o)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 3 || vs[0].Name != "default" || vs[1].Name != "A=2" || vs[2].Name != "B=0 A=3" {
		t.Fatalf("variants %+v", vs)
	}
	if o.v["A"] != 1 || o.v["B"] != 5 {
		t.Fatalf("options after parsing %v, want the starting ones back", o.v)
	}
	want := []map[string]int{{"A": 1, "B": 5}, {"A": 2, "B": 5}, {"A": 3, "B": 0}}
	for _, i := range []int{2, 0, 1, 2} { // any order: each variant is the start plus its own
		if err := vs[i].Apply(); err != nil {
			t.Fatal(err)
		}
		if o.v["A"] != want[i]["A"] || o.v["B"] != want[i]["B"] || o.v["C"] != 7 {
			t.Errorf("variant %d: options %v, want %v and C 7", i, o.v, want[i])
		}
	}
	for _, bad := range []string{"A=2", "A=2;X=1", "A=2;A", "A=2;B=", "A=2;A=10", ""} {
		if _, err := OptionVariants(bad, &fakeOptions{v: map[string]int{"A": 1, "B": 5}}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
