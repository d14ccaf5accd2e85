package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Byte offsets inside the blocks this package decodes (see docs/quant.md).
const (
	q8_0Bytes = 34 // d f16 @0, qs [32]int8 @2

	q2KScales = 0  // [16]uint8: low nibble scale, high nibble min
	q2KQs     = 16 // [64]uint8: 2-bit quants
	q2KD      = 80 // f16 super-block scale
	q2KDmin   = 82 // f16 super-block min scale
	q2KBytes  = 84

	q4KD      = 0  // f16 super-block scale
	q4KDmin   = 2  // f16 super-block min scale
	q4KScales = 4  // [12]uint8: 8 6-bit scales and 8 6-bit mins
	q4KQs     = 16 // [128]uint8: 4-bit quants
	q4KBytes  = 144

	q8KD     = 0   // f32 scale
	q8KQs    = 4   // [256]int8
	q8KBsums = 260 // [16]int16: sums of 16 consecutive quants
	q8KBytes = 292

	iq2xxsD     = 0 // f16 super-block scale
	iq2xxsQs    = 2 // 8 sub-blocks of 8 bytes: 4 grid indices, then a uint32 of 4x7 sign bits and a 4-bit scale
	iq2xxsBytes = 66
)

// Supported reports whether this package can dequantize, quantize and dot
// rows of type t.
func Supported(t Type) bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, Q8_K:
		return true
	}
	return false
}

// checkRow validates that src holds exactly the bytes of n values of type t.
func checkRow(t Type, nbytes, n int) error {
	if !Supported(t) {
		if t.Known() {
			return fmt.Errorf("quant: type %s is not supported", t)
		}
		return fmt.Errorf("quant: unknown tensor type %d", uint32(t))
	}
	want, err := t.RowBytes(int64(n))
	if err != nil {
		return err
	}
	if int64(nbytes) != want {
		return fmt.Errorf("quant: %d values of %s take %d bytes, got %d", n, t, want, nbytes)
	}
	return nil
}

// Dequantize decodes the values of type t in src into dst. dst's length is
// the number of values (one or more whole rows, which for these formats is
// the same as a whole number of blocks); src must hold exactly the bytes of
// len(dst) values. The results equal ggml's to_float bit for bit.
func Dequantize(t Type, src []byte, dst []float32) error {
	if err := checkRow(t, len(src), len(dst)); err != nil {
		return fmt.Errorf("dequantize: %w", err)
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = f16Table[binary.LittleEndian.Uint16(src[2*i:])]
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q8_0:
		for b := 0; b < len(dst)/32; b++ {
			dequantQ8_0Block((*[q8_0Bytes]byte)(src[b*q8_0Bytes:]), (*[32]float32)(dst[b*32:]))
		}
	case Q8_K:
		for b := 0; b < len(dst)/QK_K; b++ {
			blk := src[b*q8KBytes:]
			d := math.Float32frombits(binary.LittleEndian.Uint32(blk[q8KD:]))
			qs := (*[QK_K]byte)(blk[q8KQs:])
			out := (*[QK_K]float32)(dst[b*QK_K:])
			for i, q := range qs {
				out[i] = d * float32(int8(q))
			}
		}
	case Q2_K:
		for b := 0; b < len(dst)/QK_K; b++ {
			dequantQ2KBlock((*[q2KBytes]byte)(src[b*q2KBytes:]), (*[QK_K]float32)(dst[b*QK_K:]))
		}
	case Q4_K:
		for b := 0; b < len(dst)/QK_K; b++ {
			dequantQ4KBlock((*[q4KBytes]byte)(src[b*q4KBytes:]), (*[QK_K]float32)(dst[b*QK_K:]))
		}
	case IQ2_XXS:
		for b := 0; b < len(dst)/QK_K; b++ {
			dequantIQ2XXSBlock((*[iq2xxsBytes]byte)(src[b*iq2xxsBytes:]), (*[QK_K]float32)(dst[b*QK_K:]))
		}
	}
	return nil
}

func dequantQ8_0Block(blk *[q8_0Bytes]byte, out *[32]float32) {
	d := f16Table[binary.LittleEndian.Uint16(blk[0:])]
	for i := range out {
		out[i] = float32(int8(blk[2+i])) * d
	}
}

