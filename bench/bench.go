// Package bench walks a session through growing context frontiers and
// measures, at each one, the prefill speed of the new interval and the greedy
// generation speed at the frontier (the logic of cmd/ds4-bench, after ds4's
// ds4-bench).
//
// For each frontier F (ascending): prefill the prompt's tokens [prev, F) in
// the session's chunks and time it; then greedy-decode Gen tokens and time
// them; then rewind the session to F (a rewind of Gen tokens, cheap while Gen
// is within the engine's RewindSlack) and go on to the next frontier.
package bench

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"ds4go/engine"
)

// Row is one frontier's measurement (one CSV line).
type Row struct {
	Frontier      int     // context length reached by the prefill
	PrefillTokens int     // tokens prefilled for this interval (Frontier − previous frontier)
	PrefillS      float64 // seconds for them
	PrefillTPS    float64 // PrefillTokens / PrefillS
	GenTokens     int     // tokens decoded at the frontier (greedy, or sampled: Options.Sampling)
	GenS          float64 // seconds for them
	GenTPS        float64 // GenTokens / GenS
	KVBytes       int64   // KV/state bytes the session holds at the frontier (StateLayout, f32)

	// With Options.Accept (not in the CSV): the plain run's speed,
	// and the speculative run's drafts, accepted drafts and drafts only
	// checked while speculation paused (engine.Stats; GenTPS is the
	// speculative run's speed).
	PlainGenTPS                float64
	Drafted, Accepted, Checked int
}

// Header is the CSV header line's fields.
var Header = []string{"frontier", "prefill_tokens", "prefill_s", "prefill_tps", "gen_tokens", "gen_s", "gen_tps", "kv_bytes"}

// Fields returns the row's CSV fields, in Header's order.
func (r Row) Fields() []string {
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
	return []string{strconv.Itoa(r.Frontier), strconv.Itoa(r.PrefillTokens), f(r.PrefillS), f(r.PrefillTPS),
		strconv.Itoa(r.GenTokens), f(r.GenS), f(r.GenTPS), strconv.FormatInt(r.KVBytes, 10)}
}

// Options configure Run.
type Options struct {
	Frontiers []int // ascending, > 0
	Gen       int   // tokens generated at each frontier (0: none)
	// Warmup, when positive, prefills that many tokens (the prompt's last
	// ones) before the first frontier and rewinds the session to empty, so
	// that the rows measure a process past its one-time costs (kernel
	// modules loaded, library handles and the backend's scratch buffers
	// made) as a server is after its first request.
	Warmup int
	// Sampling draws the generated tokens with these options (a Sampler
	// seeded with Sampling.Seed) through Session.DecodePicked; the zero
	// value (temperature 0) decodes greedily through Session.DecodeGreedy.
	Sampling engine.SamplerOptions
	// HostGreedy (one step at a time) generates with Decode and the host's
	// choice over the downloaded logits — Greedy, or the sampler's draw —
	// the way before DecodeGreedy and DecodePicked, which on a GPU backend
	// queue each step before the host has read the token before it.
	HostGreedy bool
	// Accept, for a session made with engine.Options.Draft and Accept's
	// Accept as its ForceAccept, times speculative decoding at Accept's
	// rate: at each frontier a plain run (greedy, or drawn with Sampling;
	// speculation off, timed as Row.PlainGenTPS), then a speculative one
	// (Row.GenTPS).
	Accept *Acceptance
	// Settle, when positive, decodes that many tokens untimed at each
	// frontier before each timed decode (the plain and the speculative one
	// with Accept) and rewinds to the frontier, so that the timed run finds
	// its decode graphs built and, speculating, the session's draft policy
	// past its start — as a server's long-lived session is after its first
	// requests. Accept's draws restart after it (the timed run's draws are
	// the same as without). The session's RewindSlack should cover
	// max(Gen, Settle).
	Settle int
	// Progress, if set, is called after each row (for logs).
	Progress func(Row)
}

