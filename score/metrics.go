package score

import (
	"fmt"
	"math"
	"slices"
)

// RowError returns max|ref−got| / max|ref| over a row (the relative error
// docs/score.md and forward-reference-notes.md use). A reference row of
// zeros gives 0 when got is also zero and +Inf otherwise.
func RowError(ref, got []float32) float64 {
	var md, ma float64
	for i, a := range ref {
		md = max(md, math.Abs(float64(a)-float64(got[i])))
		ma = max(ma, math.Abs(float64(a)))
	}
	if ma == 0 {
		if md == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return md / ma
}

// LogSoftmax writes log(softmax(x)) into dst (grown as needed) in float64,
// subtracting the maximum first so that large logits do not overflow.
func LogSoftmax(x []float32, dst []float64) []float64 {
	dst = slices.Grow(dst[:0], len(x))[:len(x)]
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(s)
	for i, v := range x {
		dst[i] = float64(v) - lse
	}
	return dst
}

// KL returns KL(P‖Q) = Σ p·(log p − log q) for the log-probabilities lp, lq
// (terms with p = 0 contribute 0). It is ≥ 0 up to rounding.
func KL(lp, lq []float64) float64 {
	var kl float64
	for i, a := range lp {
		if p := math.Exp(a); p > 0 {
			kl += p * (a - lq[i])
		}
	}
	return max(kl, 0)
}

// Argmax returns the index of the largest value (the lowest on ties, as
// greedy sampling picks).
func Argmax(x []float32) int {
	b := 0
	for i, v := range x {
		if v > x[b] {
			b = i
		}
	}
	return b
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of sorted values by linear
// interpolation between the closest ranks (numpy's default): index
// h = (n−1)·q, value s[⌊h⌋] + (h−⌊h⌋)·(s[⌊h⌋+1] − s[⌊h⌋]). NaN for no values.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	h := float64(n-1) * q
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	f := h - float64(lo)
	if f == 0 {
		return sorted[lo]
	}
	return sorted[lo] + f*(sorted[lo+1]-sorted[lo])
}

// CheckFinite returns an error naming the first NaN or infinite value.
func CheckFinite(x []float32) error {
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("value %v at index %d", v, i)
		}
	}
	return nil
}

// Summary is the agreement of a model's logit rows with reference rows.
type Summary struct {
	Rows int `json:"rows"`
	// Per-row relative error max|a−b| / max|a| (a = reference): median,
	// 95th percentile and maximum, and the position of the maximum.
	RelErrP50    float64 `json:"rel_err_p50"`
	RelErrP95    float64 `json:"rel_err_p95"`
	RelErrMax    float64 `json:"rel_err_max"`
	RelErrMaxPos int     `json:"rel_err_max_pos"`
	// KL(reference ‖ model) per row, in nats: mean and maximum, and the
	// position of the maximum.
	KLMean   float64 `json:"kl_mean"`
	KLMax    float64 `json:"kl_max"`
	KLMaxPos int     `json:"kl_max_pos"`
	// Top1 is the fraction of rows whose argmax agrees.
	Top1 float64 `json:"top1"`
}

// Comparer accumulates the agreement of model rows with reference rows.
type Comparer struct {
	errs   []float64
	klSum  float64
	s      Summary
	agree  int
	lp, lq []float64
}

// Add compares one row at a position. Both rows must have the same length
// and finite values.
func (c *Comparer) Add(pos int, ref, got []float32) error {
	if len(ref) != len(got) {
		return fmt.Errorf("score: position %d: reference row has %d values, model row %d", pos, len(ref), len(got))
	}
	if len(ref) == 0 {
		return fmt.Errorf("score: position %d: empty rows", pos)
	}
	if err := CheckFinite(ref); err != nil {
		return fmt.Errorf("%w: reference logits at position %d: %v", ErrInput, pos, err)
	}
	if err := CheckFinite(got); err != nil {
		return fmt.Errorf("score: model logits at position %d are not finite: %v", pos, err)
	}
	e := RowError(ref, got)
	if len(c.errs) == 0 || e > c.s.RelErrMax {
		c.s.RelErrMax, c.s.RelErrMaxPos = e, pos
	}
	c.errs = append(c.errs, e)
	c.lp = LogSoftmax(ref, c.lp)
	c.lq = LogSoftmax(got, c.lq)
	kl := KL(c.lp, c.lq)
	if c.s.Rows == 0 || kl > c.s.KLMax {
		c.s.KLMax, c.s.KLMaxPos = kl, pos
	}
	c.klSum += kl
	if Argmax(ref) == Argmax(got) {
		c.agree++
	}
	c.s.Rows++
	return nil
}

// Summary returns the agreement over the rows added so far.
func (c *Comparer) Summary() Summary {
	s := c.s
	if s.Rows == 0 {
		return s
	}
	sorted := slices.Clone(c.errs)
	slices.Sort(sorted)
	s.RelErrP50 = Quantile(sorted, 0.5)
	s.RelErrP95 = Quantile(sorted, 0.95)
	s.KLMean = c.klSum / float64(s.Rows)
	s.Top1 = float64(c.agree) / float64(s.Rows)
	return s
}

// Bounds are acceptance limits on a Summary; a zero field is not checked.
type Bounds struct {
	MaxP50  float64 // median relative error ≤ MaxP50
	MaxKL   float64 // mean KL ≤ MaxKL
	MinTop1 float64 // top-1 agreement ≥ MinTop1
}

// Check returns one message per bound the summary violates (none when it
// is within all of them). A summary with no rows violates every bound set.
func (b Bounds) Check(s Summary) []string {
	var out []string
	if b.MaxP50 > 0 && !(s.Rows > 0 && s.RelErrP50 <= b.MaxP50) {
		out = append(out, fmt.Sprintf("median relative error %.3g > %.3g", s.RelErrP50, b.MaxP50))
	}
	if b.MaxKL > 0 && !(s.Rows > 0 && s.KLMean <= b.MaxKL) {
		out = append(out, fmt.Sprintf("mean KL %.3g > %.3g", s.KLMean, b.MaxKL))
	}
	if b.MinTop1 > 0 && !(s.Rows > 0 && s.Top1 >= b.MinTop1) {
		out = append(out, fmt.Sprintf("top-1 agreement %.4f < %.4f", s.Top1, b.MinTop1))
	}
	return out
}