func dequantQ2KBlock(blk *[q2KBytes]byte, out *[QK_K]float32) {
	d := f16Table[binary.LittleEndian.Uint16(blk[q2KD:])]
	dmin := f16Table[binary.LittleEndian.Uint16(blk[q2KDmin:])]
	// Two halves of 128 values; each half uses 32 quant bytes, four 2-bit
	// planes of 32 values, each plane two sub-blocks of 16.
	for half := 0; half < 2; half++ {
		qs := (*[32]byte)(blk[q2KQs+32*half:])
		for plane := 0; plane < 4; plane++ {
			shift := uint(2 * plane)
			for sub := 0; sub < 2; sub++ {
				sc := blk[q2KScales+8*half+2*plane+sub]
				dl := d * float32(sc&0xf)
				ml := dmin * float32(sc>>4)
				o := out[128*half+32*plane+16*sub:][:16]
				q := qs[16*sub:][:16]
				for l := range o {
					o[l] = float32(dl*float32((q[l]>>shift)&3)) - ml
				}
			}
		}
	}
}

// q4KScaleMin extracts the 6-bit scale and min of sub-block j (0..7) from
// the 12 packed bytes of a Q4_K block.
func q4KScaleMin(s *[12]byte, j int) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

func dequantQ4KBlock(blk *[q4KBytes]byte, out *[QK_K]float32) {
	d := f16Table[binary.LittleEndian.Uint16(blk[q4KD:])]
	dmin := f16Table[binary.LittleEndian.Uint16(blk[q4KDmin:])]
	scales := (*[12]byte)(blk[q4KScales:])
	// Four chunks of 64 values; chunk c holds sub-block 2c in the low
	// nibbles of its 32 bytes and sub-block 2c+1 in the high nibbles.
	for c := 0; c < 4; c++ {
		q := (*[32]byte)(blk[q4KQs+32*c:])
		sc1, m1 := q4KScaleMin(scales, 2*c)
		sc2, m2 := q4KScaleMin(scales, 2*c+1)
		d1, dm1 := d*float32(sc1), dmin*float32(m1)
		d2, dm2 := d*float32(sc2), dmin*float32(m2)
		lo := (*[32]float32)(out[64*c:])
		hi := (*[32]float32)(out[64*c+32:])
		for l, b := range q {
			lo[l] = float32(d1*float32(b&0xf)) - dm1
			hi[l] = float32(d2*float32(b>>4)) - dm2
		}
	}
}

// iq2SignMask returns the 8-bit sign mask encoded by a 7-bit sign index: the
// eighth sign makes the number of negative values even (ggml's ksigns_iq2xs).
func iq2SignMask(idx uint32) uint8 {
	idx &= 127
	parity := uint8(0)
	for v := idx; v != 0; v &= v - 1 {
		parity ^= 1
	}
	return uint8(idx) | parity<<7
}

// iq2SignTable caches iq2SignMask for the 128 sign indices.
var iq2SignTable = func() (t [128]uint8) {
	for i := range t {
		t[i] = iq2SignMask(uint32(i))
	}
	return t
}()

// iq2GridBytes is iq2xxsGrid unpacked to bytes.
var iq2GridBytes = func() (g [256][8]uint8) {
	for i, v := range iq2xxsGrid {
		binary.LittleEndian.PutUint64(g[i][:], v)
	}
	return g
}()

func dequantIQ2XXSBlock(blk *[iq2xxsBytes]byte, out *[QK_K]float32) {
	d := f16Table[binary.LittleEndian.Uint16(blk[iq2xxsD:])]
	for ib := 0; ib < 8; ib++ {
		sub := blk[iq2xxsQs+8*ib:]
		aux := binary.LittleEndian.Uint32(sub[4:])
		db := float32(d*(0.5+float32(aux>>28))) * 0.25
		for g := 0; g < 4; g++ {
			grid := &iq2GridBytes[sub[g]]
			signs := iq2SignTable[(aux>>(7*g))&127]
			o := (*[8]float32)(out[32*ib+8*g:])
			sb := uint32(signs)
			for j := range o {
				// negate by flipping the sign bit: exact, and branch-free
				v := math.Float32bits(db * float32(grid[j]))
				o[j] = math.Float32frombits(v ^ (sb>>j&1)<<31)
			}
		}
	}
}
