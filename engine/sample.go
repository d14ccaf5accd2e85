package engine

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
)

// SamplerOptions chooses how the next token is drawn from the logits.
// The zero value is greedy decoding.
type SamplerOptions struct {
	// Temperature divides the logits; ≤ 0 means greedy (argmax, the lowest
	// id on ties), ignoring the other fields.
	Temperature float32
	// TopK keeps the K most likely tokens (0: all).
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP (0 or ≥ 1: all).
	TopP float32
	// MinP keeps tokens whose probability is at least MinP times the most
	// likely token's (0: all).
	MinP float32
	// Seed seeds the sampler's random generator: the same seed, options and
	// logits give the same tokens.
	Seed uint64
}

// Sampler draws tokens from logits. The filters apply in the order
// temperature → top-k → softmax → min-p → top-p, then one token is drawn
// from the renormalised distribution. It is not safe for concurrent use.
type Sampler struct {
	opts SamplerOptions
	rng  *rand.Rand
	key  []uint64  // the candidates' rank keys (orderKey)
	wt   []float64 // weights by token id
}

// NewSampler returns a sampler.
func NewSampler(o SamplerOptions) *Sampler {
	return &Sampler{opts: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))}
}

// Options returns the sampler's options.
func (s *Sampler) Options() SamplerOptions { return s.opts }

// Greedy returns the id of the largest logit (the lowest id on ties; NaNs
// are never chosen unless every logit is NaN).
//
// It runs between two decode steps, so it keeps four running maxima (ids
// i ≡ j mod 4) that do not wait on each other, then merges them by value and
// id; NaNs never compare greater, so only the start must skip them.
func Greedy(logits []float32) int32 {
	first := 0
	for first < len(logits) && logits[first] != logits[first] {
		first++
	}
	if first == len(logits) {
		return 0
	}
	var bi [4]int
	var bv [4]float32
	for j := range bi {
		bi[j], bv[j] = first, logits[first]
	}
	i := first + 1
	for ; i+4 <= len(logits); i += 4 {
		x := logits[i : i+4 : i+4]
		if x[0] > bv[0] {
			bi[0], bv[0] = i, x[0]
		}
		if x[1] > bv[1] {
			bi[1], bv[1] = i+1, x[1]
		}
		if x[2] > bv[2] {
			bi[2], bv[2] = i+2, x[2]
		}
		if x[3] > bv[3] {
			bi[3], bv[3] = i+3, x[3]
		}
	}
	for ; i < len(logits); i++ {
		if logits[i] > bv[0] {
			bi[0], bv[0] = i, logits[i]
		}
	}
	best, v := bi[0], bv[0]
	for j := 1; j < 4; j++ {
		if bv[j] > v || (bv[j] == v && bi[j] < best) {
			best, v = bi[j], bv[j]
		}
	}
	return int32(best)
}

// Sample draws a token id from logits.
//
// It never sorts the vocabulary: top-k and top-p pick their sets by
// quickselect over the order (logit descending, lower id first), expected
// linear time, and the draw walks the chosen set in the order the
// selection left it (any fixed order draws from the same distribution).
// The comparisons are of precomputed integer keys and a large vocabulary's
// weights are exponentiated on several cores; neither changes a draw.
func (s *Sampler) Sample(logits []float32) int32 {
	return s.SampleWith(logits, s.opts)
}

// SampleWith draws a token id from logits with other options than the
// sampler's (their Seed is ignored: the draw uses the sampler's random
// stream). A server uses it to apply each request's settings to one seeded
// stream.
func (s *Sampler) SampleWith(logits []float32, o SamplerOptions) int32 {
	if o.Temperature <= 0 || len(logits) == 0 {
		return Greedy(logits)
	}
	// The candidates are their rank keys (an id is a key's low 32 bits),
	// in id order; selection moves keys only, weights are kept by id. A
	// candidate's logit is neither NaN nor −Inf (v > −Inf is false for both).
	// The best candidate is Greedy's choice (the first of the largest
	// logits, NaNs skipped); there is none when that logit is −Inf.
	negInf := float32(math.Inf(-1))
	top := Greedy(logits)
	if !(logits[top] > negInf) {
		return top
	}
	invT := 1 / float64(o.Temperature)
	s.key = s.key[:0]
	topK := false
	if o.TopK > 0 { // (the count matters only against a cap)
		n := 0
		for _, v := range logits {
			if v > negInf {
				n++
			}
		}
		topK = o.TopK < n
	}
	if topK || o.MinP <= 0 {
		for i, v := range logits {
			if v > negInf {
				s.key = append(s.key, orderKey(v, int32(i)))
			}
		}
		if topK {
			selectBest(s.key, o.TopK)
			s.key = s.key[:o.TopK]
			top = keyID(slices.Min(s.key))
		}
	}
	// Weights at the temperature relative to the best token (which has 1).
	lt := float64(logits[top])
	if o.MinP > 0 {
		// Logits this far below the best cannot reach min-p's weight:
		// drop them before their exp (the exact test follows). Without
		// top-k the survivors' keys are made directly, in id order.
		cut := minPCut(lt, o)
		if topK {
			n := 0
			for _, k := range s.key {
				if id := keyID(k); float64(logits[id]) >= cut || id == top {
					s.key[n] = k
					n++
				}
			}
			s.key = s.key[:n]
		} else {
			// float64(v) ≥ cut compared in float32 (as fast as Greedy's scan)
			c32 := leastFloat32AtLeast(cut)
			for i, v := range logits {
				if (v >= c32 && v > negInf) || int32(i) == top {
					s.key = append(s.key, orderKey(v, int32(i)))
				}
			}
		}
	}
	return s.drawKeys(o, top, lt, invT, len(logits))
}

