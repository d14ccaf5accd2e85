package engine

import (
	"fmt"

	"ds4go/model"
)

// StatePart names one part of a layer's KV state. Every part is a table of
// f32 rows of a fixed width; "by position" parts are rings indexed by token
// position (slot = position mod capacity), "by row" parts are indexed by
// compressed-row number and only grow.
type StatePart uint8

// The parts of a layer's state.
const (
	// PartWindow holds the raw KV row of each position (after kv_norm, RoPE
	// and the FP8 simulation), by position, HeadDim wide. The window
	// attention of position p reads positions p−Window+1 … p.
	PartWindow StatePart = iota
	// PartComp holds the attention compressor's rows (ratio > 0 layers), by
	// row, HeadDim wide: row i pools block i (positions i·r … i·r+r−1).
	PartComp
	// PartCompKV holds the attention compressor's frontier: each position's
	// projected values (wkv·x), by position, coff·HeadDim wide (coff = 2 for
	// ratio 4, 1 for ratio 128).
	PartCompKV
	// PartCompScore holds each position's pooling scores (wgate·x + ape), by
	// position, coff·HeadDim wide.
	PartCompScore
	// PartIndex holds the indexer compressor's rows (ratio-4 layers), by row,
	// IndexerHeadDim wide.
	PartIndex
	// PartIndexKV and PartIndexScore are the indexer compressor's frontier,
	// by position, 2·IndexerHeadDim wide.
	PartIndexKV
	PartIndexScore
	numParts
)

var partNames = [...]string{"window", "comp", "comp_kv", "comp_score", "index", "index_kv", "index_score"}

func (p StatePart) String() string {
	if int(p) < len(partNames) {
		return partNames[p]
	}
	return fmt.Sprintf("StatePart(%d)", int(p))
}

// ByPosition reports whether the part is a ring indexed by position.
func (p StatePart) ByPosition() bool {
	switch p {
	case PartWindow, PartCompKV, PartCompScore, PartIndexKV, PartIndexScore:
		return true
	}
	return false
}

// StateLayout fixes the shape of a session's KV state: which parts each
// layer has, their widths, ring capacities and maximum row counts. The
// engine chooses it and backends allocate to it, so the engine knows exactly
// what a state retains without asking the backend.
//
// A ring part of capacity c retains at most the last c positions written
// (the engine tracks exactly which, see retention). The window needs Window−1 positions before the next one, a ratio-r compressor
// frontier at most coff·r−1; capacities exceed that by Slack, so a rewind of
// up to about Slack tokens finds everything it needs still in the rings.
type StateLayout struct {
	Config     *model.Config
	MaxContext int // positions the state can hold
	Slack      int // extra ring capacity for cheap rewinds
	// MTP makes this the layout of an MTP block's state (Drafter): block
	// Config.Layers alone, a window ring (the block is uncompressed).
	MTP bool
}

// Blocks returns the block indices the layout's state holds: the layers,
// or the MTP block alone.
func (l *StateLayout) Blocks() []int {
	if l.MTP {
		return []int{l.Config.Layers}
	}
	bs := make([]int, l.Config.Layers)
	for i := range bs {
		bs[i] = i
	}
	return bs
}

// NewStateLayout returns the layout for a context of maxContext positions
// with the given rewind slack.
func NewStateLayout(c *model.Config, maxContext, slack int) (*StateLayout, error) {
	if maxContext <= 0 {
		return nil, fmt.Errorf("engine: max context %d must be positive", maxContext)
	}
	if slack < 0 {
		return nil, fmt.Errorf("engine: rewind slack %d must be ≥ 0", slack)
	}
	return &StateLayout{Config: c, MaxContext: maxContext, Slack: slack}, nil
}

// Ratio returns layer l's compression ratio.
func (l *StateLayout) Ratio(layer int) int { return l.Config.Ratio(layer) }

// coff returns the compressor's feature multiplier of a ratio: overlapping
// ratio-4 compressors project to two halves.
func coff(ratio int) int {
	if ratio == model.RatioIndexed {
		return 2
	}
	return 1
}

// Has reports whether layer l has the part.
func (l *StateLayout) Has(layer int, p StatePart) bool {
	r := l.Ratio(layer)
	switch p {
	case PartWindow:
		return true
	case PartComp, PartCompKV, PartCompScore:
		return r != model.RatioNone
	case PartIndex, PartIndexKV, PartIndexScore:
		return r == model.RatioIndexed
	}
	return false
}

