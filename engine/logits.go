package engine

// PickFilter asks a PickPipeliner for min-p's candidates of each step's
// logits instead of all of them (DecodePicked): the device finds them and
// the host draws from a few thousand values at most, not the vocabulary.
// A Sampler draws from them what it draws from all the logits when its
// options have this temperature and min-p and no top-k (SampleLogits).
type PickFilter struct {
	Temperature float32 // > 0
	MinP        float32 // > 0
}

// For reports the filter whose candidates serve draws with options o, or
// nil when none does (greedy, no min-p, or a top-k cap).
func FilterFor(o SamplerOptions) *PickFilter {
	if o.Temperature <= 0 || o.MinP <= 0 || o.TopK > 0 {
		return nil
	}
	return &PickFilter{Temperature: o.Temperature, MinP: o.MinP}
}

// Candidates are min-p's candidates of a step's logits under Filter: every
// token whose logit reaches the cut the Sampler's min-p prefilter uses —
// Top's logit + Temperature·ln(MinP) − 1e-3, or more: a superset is
// allowed — and Top, in id order.
type Candidates struct {
	Filter   PickFilter
	Top      int32     // the greedy choice over all the logits (Greedy's)
	TopLogit float32   // its logit
	IDs      []int32   // ascending
	Values   []float32 // their logits
}

// Logits are a decode step's next-token logits as DecodePicked offers them:
// all of them, or min-p's candidates found by the backend (then the others
// are fetched only if asked for: All). Valid during the pick call.
type Logits struct {
	dense []float32
	cand  *Candidates
	fetch func() ([]float32, error)
	err   error
}

// DenseLogits wraps all of a step's logits.
func DenseLogits(l []float32) *Logits { return &Logits{dense: l} }

// CandidateLogits wraps a step's min-p candidates alone (All returns nil:
// for draws the candidates serve).
func CandidateLogits(c *Candidates) *Logits { return &Logits{cand: c} }

// All returns every logit (Vocab values), fetching them from the backend
// when only candidates came; nil if that failed (Err).
func (l *Logits) All() []float32 {
	if l.dense == nil && l.fetch != nil && l.err == nil {
		l.dense, l.err = l.fetch()
	}
	return l.dense
}

// Candidates returns min-p's candidates when the backend found them (nil:
// use All).
func (l *Logits) Candidates() *Candidates { return l.cand }

// Err reports a failure to fetch the logits (All).
func (l *Logits) Err() error { return l.err }

// Greedy is engine.Greedy over all the logits.
func (l *Logits) Greedy() int32 {
	if l.cand != nil {
		return l.cand.Top
	}
	return Greedy(l.All())
}

// SampleLogits is SampleWith over all of l's logits: the same draw, from
// the candidates alone when l carries them for o's temperature and min-p
// (and o has no top-k cap).
func (s *Sampler) SampleLogits(l *Logits, o SamplerOptions) int32 {
	if o.Temperature <= 0 {
		return l.Greedy()
	}
	if c := l.cand; c != nil {
		if f := FilterFor(o); f != nil && *f == c.Filter {
			return s.sampleCandidates(c, o)
		}
	}
	all := l.All()
	if all == nil {
		return 0 // (the caller reports l.Err)
	}
	return s.SampleWith(all, o)
}