// DefaultFrontiers are 2048, 4096, …, 32768.
func DefaultFrontiers() []int { return []int{2048, 4096, 8192, 16384, 32768} }

// ParseFrontiers parses "2048,4096,8192" (ascending, distinct, positive).
func ParseFrontiers(s string) ([]int, error) {
	var fs []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bench: bad frontier %q", p)
		}
		fs = append(fs, n)
	}
	if len(fs) == 0 {
		return nil, errors.New("bench: no frontiers")
	}
	if !sort.IntsAreSorted(fs) {
		return nil, fmt.Errorf("bench: frontiers %v are not ascending", fs)
	}
	for i := 1; i < len(fs); i++ {
		if fs[i] == fs[i-1] {
			return nil, fmt.Errorf("bench: frontier %d repeated", fs[i])
		}
	}
	return fs, nil
}

// RandomTokens returns n token ids drawn uniformly from [0, vocab) by a
// generator seeded with seed.
func RandomTokens(n, vocab int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(r.IntN(vocab))
	}
	return t
}

// Repeat returns n tokens: toks repeated (for a text prompt shorter than the
// last frontier). toks must not be empty.
func Repeat(toks []int32, n int) []int32 {
	out := make([]int32, 0, n)
	for len(out) < n {
		out = append(out, toks[:min(len(toks), n-len(out))]...)
	}
	return out
}

// KVBytes returns the bytes of KV state a session of this layout holds at
// position pos: the row tables' rows that exist at pos plus the rings' full
// capacity (all f32, the engine's portable layout; a backend may store less).
func KVBytes(l *engine.StateLayout, pos int) int64 {
	var b int64
	for layer := 0; layer < l.Config.Layers; layer++ {
		for _, p := range l.Parts(layer) {
			n := l.Capacity(layer, p)
			if !p.ByPosition() {
				n = l.Rows(layer, p, pos)
			}
			b += int64(n) * int64(l.Width(layer, p)) * 4
		}
	}
	return b
}

// Run walks s (which must be empty) through the frontiers with prompt's
// tokens (len(prompt) ≥ the last frontier) and returns a row per frontier
// reached. On an error (a cancelled ctx, say) it returns the rows completed
// so far with the error.
func Run(ctx context.Context, s *engine.Session, prompt []int32, o Options) ([]Row, error) {
	if s.Pos() != 0 {
		return nil, errors.New("bench: session is not empty")
	}
	if len(o.Frontiers) == 0 {
		return nil, errors.New("bench: no frontiers")
	}
	if o.Settle < 0 {
		return nil, fmt.Errorf("bench: settle %d < 0", o.Settle)
	}
	if o.HostGreedy && o.Accept != nil {
		return nil, errors.New("bench: host-chosen steps time plain decoding, not a forced acceptance")
	}
	last := o.Frontiers[len(o.Frontiers)-1]
	if len(prompt) < last {
		return nil, fmt.Errorf("bench: prompt of %d tokens is shorter than frontier %d", len(prompt), last)
	}
	if err := warmUp(ctx, s, prompt, o.Warmup); err != nil {
		return nil, err
	}
	var rows []Row
	prev := 0
	for _, f := range o.Frontiers {
		if f <= prev {
			return rows, fmt.Errorf("bench: frontiers must ascend (%d after %d)", f, prev)
		}
		r := Row{Frontier: f, PrefillTokens: f - prev}
		t0 := time.Now()
		if err := s.Prefill(ctx, prompt[prev:f]); err != nil {
			return rows, fmt.Errorf("bench: prefill to %d: %w", f, err)
		}
		r.PrefillS = time.Since(t0).Seconds()
		r.PrefillTPS = rate(r.PrefillTokens, r.PrefillS)
		r.KVBytes = KVBytes(s.Layout(), f)
		if o.Gen > 0 {
			// (a sampler at temperature 0 draws Greedy's choice)
			sampled := o.Sampling.Temperature > 0
			sm := engine.NewSampler(o.Sampling)
			choose := sm.Sample
			// decode generates n tokens: sampled through DecodePicked,
			// else greedily through DecodeGreedy
			decode := func(ctx context.Context, s *engine.Session, n int) error {
				if sampled {
					_, err := s.DecodePicked(ctx, n, engine.FilterFor(o.Sampling), func(l *engine.Logits) (int32, bool) {
						return sm.SampleLogits(l, o.Sampling), true
					})
					return err
				}
				_, err := s.DecodeGreedy(ctx, n, func(int32) bool { return true })
				return err
			}
			if o.HostGreedy {
				decode = func(ctx context.Context, s *engine.Session, n int) error {
					for range n {
						logits := s.Logits()
						if logits == nil {
							return fmt.Errorf("no logits at %d", s.Pos())
						}
						if err := s.Decode(ctx, choose(logits)); err != nil {
							return err
						}
					}
					return nil
				}
			}
			var err error
			if o.Accept != nil {
				err = o.Accept.run(ctx, s, f, o.Gen, o.Settle, &r, decode)
			} else if err = settle(ctx, s, f, o.Settle, decode); err == nil {
				t0 = time.Now()
				err = decode(ctx, s, o.Gen)
			}
			if err != nil {
				return rows, fmt.Errorf("bench: decode at %d: %w", s.Pos(), err)
			}
			if o.Accept == nil {
				r.GenS = time.Since(t0).Seconds()
			}
			r.GenTokens = o.Gen
			r.GenTPS = rate(r.GenTokens, r.GenS)
		}
		// the row is measured: kept (and reported) even if the rewind
		// fails or the context's deadline ends it (a rewind past the
		// session's RewindSlack re-prefills the whole frontier)
		rows = append(rows, r)
		if o.Progress != nil {
			o.Progress(r)
		}
		if o.Gen > 0 {
			if err := s.Rewind(ctx, f); err != nil {
				return rows, fmt.Errorf("bench: rewind to %d: %w", f, err)
			}
		}
		prev = f
	}
	return rows, nil
}