// Parts lists the parts layer l has.
func (l *StateLayout) Parts(layer int) []StatePart {
	var ps []StatePart
	for p := StatePart(0); p < numParts; p++ {
		if l.Has(layer, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// Width returns the f32 values per entry of a part.
func (l *StateLayout) Width(layer int, p StatePart) int {
	c := l.Config
	switch p {
	case PartWindow, PartComp:
		return c.HeadDim
	case PartCompKV, PartCompScore:
		return coff(l.Ratio(layer)) * c.HeadDim
	case PartIndex:
		return c.IndexerHeadDim
	case PartIndexKV, PartIndexScore:
		return 2 * c.IndexerHeadDim
	}
	return 0
}

// Capacity returns the number of entries a part holds: ring slots for a
// by-position part, the maximum row count for a by-row part.
func (l *StateLayout) Capacity(layer int, p StatePart) int {
	switch p {
	case PartWindow:
		return min(l.Config.Window+l.Slack, l.MaxContext)
	case PartCompKV, PartCompScore, PartIndexKV, PartIndexScore:
		r := l.Ratio(layer)
		return coff(r)*r + l.Slack
	case PartComp, PartIndex:
		return l.MaxContext / l.Ratio(layer)
	}
	return 0
}

// Need returns the first position a by-position part must still hold for
// the forward pass to continue at position pos (it needs [Need, pos)).
func (l *StateLayout) Need(layer int, p StatePart, pos int) int {
	switch p {
	case PartWindow:
		return max(0, pos-(l.Config.Window-1))
	case PartCompKV, PartCompScore, PartIndexKV, PartIndexScore:
		r := l.Ratio(layer)
		return max(0, pos-pos%r-(coff(r)-1)*r)
	}
	return pos
}

// Rows returns the number of by-row entries that exist at position pos.
func (l *StateLayout) Rows(layer int, p StatePart, pos int) int {
	switch p {
	case PartComp, PartIndex:
		return pos / l.Ratio(layer)
	}
	return 0
}

// retention tracks, for every ring part of every layer, the first position
// the ring still holds: it holds exactly the positions [lo, pos) of the
// session's current prefix (empty when lo ≥ pos).
type retention struct {
	layout *StateLayout
	lo     [][numParts]int
}

func newRetention(l *StateLayout) *retention {
	return &retention{layout: l, lo: make([][numParts]int, l.Config.Layers)}
}

// reset forgets everything (a re-derivation from position 0).
func (r *retention) reset() {
	for i := range r.lo {
		r.lo[i] = [numParts]int{}
	}
}

// written records that positions [pos, pos+n) are being written to every
// ring: positions before pos stay retained as far as the ring's capacity
// allows, and whatever was retained beyond pos (after a rewind) is gone. It
// is called before the writes, so a failed chunk leaves a safe record.
func (r *retention) written(pos, n int) {
	for l := range r.lo {
		for p := StatePart(0); p < numParts; p++ {
			if p.ByPosition() && r.layout.Has(l, p) {
				r.lo[l][p] = max(min(r.lo[l][p], pos), pos+n-r.layout.Capacity(l, p))
			}
		}
	}
}

// first returns the first retained position of a ring part at pos.
func (r *retention) first(layer int, p StatePart, pos int) int {
	return min(r.lo[layer][p], pos)
}

// continuable reports whether the rings hold what the forward pass needs to
// continue at pos.
func (r *retention) continuable(pos int) bool {
	for l := range r.lo {
		for p := StatePart(0); p < numParts; p++ {
			if p.ByPosition() && r.layout.Has(l, p) && r.layout.Need(l, p, pos) < r.first(l, p, pos) {
				return false
			}
		}
	}
	return true
}

// CheckRange validates a ReadState/WriteState request against the layout:
// entries [first, first+n) of part p of a layer, copied through a buffer of
// bufLen values. A by-position part (a ring) can move at most its capacity
// at once; a by-row part must stay inside its capacity. Backends call it so
// that every one of them refuses the same requests.
func (l *StateLayout) CheckRange(layer int, p StatePart, first, n, bufLen int) error {
	width, capacity := l.Width(layer, p), l.Capacity(layer, p)
	if first < 0 || n < 0 || bufLen < n*width {
		return fmt.Errorf("state range [%d, %d) of width %d with a buffer of %d", first, first+n, width, bufLen)
	}
	if p.ByPosition() && n > capacity {
		return fmt.Errorf("%d entries exceed the ring's %d slots", n, capacity)
	}
	if !p.ByPosition() && first+n > capacity {
		return fmt.Errorf("rows [%d, %d) exceed the table's %d rows", first, first+n, capacity)
	}
	return nil
}
