package quant

import (
	"encoding/binary"
	"math"
	"sync"
)

// IQ2_XXS quantization (this package's own search, not ggml's algorithm).
//
// A block dequantizes value i of sub-block ib (32 values) and group g (8
// values) as db(ib) * v * sign, where v ∈ {8, 25, 43} is coordinate j of
// codebook point grid[idx(ib,g)], db(ib) = d*(0.5+l(ib))/4 = (d/8)*(2l+1)
// with a 4-bit l, and the sign pattern of the group has an even number of
// minus signs.
//
// The encoder:
//  1. Per group, takes magnitudes a = |x| and, when x has an odd number of
//     negatives, flips the sign of the smallest |x| (its target becomes -|x|).
//  2. Per sub-block, tries a handful of scales s; for each, every group picks
//     its nearest codebook point (round each coordinate to the nearest level
//     of s*{8,25,43}; if that lattice point is not in the codebook, search the
//     precomputed codebook neighbours of that lattice point), then s is
//     refitted by least squares. The scale with the least error wins.
//  3. Per block, tries d = 8*max(s)/(2L+1) for every L in 0..15, rounds each
//     sub-block scale to its nearest odd multiple of d/8, re-picks the
//     codebook points at the exact dequantized scale, and keeps the d with the
//     least total squared error.
//
// Step 3 tries every L so that quantizing a dequantized block finds the
// block's own d and reproduces its values exactly.

// iq2Levels are the three codebook magnitudes.
var iq2Levels = [3]float32{8, 25, 43}

type iq2Tables struct {
	grid  [256][8]float32
	norm  [256]float32 // sum of squares of each point
	index [6561]int16  // lattice point (base-3 level digits) -> codebook index, or -1
	// neighbours of an off-codebook lattice point u: nbrs[nbrOff[u]:nbrOff[u+1]]
	nbrOff [6562]int32
	nbrs   []uint8
}

var (
	iq2Once sync.Once
	iq2Tab  *iq2Tables
)

func iq2TablesGet() *iq2Tables {
	iq2Once.Do(func() { iq2Tab = buildIQ2Tables() })
	return iq2Tab
}

func levelIndex(v uint8) int {
	switch v {
	case 8:
		return 0
	case 25:
		return 1
	}
	return 2
}

func buildIQ2Tables() *iq2Tables {
	t := &iq2Tables{}
	for i := range t.index {
		t.index[i] = -1
	}
	var lat [256][8]int
	for i := range iq2GridBytes {
		u, p := 0, 1
		for j, v := range iq2GridBytes[i] {
			t.grid[i][j] = float32(v)
			t.norm[i] += float32(v) * float32(v)
			lat[i][j] = levelIndex(v)
			u += lat[i][j] * p
			p *= 3
		}
		t.index[u] = int16(i)
	}
	// For each lattice point off the codebook, keep the codebook points at
	// the smallest and second-smallest squared distance (in level units).
	var dist [256]float32
	for u := 0; u < 6561; u++ {
		t.nbrOff[u] = int32(len(t.nbrs))
		if t.index[u] >= 0 {
			continue
		}
		var pt [8]float32
		for j, v := 0, u; j < 8; j, v = j+1, v/3 {
			pt[j] = iq2Levels[v%3]
		}
		d1, d2 := float32(1e30), float32(1e30)
		for i := range t.grid {
			var s float32
			for j := range pt {
				e := pt[j] - t.grid[i][j]
				s += e * e
			}
			dist[i] = s
			switch {
			case s < d1:
				d1, d2 = s, d1
			case s > d1 && s < d2:
				d2 = s
			}
		}
		for i, s := range dist {
			if s <= d2 {
				t.nbrs = append(t.nbrs, uint8(i))
			}
		}
	}
	t.nbrOff[6561] = int32(len(t.nbrs))
	return t
}

// nearest returns the codebook point closest to a/s (s > 0) and the dot
// product of a with it.
func (t *iq2Tables) nearest(a *[8]float32, s float32) (idx uint8, av float32) {
	inv := 1 / s
	u, p := 0, 1
	for _, v := range a {
		r := v * inv
		k := 2
		if r < 16.5 {
			k = 0
		} else if r < 34 {
			k = 1
		}
		u += k * p
		p *= 3
	}
	if gi := t.index[u]; gi >= 0 {
		g := &t.grid[gi]
		for j, v := range a {
			av += v * g[j]
		}
		return uint8(gi), av
	}
	best := float32(0)
	for n, gi := range t.nbrs[t.nbrOff[u]:t.nbrOff[u+1]] {
		g := &t.grid[gi]
		var d float32
		for j, v := range a {
			d += v * g[j]
		}
		// minimise s^2*|g|^2 - 2*s*<a,g>, i.e. s*|g|^2 - 2*<a,g>
		c := s*t.norm[gi] - 2*d
		if n == 0 || c < best {
			best, idx, av = c, gi, d
		}
	}
	return idx, av
}

