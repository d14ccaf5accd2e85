package synth

import (
	"math"
	"math/bits"
)

// rng is wyrand: one 64-bit multiply-xorshift per output, fast enough to fill
// memory at several GB/s per core, and statistically fine for weights.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

// float returns a uniform value in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) * (1.0 / (1 << 53)) }

// uniform returns a uniform value in [lo, hi).
func (r *rng) uniform(lo, hi float64) float64 { return lo + (hi-lo)*r.float() }

// intn returns a uniform integer in [0, n) (n > 0; the bias for n ≪ 2^64 is
// negligible).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// streamSeed derives the generator seed of one chunk of one tensor, so that
// every chunk's bytes depend only on (seed, tensor name, chunk index).
func streamSeed(seed uint64, name string, chunk int) uint64 {
	h := uint64(14695981039346656037) // FNV-1a
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return splitmix(splitmix(seed^splitmix(h)) + uint64(chunk))
}

// normalTable maps 16 random bits to an approximately standard normal value:
// entry i is the normal quantile of (i+0.5)/65536 (|x| ≤ 4.3).
var normalTable = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = float32(math.Sqrt2 * math.Erfinv(2*(float64(i)+0.5)/(1<<16)-1))
	}
	return &t
}()