// settle decodes n tokens untimed at frontier f and rewinds to it
// (Options.Settle; nothing for n = 0).
func settle(ctx context.Context, s *engine.Session, f, n int, decode func(context.Context, *engine.Session, int) error) error {
	if n <= 0 {
		return nil
	}
	if err := decode(ctx, s, n); err != nil {
		return fmt.Errorf("settling: %w", err)
	}
	if err := s.Rewind(ctx, f); err != nil {
		return fmt.Errorf("rewind to %d after settling: %w", f, err)
	}
	return nil
}

// warmUp prefills the prompt's last n tokens (n > 0) into s and rewinds it
// to empty (Options.Warmup).
func warmUp(ctx context.Context, s *engine.Session, prompt []int32, n int) error {
	if n <= 0 {
		return nil
	}
	w := prompt[len(prompt)-min(n, len(prompt)):]
	if err := s.Prefill(ctx, w); err != nil {
		return fmt.Errorf("bench: warm-up prefill of %d tokens: %w", len(w), err)
	}
	if err := s.Rewind(ctx, 0); err != nil {
		return fmt.Errorf("bench: rewind after the warm-up: %w", err)
	}
	return nil
}

func rate(n int, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return float64(n) / s
}

// CSVWriter writes rows as CSV, flushing after each, so a run cut short
// leaves the rows it completed.
type CSVWriter struct{ w *csv.Writer }

// NewCSVWriter writes the header to w.
func NewCSVWriter(w io.Writer) (*CSVWriter, error) {
	c := &CSVWriter{csv.NewWriter(w)}
	c.w.Write(Header)
	c.w.Flush()
	return c, c.w.Error()
}

// Write writes one row and flushes.
func (c *CSVWriter) Write(r Row) error {
	c.w.Write(r.Fields())
	c.w.Flush()
	return c.w.Error()
}