// fitSub finds a scale and codebook points for one sub-block of 32 targets.
func (t *iq2Tables) fitSub(a *[32]float32) (scale float32, idx [4]uint8) {
	var amax, sumA2 float32
	for _, v := range a {
		amax = max(amax, v)
		sumA2 += v * v
	}
	if amax <= groupMaxEps {
		return 0, idx
	}
	bestErr := float32(math.MaxFloat32)
	try := func(s float32) {
		var sav, sv2 float32
		var ids [4]uint8
		for g := 0; g < 4; g++ {
			i, av := t.nearest((*[8]float32)(a[8*g:]), s)
			ids[g] = i
			sav += av
			sv2 += t.norm[i]
		}
		if sav <= 0 {
			return
		}
		// least-squares scale for these points and its error
		e := sumA2 - sav*sav/sv2
		if e < bestErr {
			bestErr, scale, idx = e, sav/sv2, ids
		}
	}
	for _, f := range [...]float32{0.62, 0.68, 0.74, 0.8, 0.86, 0.92, 1} {
		try(amax * f / 43)
	}
	try(amax / 25)
	try(amax / 8)
	if scale > 0 {
		try(scale) // one refinement at the fitted scale
	}
	return scale, idx
}

// quantIQ2XXSBlock quantizes 256 values to IQ2_XXS.
func quantIQ2XXSBlock(x *[QK_K]float32, out *[iq2xxsBytes]byte) {
	t := iq2TablesGet()
	var a [QK_K]float32
	var signs [32]uint8 // 7-bit sign index per group
	for g := 0; g < 32; g++ {
		xs := x[8*g : 8*g+8]
		var s uint8
		imin := 0
		for j, v := range xs {
			a[8*g+j] = abs32(v)
			if v < 0 {
				s |= 1 << j
			}
			if abs32(v) < abs32(xs[imin]) {
				imin = j
			}
		}
		if iq2SignTable[s&127] != s { // odd number of negatives
			a[8*g+imin] = -a[8*g+imin]
			s ^= 1 << imin
		}
		signs[g] = s & 127
	}
	var scales [8]float32
	var smax float32
	for ib := 0; ib < 8; ib++ {
		scales[ib], _ = t.fitSub((*[32]float32)(a[32*ib:]))
		smax = max(smax, scales[ib])
	}
	*out = [iq2xxsBytes]byte{}
	if !(smax > 0) {
		return
	}
	var sumA2 [8]float32
	for ib := range sumA2 {
		for _, v := range a[32*ib : 32*ib+32] {
			sumA2[ib] += v * v
		}
	}
	bestErr := float32(math.MaxFloat32)
	var bestD uint16
	var bestL [8]uint8
	var bestIdx [32]uint8
	for L := 15; L >= 0; L-- {
		dh := F32ToF16(8 * smax / float32(2*L+1))
		d := F16ToF32(dh)
		if !(d > 0) || d > 65504 {
			continue
		}
		var total float32
		var ls [8]uint8
		var ids [32]uint8
		for ib := 0; ib < 8; ib++ {
			l := uint8(max(0, min(15, nearestInt((8*scales[ib]/d-1)/2))))
			db := float32(d*(0.5+float32(l))) * 0.25
			ls[ib] = l
			e := sumA2[ib]
			for g := 0; g < 4; g++ {
				i, av := t.nearest((*[8]float32)(a[32*ib+8*g:]), db)
				ids[4*ib+g] = i
				e += db*db*t.norm[i] - 2*db*av
			}
			total += e
			if total >= bestErr {
				break
			}
		}
		if total < bestErr {
			bestErr, bestD, bestL, bestIdx = total, dh, ls, ids
		}
	}
	binary.LittleEndian.PutUint16(out[iq2xxsD:], bestD)
	for ib := 0; ib < 8; ib++ {
		sub := out[iq2xxsQs+8*ib:]
		aux := uint32(bestL[ib]) << 28
		for g := 0; g < 4; g++ {
			sub[g] = bestIdx[4*ib+g]
			aux |= uint32(signs[4*ib+g]) << (7 * g)
		}
		binary.LittleEndian.PutUint32(sub[4:], aux)
	}
}
