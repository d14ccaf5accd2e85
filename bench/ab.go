package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"ds4go/engine"
)

// Variant is one arm of an A/B run inside one process (RunAB): Apply puts
// the backend in the variant's state (CUDA library options, say) before
// each of its runs.
type Variant struct {
	Name  string
	Apply func() error
}

// ABOptions configure RunAB.
type ABOptions struct {
	// Frontier is the context the timed runs start from: the prompt's
	// first Frontier tokens, prefilled once.
	Frontier int
	// Prefill, when positive, is the tokens each timed run prefills from
	// the frontier (the prompt's next ones, in the session's chunks), timed
	// apart from its decode; the session is rewound to the frontier after.
	Prefill int
	// Gen is the tokens each timed run decodes (greedily; 0: none) from
	// the frontier.
	Gen int
	// Rounds: each round runs every variant once, in order, after an
	// untimed round of the same runs (a kernel's or a cuBLAS algorithm's
	// first use, the graphs' first builds, the clocks: v63 saw the first
	// timed decode of a call ≈ 0.4 % slow).
	Rounds int
	// Settle is the tokens decoded untimed (then rewound) after a variant
	// is applied and before its timed run: the first steps after a switch
	// build again the decode graphs whose kernels changed.
	Settle int
	// Warmup is as Options.Warmup.
	Warmup int
	// Progress, if set, is called after each timed run.
	Progress func(ABRun)
}

// ABRun is one timed run of RunAB.
type ABRun struct {
	Round                int // from 1
	Variant              int // index into the variants
	PrefillS, PrefillTPS float64
	GenS, GenTPS         float64
}

// RunAB prefills prompt's first o.Frontier tokens into s (which must be
// empty), then runs an untimed round and o.Rounds timed ones; in each,
// every variant in turn is applied, decodes o.Settle tokens untimed,
// prefills o.Prefill tokens and decodes o.Gen tokens, the session rewound
// to the frontier after each prefill and decode. The
// variants interleave round by round, so the machine's drift falls on all
// of them alike, and share one process, so what differs between processes
// (the model's placement in memory, a library's build) does not enter the
// comparison. The session needs RewindSlack ≥ max(o.Gen, o.Settle,
// o.Prefill) for its rewinds to stay cheap. It returns the runs done so
// far with any error.
func RunAB(ctx context.Context, s *engine.Session, prompt []int32, variants []Variant, o ABOptions) ([]ABRun, error) {
	switch {
	case s.Pos() != 0:
		return nil, errors.New("bench: session is not empty")
	case len(variants) == 0:
		return nil, errors.New("bench: no variants")
	case o.Frontier <= 0 || o.Prefill < 0 || o.Frontier+o.Prefill > len(prompt):
		return nil, fmt.Errorf("bench: frontier %d and %d tokens of prefill outside the prompt's %d tokens", o.Frontier, o.Prefill, len(prompt))
	case o.Gen < 0 || o.Gen+o.Prefill <= 0 || o.Rounds <= 0 || o.Settle < 0:
		return nil, fmt.Errorf("bench: A/B needs something timed, rounds > 0 and settle ≥ 0 (prefill %d, gen %d, rounds %d, settle %d)",
			o.Prefill, o.Gen, o.Rounds, o.Settle)
	}
	if err := warmUp(ctx, s, prompt, o.Warmup); err != nil {
		return nil, err
	}
	if err := s.Prefill(ctx, prompt[:o.Frontier]); err != nil {
		return nil, fmt.Errorf("bench: prefill to %d: %w", o.Frontier, err)
	}
	decode := func(n int) (float64, error) {
		t0 := time.Now()
		if _, err := s.DecodeGreedy(ctx, n, func(int32) bool { return true }); err != nil {
			return 0, fmt.Errorf("bench: decode at %d: %w", s.Pos(), err)
		}
		sec := time.Since(t0).Seconds()
		if err := s.Rewind(ctx, o.Frontier); err != nil {
			return 0, fmt.Errorf("bench: rewind to %d: %w", o.Frontier, err)
		}
		return sec, nil
	}
	prefill := func() (float64, error) {
		t0 := time.Now()
		if err := s.Prefill(ctx, prompt[o.Frontier:o.Frontier+o.Prefill]); err != nil {
			return 0, fmt.Errorf("bench: prefill from %d: %w", o.Frontier, err)
		}
		sec := time.Since(t0).Seconds()
		if err := s.Rewind(ctx, o.Frontier); err != nil {
			return 0, fmt.Errorf("bench: rewind to %d: %w", o.Frontier, err)
		}
		return sec, nil
	}
	var runs []ABRun
	for r := 0; r <= o.Rounds; r++ { // round 0: untimed
		for i, v := range variants {
			if err := v.Apply(); err != nil {
				return runs, fmt.Errorf("bench: variant %q: %w", v.Name, err)
			}
			if o.Settle > 0 {
				if _, err := decode(o.Settle); err != nil {
					return runs, err
				}
			}
			run := ABRun{Round: r, Variant: i}
			if o.Prefill > 0 {
				sec, err := prefill()
				if err != nil {
					return runs, err
				}
				run.PrefillS, run.PrefillTPS = sec, rate(o.Prefill, sec)
			}
			if o.Gen > 0 {
				sec, err := decode(o.Gen)
				if err != nil {
					return runs, err
				}
				run.GenS, run.GenTPS = sec, rate(o.Gen, sec)
			}
			if r == 0 {
				continue
			}
			runs = append(runs, run)
			if o.Progress != nil {
				o.Progress(run)
			}
		}
	}
	return runs, nil
}

