package cuda

import (
	"fmt"

	"ds4go/engine"
)

// state is a session's KV state in device memory: per layer and part an f32
// table laid out as engine.StateLayout describes (rings by position, row
// tables that grow as rows are written).
type state struct {
	be     *Backend
	layout *engine.StateLayout
	layers [][]*dtable // [layer][part], nil where the layer has no such part
}

// dtable is one part of a layer's state.
type dtable struct {
	width int
	cap   int  // ring slots, or maximum rows
	ring  bool // by position (slot = pos mod cap) rather than by row
	p     Ptr
	alloc int // allocated entries
	rows  int // row tables: rows written so far (the CPU's len(data)/width)
}

func (t *dtable) entry(i int) Ptr {
	if t.ring {
		i %= t.cap
	}
	return t.p.Add(4 * int64(i) * int64(t.width))
}

// NewState allocates an empty KV state (engine.Backend).
func (be *Backend) NewState(layout *engine.StateLayout) (engine.State, error) {
	if layout.Config.Layers != be.cfg.Layers {
		return nil, fmt.Errorf("cuda: state layout for %d layers, model has %d", layout.Config.Layers, be.cfg.Layers)
	}
	if layout.MTP && be.mtp == nil {
		return nil, fmt.Errorf("cuda: an MTP state for a model without an MTP block")
	}
	st := &state{be: be, layout: layout, layers: make([][]*dtable, be.cfg.Layers+1)}
	for _, l := range layout.Blocks() {
		st.layers[l] = make([]*dtable, engine.PartIndexScore+1)
		for _, p := range layout.Parts(l) {
			t := &dtable{width: layout.Width(l, p), cap: layout.Capacity(l, p), ring: p.ByPosition()}
			if t.ring {
				var err error
				if t.p, err = be.dev.Malloc(4 * int64(t.cap) * int64(t.width)); err != nil {
					st.Release()
					return nil, err
				}
				t.alloc = t.cap
				// zeroed so that never-written slots read as zeros, as on the CPU
				if err := be.dev.MemsetAsync(t.p, 0, 4*int64(t.cap)*int64(t.width), 0); err != nil {
					st.Release()
					return nil, err
				}
			}
			st.layers[l][p] = t
		}
	}
	return st, be.dev.Synchronize()
}

// Release frees the state's device memory.
func (s *state) Release() {
	if s.be == nil {
		return
	}
	s.be.dev.Synchronize()
	for _, ts := range s.layers {
		for _, t := range ts {
			if t != nil && t.p != 0 {
				s.be.dev.Free(t.p)
			}
		}
	}
	*s = state{}
}

func (be *Backend) stateOf(si engine.State) (*state, error) {
	s, ok := si.(*state)
	if !ok || s.be != be {
		return nil, fmt.Errorf("cuda: state %T does not belong to this backend", si)
	}
	return s, nil
}

func (s *state) table(layer int, p engine.StatePart) (*dtable, error) {
	if layer < 0 || layer >= len(s.layers) || int(p) >= len(s.layers[layer]) || s.layers[layer][p] == nil {
		return nil, fmt.Errorf("cuda: layer %d has no state part %s", layer, p)
	}
	return s.layers[layer][p], nil
}

// ensureRows makes a row table hold at least n rows (zero-filled beyond
// what was written). It synchronizes the device when it grows the table,
// to twice the rows needed: a prompt that ends on a power of two (as
// ds4-bench's frontiers do) leaves room for the tokens that follow instead
// of a growth — a device-wide wait per compressed layer — at the first one.
func (s *state) ensureRows(t *dtable, n int) error {
	if t.ring {
		return nil
	}
	if n > t.cap {
		return fmt.Errorf("cuda: %d compressed rows exceed the table's %d", n, t.cap)
	}
	if n > t.alloc {
		d := s.be.dev
		na := min(t.cap, max(2*n, 64))
		p, err := d.Malloc(4 * int64(na) * int64(t.width))
		if err != nil {
			return err
		}
		if err := d.Synchronize(); err != nil {
			return err
		}
		if err := d.MemsetAsync(p, 0, 4*int64(na)*int64(t.width), 0); err != nil {
			return err
		}
		if t.p != 0 {
			if err := d.CopyAsync(p, t.p, 4*int64(t.alloc)*int64(t.width), 0); err != nil {
				return err
			}
			if err := d.Synchronize(); err != nil {
				return err
			}
			d.Free(t.p)
		}
		if err := d.Synchronize(); err != nil {
			return err
		}
		t.p, t.alloc = p, na
	}
	t.rows = max(t.rows, n)
	return nil
}

// check validates a state copy against the layout.
func (s *state) check(layer int, p engine.StatePart, first, n, have int) error {
	if err := s.layout.CheckRange(layer, p, first, n, have); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

// runs calls f for the contiguous slot runs of entries [first, first+n):
// f(entry offset k, slot, count).
func (t *dtable) runs(first, n int, f func(k, slot, cnt int) error) error {
	for k := 0; k < n; {
		i := first + k
		slot := i
		cnt := n - k
		if t.ring {
			slot = i % t.cap
			cnt = min(cnt, t.cap-slot)
		}
		if err := f(k, slot, cnt); err != nil {
			return err
		}
		k += cnt
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
	if !t.ring && first+n > t.rows {
		return fmt.Errorf("cuda: rows [%d, %d) not written yet", first, first+n)
	}
	if err := be.dev.Synchronize(); err != nil {
		return err
	}
	w := t.width
	return t.runs(first, n, func(k, slot, cnt int) error {
		return DownloadSlice(be.dev, dst[k*w:(k+cnt)*w], t.p.Add(4*int64(slot)*int64(w)))
	})
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
	if err := s.ensureRows(t, first+n); err != nil {
		return err
	}
	if err := be.dev.Synchronize(); err != nil {
		return err
	}
	w := t.width
	return t.runs(first, n, func(k, slot, cnt int) error {
		return UploadSlice(be.dev, t.p.Add(4*int64(slot)*int64(w)), src[k*w:(k+cnt)*w])
	})
}
