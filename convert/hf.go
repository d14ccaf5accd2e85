package convert

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"ds4go/model"
	"ds4go/quant"
)

// HFCheckpoint is an open DeepSeek V4 checkpoint in the official Hugging Face
// layout: config.json plus model.safetensors or the shards a
// model.safetensors.index.json lists. Tensor names are the model.py module
// names ("layers.3.attn.wq_a.weight"); a leading "model." is dropped.
// Its methods are safe for concurrent use.
type HFCheckpoint struct {
	Dir string

	configJSON []byte
	files      []*SafeFile
	tensors    map[string]tensorRef
	fp8Rows    int64 // FP8 weight block (quantization_config.weight_block_size)
	fp8Cols    int64

	cfgOnce sync.Once
	cfg     model.Config
	cfgErr  error
}

type tensorRef struct {
	file *SafeFile
	info *TensorInfo
}

// IndexFile and SingleFile are the names OpenHF looks for.
const (
	IndexFile  = "model.safetensors.index.json"
	SingleFile = "model.safetensors"
	ConfigFile = "config.json"
)

// OpenHF opens the checkpoint in dir. It reads config.json and every
// safetensors header (validating each), but no tensor data.
func OpenHF(dir string) (*HFCheckpoint, error) {
	ck := &HFCheckpoint{Dir: dir, tensors: map[string]tensorRef{}, fp8Rows: 128, fp8Cols: 128}
	var err error
	if ck.configJSON, err = os.ReadFile(filepath.Join(dir, ConfigFile)); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	var qc struct {
		Q *hfQuantConfig `json:"quantization_config"`
	}
	if err := json.Unmarshal(ck.configJSON, &qc); err != nil {
		return nil, fmt.Errorf("convert: config.json: %w", err)
	}
	if qc.Q != nil {
		r, c, err := qc.Q.blocks()
		if err != nil {
			return nil, fmt.Errorf("convert: config.json quantization_config: %w", err)
		}
		ck.fp8Rows, ck.fp8Cols = int64(r), int64(c)
	}
	shards, weightMap, err := shardList(dir)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			ck.Close()
		}
	}()
	byFile := map[string]*SafeFile{}
	for _, s := range shards {
		sf, err := OpenSafetensors(filepath.Join(dir, s))
		if err != nil {
			return nil, fmt.Errorf("convert: %w", err)
		}
		ck.files = append(ck.files, sf)
		byFile[s] = sf
		for i := range sf.Header.Tensors {
			t := &sf.Header.Tensors[i]
			name := strings.TrimPrefix(t.Name, "model.")
			if prev, dup := ck.tensors[name]; dup {
				return nil, fmt.Errorf("convert: tensor %q is in both %s and %s", name, prev.file.Path, sf.Path)
			}
			ck.tensors[name] = tensorRef{sf, t}
		}
	}
	for name, file := range weightMap {
		r, found := ck.tensors[strings.TrimPrefix(name, "model.")]
		if !found || r.file != byFile[file] {
			return nil, fmt.Errorf("convert: %s maps %q to %s, which does not hold it", IndexFile, name, file)
		}
	}
	ok = true
	return ck, nil
}