// ReadCSV parses a CSV written by CSVWriter.
func ReadCSV(r io.Reader) ([]Row, error) {
	recs, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || strings.Join(recs[0], ",") != strings.Join(Header, ",") {
		return nil, errors.New("bench: CSV header is not " + strings.Join(Header, ","))
	}
	var rows []Row
	for i, rec := range recs[1:] {
		var r Row
		var errs [8]error
		r.Frontier, errs[0] = strconv.Atoi(rec[0])
		r.PrefillTokens, errs[1] = strconv.Atoi(rec[1])
		r.PrefillS, errs[2] = strconv.ParseFloat(rec[2], 64)
		r.PrefillTPS, errs[3] = strconv.ParseFloat(rec[3], 64)
		r.GenTokens, errs[4] = strconv.Atoi(rec[4])
		r.GenS, errs[5] = strconv.ParseFloat(rec[5], 64)
		r.GenTPS, errs[6] = strconv.ParseFloat(rec[6], 64)
		r.KVBytes, errs[7] = strconv.ParseInt(rec[7], 10, 64)
		if err := errors.Join(errs[:]...); err != nil {
			return nil, fmt.Errorf("bench: CSV line %d: %w", i+2, err)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// Acceptance times speculative decoding at a chosen acceptance rate: the
// session commits each draft with that probability (engine.Options.
// ForceAccept), whatever the model's choice, so that random weights —
// whose drafts the model never confirms — show the speed a trained MTP
// block of that acceptance gives (a pass costs the same whichever token it
// commits; the tokens are not greedy decoding's).
type Acceptance struct {
	rate float64
	seed uint64
	rng  *rand.Rand
}

// NewAcceptance returns an acceptance of probability rate (in [0, 1]),
// drawn from a generator seeded with seed.
func NewAcceptance(rate float64, seed uint64) (*Acceptance, error) {
	if !(rate >= 0 && rate <= 1) {
		return nil, fmt.Errorf("bench: draft acceptance rate %g must be in [0, 1]", rate)
	}
	a := &Acceptance{rate: rate, seed: seed}
	a.Reset()
	return a, nil
}

// Reset restarts the draws: the same commits again, in the same order.
func (a *Acceptance) Reset() { a.rng = rand.New(rand.NewPCG(a.seed, a.seed^0x51afd7ed558ccd)) }

// Rate is the probability a draft is committed.
func (a *Acceptance) Rate() float64 { return a.rate }

// Accept is an engine.Options.ForceAccept.
func (a *Acceptance) Accept(int) bool { return a.rng.Float64() < a.rate }

// run decodes gen tokens at frontier f with decode twice: plainly
// (speculation off), then, rewound, speculatively at the acceptance rate,
// and fills r. With settle > 0 each timed run follows settle tokens of its
// own kind, untimed and rewound (Options.Settle), and the draws restart
// after the speculative one's.
func (a *Acceptance) run(ctx context.Context, s *engine.Session, f, gen, settleN int, r *Row, decode func(context.Context, *engine.Session, int) error) error {
	if !s.SetSpeculate(false) {
		return errors.New("bench: a forced acceptance needs a session with drafting (engine.Options.Draft)")
	}
	if err := settle(ctx, s, f, settleN, decode); err != nil {
		return err
	}
	t0 := time.Now()
	if err := decode(ctx, s, gen); err != nil {
		return err
	}
	r.PlainGenTPS = rate(gen, time.Since(t0).Seconds())
	if err := s.Rewind(ctx, f); err != nil {
		return fmt.Errorf("rewind to %d: %w", f, err)
	}
	s.SetSpeculate(true)
	if settleN > 0 {
		if err := settle(ctx, s, f, settleN, decode); err != nil {
			return err
		}
		a.Reset()
	}
	st0 := s.Stats()
	t0 = time.Now()
	err := decode(ctx, s, gen)
	r.GenS = time.Since(t0).Seconds()
	st := s.Stats()
	r.Drafted, r.Accepted, r.Checked = st.Drafted-st0.Drafted, st.Accepted-st0.Accepted, st.Checked-st0.Checked
	return err
}