// sampleCandidates is SampleWith's draw over the logits that c holds (min-p
// with c's temperature and min-p, no top-k): the prefilter's keys are those
// SampleWith makes from all the logits, since every logit that passes its
// cut is a candidate, and they come in the same (id) order.
func (s *Sampler) sampleCandidates(c *Candidates, o SamplerOptions) int32 {
	negInf := float32(math.Inf(-1))
	top := c.Top
	if !(c.TopLogit > negInf) {
		return top
	}
	lt := float64(c.TopLogit)
	c32 := leastFloat32AtLeast(minPCut(lt, o))
	s.key = s.key[:0]
	n := int(top) + 1
	for i, id := range c.IDs {
		if v := c.Values[i]; (v >= c32 && v > negInf) || id == top {
			s.key = append(s.key, orderKey(v, id))
		}
		n = max(n, int(id)+1)
	}
	return s.drawKeys(o, top, lt, 1/float64(o.Temperature), n)
}

// minPCut is the min-p prefilter's cut below the best logit lt: a logit
// under it cannot reach min-p's weight exp((v − lt)/T) ≥ MinP (a margin
// of 1e-3 keeps the exact test, which follows, the one that decides). The
// device's candidates (ds4c_pick_candidates) reach a threshold below it.
func minPCut(lt float64, o SamplerOptions) float64 {
	return lt + float64(o.Temperature)*math.Log(float64(o.MinP)) - 1e-3
}

// drawKeys ends a draw: the weights of the candidates s.key (ids below n)
// at the temperature relative to the best token top (logit lt), min-p's
// exact test, top-p's nucleus, then the draw.
func (s *Sampler) drawKeys(o SamplerOptions, top int32, lt, invT float64, n int) int32 {
	if len(s.wt) < n {
		s.wt = make([]float64, n)
	}
	w := s.wt
	expWeights(w, s.key, lt, invT)
	// min-p keeps weights ≥ MinP (the best token's weight is 1).
	if o.MinP > 0 {
		n := 0
		for _, k := range s.key {
			if id := keyID(k); w[id] >= float64(o.MinP) || id == top {
				s.key[n] = k
				n++
			}
		}
		s.key = s.key[:n]
	}
	if o.TopP > 0 && o.TopP < 1 {
		var total float64
		for _, k := range s.key {
			total += w[keyID(k)]
		}
		s.key = s.key[:nucleus(s.key, w, float64(o.TopP)*total)]
	}
	var total float64
	for _, k := range s.key {
		total += w[keyID(k)]
	}
	u := s.rng.Float64() * total
	for _, k := range s.key {
		u -= w[keyID(k)]
		if u < 0 {
			return keyID(k)
		}
	}
	return keyID(s.key[len(s.key)-1])
}

// leastFloat32AtLeast returns the least float32 c with float64(c) ≥ x, so
// that float64(v) ≥ x and v ≥ c agree for every float32 v (NaN for x NaN:
// both false).
func leastFloat32AtLeast(x float64) float32 {
	c := float32(x)
	if float64(c) < x {
		c = math.Nextafter32(c, float32(math.Inf(1)))
	}
	return c
}

// orderKey is the rank key of token id with logit v (not NaN): smaller keys
// are better — the larger logit, then the lower id (−0 ranks as +0, which
// compares equal to it).
func orderKey(v float32, id int32) uint64 {
	if v == 0 {
		v = 0
	}
	b := math.Float32bits(v)
	if b&0x80000000 != 0 {
		b = ^b // negative: larger magnitude, smaller value
	} else {
		b |= 0x80000000
	}
	// b now grows with v; its complement shrinks with v
	return uint64(^b)<<32 | uint64(uint32(id))
}

// keyID is the token id of a rank key.
func keyID(k uint64) int32 { return int32(uint32(k)) }

