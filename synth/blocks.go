package synth

import (
	"encoding/binary"
	"math"
	"sync"

	"ds4go/quant"
)

// Direct generation of quantized blocks: random quants with scales chosen so
// that every sub-block has zero mean, and a super-block scale d that sets the
// standard deviation. A block's values are linear in d (dmin is a fixed
// multiple of d), so the std of blocks made with d = 1 (unitStd, measured
// once with quant.Dequantize) converts a target std into d.
//
//   - Q8_0: d, 32 uniform int8 quants in -127..127 (ggml never writes -128).
//   - Q2_K: sub-block scale sc uniform in 8..15 with min m = sc and
//     dmin = 1.5·d, so value = d·sc·(q − 1.5), q uniform in 0..3.
//   - Q4_K: sc uniform in 32..63, m = sc, dmin = 7.5·d, so
//     value = d·sc·(q − 7.5), q uniform in 0..15.
//   - IQ2_XXS: every bit random (grid points, signs, 4-bit sub-block scales).
type blockGen struct {
	t    quant.Type
	gen  func(r *rng, blk []byte, d, dmin uint16)
	dmin float32 // dmin / d

	once sync.Once
	unit float64
}

var blockGens = map[quant.Type]*blockGen{
	quant.Q8_0:    {t: quant.Q8_0, gen: genQ8_0},
	quant.Q2_K:    {t: quant.Q2_K, gen: genQ2K, dmin: 1.5},
	quant.Q4_K:    {t: quant.Q4_K, gen: genQ4K, dmin: 7.5},
	quant.IQ2_XXS: {t: quant.IQ2_XXS, gen: genIQ2XXS},
}

// fill writes whole blocks into dst with super-block scale d (f16 bits).
func (g *blockGen) fill(r *rng, dst []byte, d uint16) {
	dmin := quant.F32ToF16(quant.F16ToF32(d) * g.dmin)
	bs := g.t.BlockBytes()
	for off := 0; off+bs <= len(dst); off += bs {
		g.gen(r, dst[off:off+bs], d, dmin)
	}
}

// unitStd is the standard deviation of the values of blocks made with d = 1.
func (g *blockGen) unitStd() float64 {
	g.once.Do(func() {
		const nblocks = 4096
		buf := make([]byte, nblocks*g.t.BlockBytes())
		g.fill(&rng{s: 1}, buf, quant.F32ToF16(1))
		x := make([]float32, nblocks*g.t.BlockSize())
		if err := quant.Dequantize(g.t, buf, x); err != nil {
			panic(err)
		}
		var s, ss float64
		for _, v := range x {
			s += float64(v)
			ss += float64(v) * float64(v)
		}
		n := float64(len(x))
		g.unit = math.Sqrt(ss/n - (s/n)*(s/n))
	})
	return g.unit
}

// no128 turns every 0x80 byte (int8 -128) of x into 0x81 (-127).
func no128(x uint64) uint64 {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	y := x ^ hi
	// High bit set in bytes where y is zero (and in 0x01 bytes above a
	// zero, which are x = 0x81 and stay unchanged by the OR).
	m := (y - lo) &^ y & hi
	return x | m>>7
}

func genQ8_0(r *rng, b []byte, d, _ uint16) {
	binary.LittleEndian.PutUint16(b[0:], d)
	binary.LittleEndian.PutUint64(b[2:], no128(r.next()))
	binary.LittleEndian.PutUint64(b[10:], no128(r.next()))
	binary.LittleEndian.PutUint64(b[18:], no128(r.next()))
	binary.LittleEndian.PutUint64(b[26:], no128(r.next()))
}

func genQ2K(r *rng, b []byte, d, dmin uint16) {
	// 16 scale bytes: scale and min (low and high nibble) both sc in 8..15.
	s := r.next()
	for i := 0; i < 16; i++ {
		sc := byte(8 | (s>>(3*i))&7)
		b[i] = sc | sc<<4
	}
	for i := 16; i < 80; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.next())
	}
	binary.LittleEndian.PutUint16(b[80:], d)
	binary.LittleEndian.PutUint16(b[82:], dmin)
}

func genQ4K(r *rng, b []byte, d, dmin uint16) {
	binary.LittleEndian.PutUint16(b[0:], d)
	binary.LittleEndian.PutUint16(b[2:], dmin)
	// Eight 6-bit scales sc in 32..63 with mins m = sc, packed as ggml's
	// get_scale_min_k4 reads them.
	s := r.next()
	var sc [8]byte
	for j := range sc {
		sc[j] = byte(32 | (s>>(5*j))&31)
	}
	m := &sc
	for j := 0; j < 4; j++ {
		b[4+j] = sc[j]&63 | (sc[j+4]>>4)<<6
		b[4+j+4] = m[j]&63 | (m[j+4]>>4)<<6
		b[4+j+8] = sc[j+4]&0xf | (m[j+4]&0xf)<<4
	}
	for i := 16; i < 144; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.next())
	}
}

func genIQ2XXS(r *rng, b []byte, d, _ uint16) {
	binary.LittleEndian.PutUint16(b[0:], d)
	for i := 2; i < 66; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.next())
	}
}