// ABSummary is a variant's result over the rounds: its mean decode rate,
// and its rate over the first variant's, as the ratio of the means and as
// the lowest and highest ratio of one round (both variants' runs in it).
type ABSummary struct {
	Name               string
	Runs               int
	MeanTPS            float64
	Ratio              float64 // MeanTPS over the first variant's
	RoundMin, RoundMax float64 // per-round ratios to the first variant's run
}

// ABDecode is SummarizeAB's metric of a run's decode rate.
func ABDecode(r ABRun) float64 { return r.GenTPS }

// ABPrefill is SummarizeAB's metric of a run's prefill rate.
func ABPrefill(r ABRun) float64 { return r.PrefillTPS }

// SummarizeAB summarises runs (RunAB's) by variant, on the rate metric
// picks (ABDecode, ABPrefill).
func SummarizeAB(variants []Variant, runs []ABRun, metric func(ABRun) float64) []ABSummary {
	out := make([]ABSummary, len(variants))
	base := map[int]float64{} // round → the first variant's rate
	for i, v := range variants {
		out[i] = ABSummary{Name: v.Name, RoundMin: math.Inf(1), RoundMax: math.Inf(-1)}
	}
	for _, r := range runs {
		if r.Variant == 0 {
			base[r.Round] = metric(r)
		}
	}
	for _, r := range runs {
		s := &out[r.Variant]
		x := metric(r)
		s.Runs++
		s.MeanTPS += x
		if b := base[r.Round]; b > 0 {
			s.RoundMin = math.Min(s.RoundMin, x/b)
			s.RoundMax = math.Max(s.RoundMax, x/b)
		}
	}
	for i := range out {
		s := &out[i]
		if s.Runs > 0 {
			s.MeanTPS /= float64(s.Runs)
		}
		if out[0].MeanTPS > 0 {
			s.Ratio = s.MeanTPS / out[0].MeanTPS
		}
		if math.IsInf(s.RoundMin, 0) {
			s.RoundMin, s.RoundMax = 0, 0
		}
	}
	return out
}

// String formats the summary as one line: name, mean tok/s, the change
// against the first variant, and the per-round range in brackets.
func (s ABSummary) String() string {
	pc := func(x float64) string { return fmt.Sprintf("%+.2f %%", 100*(x-1)) }
	return fmt.Sprintf("%-40s %8.2f tok/s  %s  (%s … %s, %d runs)", s.Name, s.MeanTPS, pc(s.Ratio), pc(s.RoundMin), pc(s.RoundMax), s.Runs)
}

// OptionSetter switches a backend's options by their environment
// variables (cuda.Device: SetOptionEnv, OptionEnv).
type OptionSetter interface {
	SetOptionEnv(assign string) error
	OptionEnv(name string) (int, error)
}

// OptionVariants parses sets, ';'-separated variants each of
// space-separated NAME=VALUE option assignments ("default" or nothing:
// none), into variants for RunAB. Each variant's Apply sets every option
// that any variant names: to the variant's value where it names it, else
// to the value the option had when OptionVariants ran (so each variant is
// the starting options plus its own assignments). Names the backend lacks
// and values an option refuses fail here, before any work: every variant
// is applied once, then the starting values are set again.
func OptionVariants(sets string, o OptionSetter) ([]Variant, error) {
	type assign struct {
		name  string
		value string
	}
	var parsed [][]assign
	var names []string
	seen := map[string]bool{}
	var labels []string
	for _, set := range strings.Split(sets, ";") {
		set = strings.TrimSpace(set)
		var as []assign
		if set != "" && set != "default" {
			for _, w := range strings.Fields(set) {
				n, v, ok := strings.Cut(w, "=")
				if !ok || n == "" || v == "" {
					return nil, fmt.Errorf("bench: %q in variant %q is not NAME=VALUE", w, set)
				}
				as = append(as, assign{n, v})
				if !seen[n] {
					seen[n] = true
					names = append(names, n)
				}
			}
		}
		if set == "" {
			set = "default"
		}
		parsed = append(parsed, as)
		labels = append(labels, set)
	}
	if len(parsed) < 2 {
		return nil, fmt.Errorf("bench: A/B sets %q give %d variant(s); two or more, ';'-separated", sets, len(parsed))
	}
	initial := map[string]string{}
	for _, n := range names {
		v, err := o.OptionEnv(n)
		if err != nil {
			return nil, fmt.Errorf("bench: option %s: %w", n, err)
		}
		initial[n] = fmt.Sprint(v)
	}
	vs := make([]Variant, len(parsed))
	for i, as := range parsed {
		values := map[string]string{}
		for _, n := range names {
			values[n] = initial[n]
		}
		for _, a := range as {
			values[a.name] = a.value
		}
		vs[i] = Variant{Name: labels[i], Apply: func() error {
			for _, n := range names {
				if err := o.SetOptionEnv(n + "=" + values[n]); err != nil {
					return err
				}
			}
			return nil
		}}
	}
	for _, v := range vs {
		if err := v.Apply(); err != nil {
			return nil, fmt.Errorf("bench: variant %q: %w", v.Name, err)
		}
	}
	for _, n := range names {
		if err := o.SetOptionEnv(n + "=" + initial[n]); err != nil {
			return nil, fmt.Errorf("bench: option %s back to %s: %w", n, initial[n], err)
		}
	}
	return vs, nil
}