// keyValue is the logit of a rank key (orderKey's v; −0 comes back as +0).
func keyValue(k uint64) float32 {
	b := ^uint32(k >> 32)
	if b&0x80000000 != 0 {
		return math.Float32frombits(b &^ 0x80000000)
	}
	return math.Float32frombits(^b)
}

// partition rearranges keys[lo:hi] around a pivot chosen from the middle:
// the better keys (smaller), then the pivot, then the rest. It returns the
// pivot's final index.
func partition(keys []uint64, lo, hi int) int {
	// Median of three as the pivot, moved to hi-1.
	m := lo + (hi-lo)/2
	a, b, c := lo, m, hi-1
	if keys[b] < keys[a] {
		a, b = b, a
	}
	if keys[c] < keys[b] {
		b = c
		if keys[b] < keys[a] {
			b = a
		}
	}
	keys[b], keys[hi-1] = keys[hi-1], keys[b]
	pv := keys[hi-1]
	store := lo
	// Lomuto's scan without a branch on the comparison (its outcome is a
	// coin toss on a large vocabulary, and the mispredictions were most of
	// the sampler's time): keys[i] and keys[store] are exchanged through a
	// mask that is all ones when keys[i] < pv and zero otherwise, so the
	// arrangement is the branching form's, element for element.
	for i := lo; i < hi-1; i++ {
		v, s := keys[i], keys[store]
		var lt uint64
		if v < pv {
			lt = 1
		}
		x := (v ^ s) & -lt
		keys[i], keys[store] = v^x, s^x
		store += int(lt)
	}
	keys[store], keys[hi-1] = keys[hi-1], keys[store]
	return store
}

// expWeights sets w[id] = exp((logit − lt)·invT) for the ids of keys (each
// logit read back from its key), on several goroutines for a large
// vocabulary (each value is computed as it would be alone: the results do
// not depend on the split).
func expWeights(w []float64, keys []uint64, lt, invT float64) {
	one := func(lo, hi int) {
		for _, k := range keys[lo:hi] {
			w[keyID(k)] = math.Exp((float64(keyValue(k)) - lt) * invT)
		}
	}
	const minChunk = 16384
	workers := min(runtime.GOMAXPROCS(0), 8, len(keys)/minChunk)
	if workers < 2 {
		one(0, len(keys))
		return
	}
	var wg sync.WaitGroup
	step := (len(keys) + workers - 1) / workers
	for lo := 0; lo < len(keys); lo += step {
		wg.Go(func() { one(lo, min(lo+step, len(keys))) })
	}
	wg.Wait()
}

// logitOrder orders token ids by logit, largest first, ties by lower id.
func logitOrder(logits []float32) func(a, b int32) bool {
	return func(a, b int32) bool {
		if la, lb := logits[a], logits[b]; la != lb {
			return la > lb
		}
		return a < b
	}
}

// TopK returns the ids of the k largest logits (NaNs excluded), largest
// first, ties by lower id — the order greedy sampling ranks them in.
func TopK(logits []float32, k int) []int32 {
	ids := make([]int32, 0, len(logits))
	for i, v := range logits {
		if v == v {
			ids = append(ids, int32(i))
		}
	}
	keys := make([]uint64, len(ids))
	for i, id := range ids {
		keys[i] = orderKey(logits[id], id)
	}
	k = min(max(k, 0), len(ids))
	selectBest(keys, k)
	ids = ids[:k]
	for i := range ids {
		ids[i] = keyID(keys[i])
	}
	better := logitOrder(logits)
	slices.SortFunc(ids, func(a, b int32) int {
		if better(a, b) {
			return -1
		}
		return 1
	})
	return ids
}

// selectBest moves the k best (smallest) keys to keys[:k], in no order.
func selectBest(keys []uint64, k int) {
	lo, hi := 0, len(keys)
	for hi-lo > 1 {
		p := partition(keys, lo, hi)
		switch {
		case p == k || p == k-1:
			return
		case p > k:
			hi = p
		default:
			lo = p + 1
		}
	}
}

// nucleus rearranges keys so that keys[:n] is the smallest set of the best
// (smallest) keys whose weights (w, by token id) reach need (all of them if
// they never do), and returns n.
func nucleus(keys []uint64, w []float64, need float64) int {
	lo, hi := 0, len(keys)
	for hi > lo {
		if hi-lo == 1 {
			return hi
		}
		p := partition(keys, lo, hi)
		var mass float64
		for _, k := range keys[lo:p] {
			mass += w[keyID(k)]
		}
		wp := w[keyID(keys[p])]
		switch {
		case mass >= need:
			hi = p
		case mass+wp >= need:
			return p + 1
		default:
			need -= mass + wp
			lo = p + 1
		}
	}
	return max(lo, 1)
}
