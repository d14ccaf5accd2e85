package cpu

import (
	"fmt"

	"ds4go/engine"
)

// state is a session's KV state: per layer and part an f32 table laid out
// as engine.StateLayout describes (rings by position, growing row tables).
type state struct {
	be     *Backend
	layout *engine.StateLayout
	layers [][]*table // [layer][part], nil where the layer has no such part
}

// table is one part of a layer's state.
type table struct {
	width int
	cap   int  // ring slots, or maximum rows
	ring  bool // by position (slot = pos mod cap) rather than by row
	data  []float32
}

// entry returns the values of position or row i, growing a row table.
func (t *table) entry(i int) []float32 {
	if t.ring {
		s := i % t.cap
		return t.data[s*t.width : (s+1)*t.width]
	}
	if end := (i + 1) * t.width; end > len(t.data) {
		if end > cap(t.data) {
			nd := make([]float32, end, max(end, 2*cap(t.data), 64*t.width))
			copy(nd, t.data)
			t.data = nd
		}
		t.data = t.data[:end]
	}
	return t.data[i*t.width : (i+1)*t.width]
}

// NewState allocates an empty KV state (engine.Backend).
func (be *Backend) NewState(layout *engine.StateLayout) (engine.State, error) {
	if layout.Config.Layers != be.cfg.Layers {
		return nil, fmt.Errorf("cpu: state layout for %d layers, model has %d", layout.Config.Layers, be.cfg.Layers)
	}
	if layout.MTP && be.mtp == nil {
		return nil, fmt.Errorf("cpu: an MTP state for a model without an MTP block")
	}
	st := &state{be: be, layout: layout, layers: make([][]*table, be.cfg.Layers+1)}
	for _, l := range layout.Blocks() {
		st.layers[l] = make([]*table, engine.PartIndexScore+1)
		for _, p := range layout.Parts(l) {
			t := &table{width: layout.Width(l, p), cap: layout.Capacity(l, p), ring: p.ByPosition()}
			if t.ring {
				t.data = make([]float32, t.cap*t.width)
			}
			st.layers[l][p] = t
		}
	}
	return st, nil
}

func (s *state) Release() { *s = state{} }

func (be *Backend) stateOf(si engine.State) (*state, error) {
	s, ok := si.(*state)
	if !ok || s.be != be {
		return nil, fmt.Errorf("cpu: state %T does not belong to this backend", si)
	}
	return s, nil
}

func (s *state) table(layer int, p engine.StatePart) (*table, error) {
	if layer < 0 || layer >= len(s.layers) || int(p) >= len(s.layers[layer]) || s.layers[layer][p] == nil {
		return nil, fmt.Errorf("cpu: layer %d has no state part %s", layer, p)
	}
	return s.layers[layer][p], nil
}

// check validates a state copy against the layout.
func (s *state) check(layer int, p engine.StatePart, first, n, have int) error {
	if err := s.layout.CheckRange(layer, p, first, n, have); err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return nil
}

// ReadState copies state entries (engine.Backend).
func (be *Backend) ReadState(si engine.State, layer int, p engine.StatePart, first, n int, dst []float32) error {
	s, err := be.stateOf(si)
	if err != nil {
		return err
	}
	t, err := s.table(layer, p)
	if err != nil {
		return err
	}
	if err := s.check(layer, p, first, n, len(dst)); err != nil {
		return err
	}
	if !t.ring && (first+n)*t.width > len(t.data) {
		return fmt.Errorf("cpu: rows [%d, %d) not written yet", first, first+n)
	}
	for i := 0; i < n; i++ {
		copy(dst[i*t.width:(i+1)*t.width], t.entry(first+i))
	}
	return nil
}

// WriteState stores state entries (engine.Backend).
func (be *Backend) WriteState(si engine.State, layer int, p engine.StatePart, first, n int, src []float32) error {
	s, err := be.stateOf(si)
	if err != nil {
		return err
	}
	t, err := s.table(layer, p)
	if err != nil {
		return err
	}
	if err := s.check(layer, p, first, n, len(src)); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		copy(t.entry(first+i), src[i*t.width:(i+1)*t.width])
	}
	return nil
}