// shardList returns the safetensors files of a checkpoint directory: those
// of model.safetensors.index.json (sorted), or model.safetensors alone.
func shardList(dir string) ([]string, map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, SingleFile)); err != nil {
			return nil, nil, fmt.Errorf("convert: %s has neither %s nor %s", dir, IndexFile, SingleFile)
		}
		return []string{SingleFile}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("convert: %w", err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, nil, fmt.Errorf("convert: %s: %w", IndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, nil, fmt.Errorf("convert: %s has no weight_map", IndexFile)
	}
	set := map[string]bool{}
	for name, f := range idx.WeightMap {
		// Shards must be plain file names in dir: an index must not point
		// outside the checkpoint.
		if f == "" || f != filepath.Base(f) || f == "." || f == ".." || strings.ContainsAny(f, `/\`) {
			return nil, nil, fmt.Errorf("convert: %s maps %q to %q, not a file name in the checkpoint directory", IndexFile, name, f)
		}
		set[f] = true
	}
	files := make([]string, 0, len(set))
	for f := range set {
		files = append(files, f)
	}
	sort.Strings(files)
	return files, idx.WeightMap, nil
}

// Close closes the safetensors files.
func (ck *HFCheckpoint) Close() error {
	var first error
	for _, f := range ck.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	ck.files = nil
	return first
}

// Config returns the model hyperparameters of config.json (ParseConfig).
func (ck *HFCheckpoint) Config() (model.Config, error) {
	ck.cfgOnce.Do(func() { ck.cfg, ck.cfgErr = ParseConfig(ck.configJSON) })
	c := ck.cfg
	c.CompressRatios = append([]int(nil), c.CompressRatios...)
	c.SwigluClamp = append([]float32(nil), c.SwigluClamp...)
	return c, ck.cfgErr
}

// Names returns the checkpoint's tensor names, sorted.
func (ck *HFCheckpoint) Names() []string {
	out := make([]string, 0, len(ck.tensors))
	for n := range ck.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Info returns a checkpoint tensor's header entry.
func (ck *HFCheckpoint) Info(hfName string) (*TensorInfo, bool) {
	r, ok := ck.tensors[hfName]
	return r.info, ok
}

// Name mapping (GGUF name → HF name), as antirez/ds4's
// gguf-tools/deepseek4-quantize.c top_map and layer_map define it.

var topMap = map[string]string{
	"token_embd.weight":      "embed.weight",
	"output_norm.weight":     "norm.weight",
	"output.weight":          "head.weight",
	"output_hc_base.weight":  "hc_head_base",
	"output_hc_fn.weight":    "hc_head_fn",
	"output_hc_scale.weight": "hc_head_scale",
}

var layerMap = map[string]string{
	"hc_attn_base.weight":            "hc_attn_base",
	"hc_attn_fn.weight":              "hc_attn_fn",
	"hc_attn_scale.weight":           "hc_attn_scale",
	"hc_ffn_base.weight":             "hc_ffn_base",
	"hc_ffn_fn.weight":               "hc_ffn_fn",
	"hc_ffn_scale.weight":            "hc_ffn_scale",
	"attn_sinks.weight":              "attn.attn_sink",
	"attn_q_a.weight":                "attn.wq_a.weight",
	"attn_q_b.weight":                "attn.wq_b.weight",
	"attn_q_a_norm.weight":           "attn.q_norm.weight",
	"attn_kv.weight":                 "attn.wkv.weight",
	"attn_kv_a_norm.weight":          "attn.kv_norm.weight",
	"attn_output_a.weight":           "attn.wo_a.weight",
	"attn_output_b.weight":           "attn.wo_b.weight",
	"attn_compressor_ape.weight":     "attn.compressor.ape",
	"attn_compressor_kv.weight":      "attn.compressor.wkv.weight",
	"attn_compressor_gate.weight":    "attn.compressor.wgate.weight",
	"attn_compressor_norm.weight":    "attn.compressor.norm.weight",
	"indexer.attn_q_b.weight":        "attn.indexer.wq_b.weight",
	"indexer.proj.weight":            "attn.indexer.weights_proj.weight",
	"indexer_compressor_ape.weight":  "attn.indexer.compressor.ape",
	"indexer_compressor_kv.weight":   "attn.indexer.compressor.wkv.weight",
	"indexer_compressor_gate.weight": "attn.indexer.compressor.wgate.weight",
	"indexer_compressor_norm.weight": "attn.indexer.compressor.norm.weight",
	"attn_norm.weight":               "attn_norm.weight",
	"ffn_norm.weight":                "ffn_norm.weight",
	"ffn_gate_shexp.weight":          "ffn.shared_experts.w1.weight",
	"ffn_up_shexp.weight":            "ffn.shared_experts.w3.weight",
	"ffn_down_shexp.weight":          "ffn.shared_experts.w2.weight",
	"ffn_gate_inp.weight":            "ffn.gate.weight",
	"exp_probs_b.bias":               "ffn.gate.bias",
	"ffn_gate_tid2eid.weight":        "ffn.gate.tid2eid",
}

var expertMap = map[string]string{
	"ffn_gate_exps.weight": "w1",
	"ffn_up_exps.weight":   "w3",
	"ffn_down_exps.weight": "w2",
}

// splitLayer splits "blk.N.rest" into N and rest.
func splitLayer(name string) (int, string, bool) {
	s, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, "", false
	}
	num, rest, ok := strings.Cut(s, ".")
	if !ok || num == "" || (len(num) > 1 && num[0] == '0') {
		return 0, "", false
	}
	l, err := strconv.Atoi(num)
	if err != nil || l < 0 {
		return 0, "", false
	}
	return l, rest, true
}

// mtpMap names the MTP block's own tensors (mtp.0.<key>) in the
// checkpoint (mtp.0.<value>); its transformer block's tensors map as a
// layer's do (layerMap, expertMap), with the mtp.0. prefix.
var mtpMap = map[string]string{
	"e_proj.weight":        "e_proj.weight",
	"h_proj.weight":        "h_proj.weight",
	"enorm.weight":         "enorm.weight",
	"hnorm.weight":         "hnorm.weight",
	"norm.weight":          "norm.weight",
	"hc_head_fn.weight":    "hc_head_fn",
	"hc_head_base.weight":  "hc_head_base",
	"hc_head_scale.weight": "hc_head_scale",
}

// blockOf splits a block tensor's GGUF name into the checkpoint prefix of
// its block ("layers.N." or "mtp.0.") and the rest of the name.
func blockOf(name string) (string, string, bool) {
	if rest, ok := strings.CutPrefix(name, model.MTPPrefix); ok {
		return model.MTPPrefix, rest, true
	}
	l, rest, ok := splitLayer(name)
	if !ok {
		return "", "", false
	}
	return fmt.Sprintf("layers.%d.", l), rest, true
}

// HFName returns the checkpoint tensor a (non-expert) GGUF tensor comes from.
func HFName(ggufName string) (string, bool) {
	if n, ok := topMap[ggufName]; ok {
		return n, true
	}
	p, rest, ok := blockOf(ggufName)
	if !ok {
		return "", false
	}
	n, ok := layerMap[rest]
	if !ok && p == model.MTPPrefix {
		n, ok = mtpMap[rest]
	}
	if !ok {
		return "", false
	}
	return p + n, true
}

// ExpertHFNames returns, for a stacked routed-expert GGUF tensor
// (blk.N.ffn_{gate,up,down}_exps.weight), the per-expert checkpoint tensors
// in stacking order: layers.N.ffn.experts.E.{w1,w3,w2}.weight, E = 0..n-1.
func ExpertHFNames(ggufName string, n int) ([]string, bool) {
	p, rest, ok := blockOf(ggufName)
	if !ok {
		return nil, false
	}
	w, ok := expertMap[rest]
	if !ok {
		return nil, false
	}
	out := make([]string, n)
	for e := range out {
		out[e] = fmt.Sprintf("%sffn.experts.%d.%s.weight", p, e, w)
	}
	return out, true
}

// Storage kinds of a checkpoint matrix.
const (
	kindPlain = iota // F32, F16, BF16, F64
	kindFP8          // F8_E4M3 with a block scale
	kindFP4          // e2m1 packed two per byte (I8/U8/F4) with a per-row block scale
	kindInt          // I64/I32 integers (tid2eid)
)

// matrix is a checkpoint tensor viewed as rows × cols f32 values (a 1-D
// tensor is one row), however it is stored.
type matrix struct {
	name       string
	kind       int
	shape      []int64 // logical shape (FP4: unpacked)
	rows, cols int64
	w, s       tensorRef // weight and (FP8/FP4) scale
	bo, bi     int64     // scale block: rows × cols per scale value
}

// scaleName returns the scale tensor of a quantized weight: "X.scale" (the
// V4 release, as ds4's converter reads it) or "X.weight_scale_inv" (the
// older HF spelling, the same multiplier).
func (ck *HFCheckpoint) scaleOf(name string) (tensorRef, bool) {
	base, ok := strings.CutSuffix(name, ".weight")
	if !ok {
		return tensorRef{}, false
	}
	for _, n := range []string{base + ".scale", base + ".weight_scale_inv"} {
		if r, ok := ck.tensors[n]; ok {
			return r, true
		}
	}
	return tensorRef{}, false
}

// isScaleName reports whether name is a quantization scale tensor.
func isScaleName(name string) bool {
	return strings.HasSuffix(name, ".scale") || strings.HasSuffix(name, ".weight_scale_inv")
}

// matrix opens a checkpoint tensor for row reads.
func (ck *HFCheckpoint) matrix(name string) (*matrix, error) {
	r, ok := ck.tensors[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint has no tensor %q", name)
	}
	t := r.info
	m := &matrix{name: name, w: r, shape: append([]int64(nil), t.Shape...)}
	switch t.DType {
	case F32, F16, BF16, F64:
		m.kind = kindPlain
	case I64, I32:
		m.kind = kindInt
	case F8E4M3:
		m.kind = kindFP8
	case I8, U8, F4E2M1:
		m.kind = kindFP4
	default:
		return nil, fmt.Errorf("tensor %q: dtype %s cannot be converted", name, t.DType)
	}
	if m.kind == kindFP8 || m.kind == kindFP4 {
		s, ok := ck.scaleOf(name)
		if !ok {
			return nil, fmt.Errorf("tensor %q: %s weight without a .scale tensor", name, t.DType)
		}
		m.s = s
		switch s.info.DType {
		case F8E8M0, F32, BF16:
		default:
			return nil, fmt.Errorf("tensor %q: scale %q has dtype %s, want F8_E8M0 (or F32/BF16)", name, s.info.Name, s.info.DType)
		}
		if len(t.Shape) != 2 || len(s.info.Shape) != 2 {
			return nil, fmt.Errorf("tensor %q: quantized weight %s and scale %s must be 2-D", name, shapeString(t.Shape), shapeString(s.info.Shape))
		}
		if m.kind == kindFP4 && t.DType != F4E2M1 {
			m.shape[1] *= 2 // two e2m1 values per byte
		}
	}
	switch len(m.shape) {
	case 0:
		m.rows, m.cols = 1, 1
	case 1:
		m.rows, m.cols = 1, m.shape[0]
	default:
		m.cols = m.shape[len(m.shape)-1]
		m.rows = 1
		for _, d := range m.shape[:len(m.shape)-1] {
			m.rows *= d
		}
	}
	switch m.kind {
	case kindFP8:
		m.bo, m.bi = ck.fp8Rows, ck.fp8Cols
		want := []int64{ceilDiv(m.rows, m.bo), ceilDiv(m.cols, m.bi)}
		if got := m.s.info.Shape; got[0] != want[0] || got[1] != want[1] {
			return nil, fmt.Errorf("tensor %q: FP8 weight %s with %d×%d blocks needs scale %s, got %s",
				name, shapeString(m.shape), m.bo, m.bi, shapeString(want), shapeString(got))
		}
	case kindFP4:
		sc := m.s.info.Shape
		if sc[0] != m.rows || sc[1] <= 0 || m.cols%sc[1] != 0 || (m.cols/sc[1])%2 != 0 {
			return nil, fmt.Errorf("tensor %q: FP4 weight %s (unpacked) does not fit scale %s (want [%d, cols/32])",
				name, shapeString(m.shape), shapeString(sc), m.rows)
		}
		m.bo, m.bi = 1, m.cols/sc[1]
	}
	return m, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// read decodes rows [r0, r1) into dst (len (r1-r0)·cols), dequantizing FP8
// and FP4 weights with their scales. Non-finite values are an error.
func (m *matrix) read(r0, r1 int64, dst []float32) error {
	if r0 < 0 || r1 > m.rows || r0 > r1 || int64(len(dst)) != (r1-r0)*m.cols {
		return fmt.Errorf("tensor %q: bad row read [%d, %d) of %d", m.name, r0, r1, m.rows)
	}
	n := (r1 - r0) * m.cols
	var err error
	switch m.kind {
	case kindPlain:
		err = m.readPlain(r0, n, dst)
	case kindInt:
		err = m.readInt(r0, n, dst)
	case kindFP8:
		err = m.readFP8(r0, r1, dst)
	case kindFP4:
		err = m.readFP4(r0, r1, dst)
	}
	if err != nil {
		return err
	}
	for i, v := range dst {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("tensor %q: non-finite value %v at row %d, column %d", m.name, v, r0+int64(i)/m.cols, int64(i)%m.cols)
		}
	}
	return nil
}

func (m *matrix) readPlain(r0, n int64, dst []float32) error {
	es := int64(m.w.info.DType.Bits() / 8)
	buf := make([]byte, n*es)
	if err := m.w.file.ReadRange(m.w.info, uint64(r0*m.cols*es), buf); err != nil {
		return err
	}
	decodeFloats(m.w.info.DType, buf, dst)
	return nil
}

// decodeFloats decodes little-endian F32/F16/BF16/F64/F8_E8M0 values.
func decodeFloats(dt DType, buf []byte, dst []float32) {
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = quant.F16ToF32(binary.LittleEndian.Uint16(buf[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = quant.BF16ToF32(binary.LittleEndian.Uint16(buf[2*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(buf[8*i:])))
		}
	case F8E8M0:
		for i := range dst {
			dst[i] = E8M0ToF32(buf[i])
		}
	}
}

func (m *matrix) readInt(r0, n int64, dst []float32) error {
	vals, err := m.ints(r0, n)
	if err != nil {
		return err
	}
	for i, v := range vals {
		dst[i] = float32(v)
	}
	return nil
}

// ints reads n integers starting at row r0.
func (m *matrix) ints(r0, n int64) ([]int64, error) {
	es := int64(m.w.info.DType.Bits() / 8)
	buf := make([]byte, n*es)
	if err := m.w.file.ReadRange(m.w.info, uint64(r0*m.cols*es), buf); err != nil {
		return nil, err
	}
	out := make([]int64, n)
	for i := range out {
		if es == 8 {
			out[i] = int64(binary.LittleEndian.Uint64(buf[8*i:]))
		} else {
			out[i] = int64(int32(binary.LittleEndian.Uint32(buf[4*i:])))
		}
	}
	return out, nil
}

// scales reads scale rows [s0, s1) (all scale columns) as f32.
func (m *matrix) scales(s0, s1 int64) ([]float32, error) {
	sc := m.s.info.Shape[1]
	es := int64(m.s.info.DType.Bits() / 8)
	buf := make([]byte, (s1-s0)*sc*es)
	if err := m.s.file.ReadRange(m.s.info, uint64(s0*sc*es), buf); err != nil {
		return nil, err
	}
	out := make([]float32, (s1-s0)*sc)
	decodeFloats(m.s.info.DType, buf, out)
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("tensor %q: scale %q has non-finite value at [%d, %d]", m.name, m.s.info.Name, s0+int64(i)/sc, int64(i)%sc)
		}
	}
	return out, nil
}

// readFP8: w[r][c] = e4m3(q[r][c]) · scale[r/bo][c/bi].
func (m *matrix) readFP8(r0, r1 int64, dst []float32) error {
	q := make([]byte, (r1-r0)*m.cols)
	if err := m.w.file.ReadRange(m.w.info, uint64(r0*m.cols), q); err != nil {
		return err
	}
	s0 := r0 / m.bo
	sc := m.s.info.Shape[1]
	s, err := m.scales(s0, ceilDiv(r1, m.bo))
	if err != nil {
		return err
	}
	for r := r0; r < r1; r++ {
		srow := s[(r/m.bo-s0)*sc:]
		qrow := q[(r-r0)*m.cols : (r-r0+1)*m.cols]
		drow := dst[(r-r0)*m.cols:]
		for c, b := range qrow {
			v := E4M3ToF32(b)
			if v != v {
				return fmt.Errorf("tensor %q: FP8 NaN (0x%02x) at row %d, column %d", m.name, b, r, c)
			}
			drow[c] = v * srow[int64(c)/m.bi]
		}
	}
	return nil
}

// readFP4: byte j of a row holds values 2j (low nibble) and 2j+1 (high
// nibble); w[r][c] = e2m1(v) · scale[r][c/bi].
func (m *matrix) readFP4(r0, r1 int64, dst []float32) error {
	half := m.cols / 2
	q := make([]byte, (r1-r0)*half)
	if err := m.w.file.ReadRange(m.w.info, uint64(r0*half), q); err != nil {
		return err
	}
	sc := m.s.info.Shape[1]
	s, err := m.scales(r0, r1)
	if err != nil {
		return err
	}
	for r := int64(0); r < r1-r0; r++ {
		srow := s[r*sc : (r+1)*sc]
		qrow := q[r*half : (r+1)*half]
		drow := dst[r*m.cols : (r+1)*m.cols]
		for j, b := range qrow {
			sv := srow[int64(2*j)/m.bi]
			drow[2*j] = fp4Table[b&0xf] * sv
			drow[2*j+1] = fp4Table[b>>4] * sv
		}
	}
	return nil
}

// Tensor returns a GGUF tensor of the converted model as f32 values in GGUF
// order (row-major over Dims, Dims[0] fastest) with its GGUF dims, read and
// dequantized from the checkpoint: the values Convert quantizes. Stacked
// expert tensors are the experts concatenated; ffn_gate_tid2eid's expert ids
// come back as floats. It reads the whole tensor into memory.
func (ck *HFCheckpoint) Tensor(ggufName string) ([]float32, []uint64, error) {
	cfg, err := ck.Config()
	if err != nil {
		return nil, nil, err
	}
	var spec *model.TensorSpec
	for _, sp := range model.ExpectedTensors(&cfg) {
		if sp.Name == ggufName {
			spec = &sp
			break
		}
	}
	if spec == nil {
		return nil, nil, fmt.Errorf("convert: %q is not a tensor of this model", ggufName)
	}
	src, err := ck.source(&cfg, *spec)
	if err != nil {
		return nil, nil, err
	}
	if src == nil {
		return nil, nil, fmt.Errorf("convert: optional tensor %q is absent from the checkpoint", ggufName)
	}
	n := uint64(1)
	for _, d := range spec.Dims {
		n *= d
	}
	out := make([]float32, n)
	pos := int64(0)
	for _, m := range src.parts {
		k := m.rows * m.cols
		if err := m.read(0, m.rows, out[pos:pos+k]); err != nil {
			return nil, nil, fmt.Errorf("convert: %w", err)
		}
		pos += k
	}
	return out, spec.Dims, nil
}

// source is where one GGUF tensor's values come from: one checkpoint
// matrix, or one per expert for a stacked expert tensor.
type source struct {
	spec    model.TensorSpec
	parts   []*matrix
	experts int // routed experts (the bound of tid2eid's ids)
}

// source maps a GGUF tensor spec to its checkpoint tensors and checks their
// shapes: GGUF dims are the checkpoint shape reversed (PyTorch [out, in] is
// ggml ne [in, out], the same bytes); an expert stack is [in, out, E]. It
// returns nil, nil for an optional tensor that is absent.
func (ck *HFCheckpoint) source(c *model.Config, sp model.TensorSpec) (*source, error) {
	var names []string
	if n, ok := HFName(sp.Name); ok {
		names = []string{n}
	} else if ns, ok := ExpertHFNames(sp.Name, c.Experts); ok {
		names = ns
	} else {
		return nil, fmt.Errorf("convert: no checkpoint name for GGUF tensor %q", sp.Name)
	}
	if _, ok := ck.tensors[names[0]]; !ok && sp.Optional {
		return nil, nil
	}
	src := &source{spec: sp, experts: c.Experts}
	want := sp.Dims
	if len(names) > 1 {
		want = sp.Dims[:2]
	}
	for _, n := range names {
		m, err := ck.matrix(n)
		if err != nil {
			return nil, fmt.Errorf("convert: GGUF %s: %w", sp.Name, err)
		}
		if !reversedEqual(m.shape, want) {
			return nil, fmt.Errorf("convert: GGUF %s %s needs checkpoint %s of shape %s, got %s",
				sp.Name, dimsString(sp.Dims), n, shapeString(reversed(want)), shapeString(m.shape))
		}
		if (m.kind == kindInt) != (sp.Role == model.RoleTokenMap) {
			return nil, fmt.Errorf("convert: GGUF %s (%v) cannot come from checkpoint %s of dtype %s", sp.Name, sp.Role, n, m.w.info.DType)
		}
		src.parts = append(src.parts, m)
	}
	return src, nil
}

func reversed(d []uint64) []int64 {
	out := make([]int64, len(d))
	for i, x := range d {
		out[len(d)-1-i] = int64(x)
	}
	return out
}

func reversedEqual(shape []int64, dims []uint64) bool {
	if len(shape) != len(dims) {
		return false
	}
	for i, x := range dims {
		if shape[len(shape)-1-i] != int64(x) {
			return false
		}
	}
	return true
}

func dimsString(d []uint64) string {
	parts := make([]string, len(d))
	for i, x := range d {
		parts[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
