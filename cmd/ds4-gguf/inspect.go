package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
)

func runInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", "inspect FILE [--json] [--kv-max N]", stderr)
	asJSON := fs.Bool("json", false, "print a JSON document instead of text")
	kvMax := fs.Int("kv-max", 16, "show at most `N` elements of array values (and 8N bytes of strings); -1 shows all")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "inspect: want one FILE, got %d arguments", len(pos))
	}
	f, err := gguf.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	rep := newReport(pos[0], f, *kvMax)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.writeText(stdout, f, *kvMax)
}

// report is the JSON document of inspect --json. Its field names are stable.
type report struct {
	File       string       `json:"file"`
	Size       int64        `json:"size"`
	Version    uint32       `json:"version"`
	Alignment  uint64       `json:"alignment"`
	DataOffset uint64       `json:"data_offset"`
	Metadata   []kvJSON     `json:"metadata"`
	Tensors    []tensorJSON `json:"tensors"`
	Summary    summaryJSON  `json:"summary"`
	DS4        *ds4JSON     `json:"ds4"` // null for a file of another architecture
}

type kvJSON struct {
	Key       string `json:"key"`
	Type      string `json:"type"`                // u32, string, array, ...
	ElemType  string `json:"elem_type,omitempty"` // arrays only
	Count     uint64 `json:"count,omitempty"`     // arrays only
	Value     any    `json:"value"`               // scalar, or the (first kv-max) array elements
	Truncated bool   `json:"truncated,omitempty"` // the array or string was cut to kv-max
}

type tensorJSON struct {
	Index  int      `json:"index"`
	Name   string   `json:"name"`
	Type   string   `json:"type"`
	Dims   []uint64 `json:"dims"`   // ne0 (row length) first
	Offset uint64   `json:"offset"` // absolute file offset
	Bytes  uint64   `json:"bytes"`
}

type typeTotal struct {
	Type    string `json:"type"`
	Tensors int    `json:"tensors"`
	Bytes   uint64 `json:"bytes"`
}

type summaryJSON struct {
	Tensors     int         `json:"tensors"`
	Elements    uint64      `json:"elements"`
	TensorBytes uint64      `json:"tensor_bytes"`
	ByType      []typeTotal `json:"by_type"` // in decreasing bytes
}

type ds4JSON struct {
	Config        *model.Config `json:"config,omitempty"`
	ConfigError   []string      `json:"config_error,omitempty"`
	Scheme        string        `json:"scheme,omitempty"`
	LayoutOK      bool          `json:"layout_ok"`
	Problems      []string      `json:"problems,omitempty"`
	DiffFromFlash []string      `json:"diff_from_flash"`
}

func newReport(path string, f *gguf.File, kvMax int) *report {
	r := &report{File: path, Size: f.Size(), Version: f.Version, Alignment: f.Alignment, DataOffset: f.DataOffset}
	for _, kv := range f.KVs {
		r.Metadata = append(r.Metadata, kvToJSON(kv, kvMax))
	}
	byType := map[quant.Type]*typeTotal{}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		r.Tensors = append(r.Tensors, tensorJSON{Index: t.Index, Name: t.Name, Type: t.Type.String(),
			Dims: t.Dims, Offset: f.DataOffset + t.Offset, Bytes: t.Size})
		r.Summary.Tensors++
		r.Summary.Elements += t.Elements()
		r.Summary.TensorBytes += t.Size
		tt := byType[t.Type]
		if tt == nil {
			tt = &typeTotal{Type: t.Type.String()}
			byType[t.Type] = tt
		}
		tt.Tensors++
		tt.Bytes += t.Size
	}
	for _, tt := range byType {
		r.Summary.ByType = append(r.Summary.ByType, *tt)
	}
	slices.SortFunc(r.Summary.ByType, func(a, b typeTotal) int {
		if a.Bytes != b.Bytes {
			if a.Bytes > b.Bytes {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Type, b.Type)
	})
	r.DS4 = ds4Check(f)
	return r
}

// ds4Check reads the hyperparameters and checks the tensor table; nil for a
// file of another architecture.
func ds4Check(f *gguf.File) *ds4JSON {
	c, err := model.ConfigFromGGUF(f)
	if errors.Is(err, model.ErrNotDS4) {
		return nil
	}
	d := &ds4JSON{DiffFromFlash: []string{}}
	if err != nil {
		var me *model.MetadataError
		if errors.As(err, &me) {
			d.ConfigError = me.Problems
		} else {
			d.ConfigError = []string{err.Error()}
		}
		return d
	}
	d.Config = &c
	d.DiffFromFlash = append(d.DiffFromFlash, c.DiffFromFlash()...)
	if err := model.ValidateTensors(&c, f); err != nil {
		var le *model.LayoutError
		if errors.As(err, &le) {
			d.Problems = le.Problems
		} else {
			d.Problems = []string{err.Error()}
		}
		return d
	}
	d.LayoutOK = true
	if w, err := model.Bind(&c, model.GGUFSource{File: f}); err == nil {
		d.Scheme = w.Scheme
	}
	return d
}

func kvToJSON(kv gguf.KV, kvMax int) kvJSON {
	v := kv.Value
	j := kvJSON{Key: kv.Key, Type: v.Type.String()}
	if v.Type != gguf.TypeArray {
		j.Value, j.Truncated = scalarJSON(v, kvMax)
		return j
	}
	j.ElemType, j.Count = v.ElemType.String(), v.Count
	n := v.Len()
	if kvMax >= 0 && n > kvMax {
		n, j.Truncated = kvMax, true
	}
	vals := make([]any, n)
	for i := range vals {
		e := v.Elem(i)
		if e.Type == gguf.TypeArray {
			vals[i] = fmt.Sprintf("[%s × %d]", e.ElemType, e.Len())
			continue
		}
		vals[i], _ = scalarJSON(e, -1)
	}
	j.Value = vals
	return j
}

func scalarJSON(v gguf.Value, kvMax int) (any, bool) {
	switch v.Type {
	case gguf.TypeBool:
		return v.U != 0, false
	case gguf.TypeUint8, gguf.TypeUint16, gguf.TypeUint32, gguf.TypeUint64:
		return v.U, false
	case gguf.TypeInt8, gguf.TypeInt16, gguf.TypeInt32, gguf.TypeInt64:
		return v.I, false
	case gguf.TypeFloat32:
		return float32(v.F), false
	case gguf.TypeFloat64:
		return v.F, false
	case gguf.TypeString:
		if kvMax >= 0 && len(v.S) > 8*kvMax+64 {
			return cutUTF8(v.S, 8*kvMax+64), true
		}
		return v.S, false
	}
	return nil, false
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	for n > 0 && n < len(s) && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}

func (r *report) writeText(w io.Writer, f *gguf.File, kvMax int) error {
	fmt.Fprintf(w, "file: %s\n", r.File)
	fmt.Fprintf(w, "size: %d bytes (%s), GGUF v%d, alignment %d, data section at %d\n",
		r.Size, human(uint64(r.Size)), r.Version, r.Alignment, r.DataOffset)

	fmt.Fprintf(w, "\nmetadata: %d keys\n", len(f.KVs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, kv := range f.KVs {
		typ := kv.Value.Type.String()
		if kv.Value.Type == gguf.TypeArray {
			typ = "[]" + kv.Value.ElemType.String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", kv.Key, typ, formatValue(kv.Value, kvMax))
	}
	tw.Flush()

	fmt.Fprintf(w, "\ntensors: %d\n", len(f.Tensors))
	nameW, shapeW := len("name"), len("shape (ne0 first)")
	for _, t := range r.Tensors {
		nameW, shapeW = max(nameW, len(t.Name)), max(shapeW, len(dimsString(t.Dims)))
	}
	fmt.Fprintf(w, "  %5s  %-*s  %-7s  %-*s  %13s  %13s\n", "index", nameW, "name", "type", shapeW, "shape (ne0 first)", "bytes", "offset")
	for _, t := range r.Tensors {
		fmt.Fprintf(w, "  %5d  %-*s  %-7s  %-*s  %13d  %13d\n", t.Index, nameW, t.Name, t.Type, shapeW, dimsString(t.Dims), t.Bytes, t.Offset)
	}

	s := &r.Summary
	fmt.Fprintf(w, "\nsummary:\n")
	fmt.Fprintf(w, "  file size     %d bytes (%s)\n", r.Size, human(uint64(r.Size)))
	fmt.Fprintf(w, "  tensor data   %d bytes (%s) in %d tensors, %d values\n", s.TensorBytes, human(s.TensorBytes), s.Tensors, s.Elements)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, tt := range s.ByType {
		fmt.Fprintf(tw, "  %s\t%d tensors\t%d bytes\t%s\t%.2f%%\t\n", tt.Type, tt.Tensors, tt.Bytes, human(tt.Bytes), 100*float64(tt.Bytes)/float64(max(s.TensorBytes, 1)))
	}
	tw.Flush()

	d := r.DS4
	if d == nil {
		fmt.Fprintf(w, "\nnot a DS4 file (general.architecture is not %q)\n", model.Architecture)
		return nil
	}
	fmt.Fprintf(w, "\nDS4:\n")
	if d.Config == nil {
		fmt.Fprintf(w, "  metadata: %d problem(s)\n", len(d.ConfigError))
		for _, p := range d.ConfigError {
			fmt.Fprintf(w, "    %s\n", p)
		}
		return nil
	}
	for _, line := range configSummary(d.Config) {
		fmt.Fprintf(w, "  %s\n", line)
	}
	if d.LayoutOK {
		fmt.Fprintf(w, "  tensor layout: OK (scheme %s)\n", d.Scheme)
	} else {
		fmt.Fprintf(w, "  tensor layout: %d problem(s)\n", len(d.Problems))
		for _, p := range d.Problems {
			fmt.Fprintf(w, "    %s\n", p)
		}
	}
	if len(d.DiffFromFlash) == 0 {
		fmt.Fprintf(w, "  hyperparameters: DeepSeek V4 Flash\n")
	} else {
		fmt.Fprintf(w, "  differs from Flash:\n")
		for _, l := range d.DiffFromFlash {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	return nil
}

// formatValue renders a metadata value like gguf-dump: arrays as their first
// elements and their count, long strings cut.
func formatValue(v gguf.Value, kvMax int) string {
	if v.Type == gguf.TypeString {
		if kvMax >= 0 && len(v.S) > 8*kvMax+64 {
			return fmt.Sprintf("%q… (%d bytes)", cutUTF8(v.S, 8*kvMax+64), len(v.S))
		}
		return fmt.Sprintf("%q", v.S)
	}
	if kvMax < 0 {
		return v.Format(v.Len())
	}
	return v.Format(kvMax)
}

// configSummary describes a DS4 configuration in a few lines.
func configSummary(c *model.Config) []string {
	counts := map[int]int{}
	for l := 0; l < c.Layers; l++ {
		counts[c.Ratio(l)]++
	}
	ratios := make([]string, c.Layers)
	for l := range ratios {
		ratios[l] = fmt.Sprint(c.Ratio(l))
	}
	extra := ""
	if n := len(c.CompressRatios); n > c.Layers {
		extra = fmt.Sprintf(" (+%d extra entries, e.g. MTP)", n-c.Layers)
	}
	return []string{
		fmt.Sprintf("%d layers, embedding %d, vocabulary %d, context %d", c.Layers, c.Embed, c.Vocab, c.ContextLen),
		fmt.Sprintf("attention: %d heads × %d (rope %d), q LoRA %d, output %d groups × LoRA %d, window %d",
			c.Heads, c.HeadDim, c.RopeDim, c.QLoraRank, c.OGroups, c.OLoraRank, c.Window),
		fmt.Sprintf("compression: %d layers ratio 0, %d ratio 4, %d ratio 128: [%s]%s",
			counts[model.RatioNone], counts[model.RatioIndexed], counts[model.RatioDense], strings.Join(ratios, " "), extra),
		fmt.Sprintf("indexer: %d heads × %d, top-k %d", c.IndexerHeads, c.IndexerHeadDim, c.IndexerTopK),
		fmt.Sprintf("experts: %d routed (%d used, ff %d) + %d shared; %d hash-routed layers; weights ×%g, normalised %v",
			c.Experts, c.ExpertsUsed, c.ExpertFF, c.SharedExperts, c.HashLayers, c.ExpertWeightsScale, c.ExpertWeightsNorm),
		fmt.Sprintf("hyper-connections: %d streams, %d Sinkhorn iterations, eps %g; norm eps %g",
			c.HC, c.SinkhornIters, c.HCEps, c.NormEps),
		fmt.Sprintf("rope: base %g, compressed %g, YaRN ×%g (β %g/%g, original context %d)",
			c.RopeBase, c.CompressRopeBase, c.RopeScale, c.YarnBetaFast, c.YarnBetaSlow, c.RopeOrigCtx),
	}
}

func dimsString(d []uint64) string {
	parts := make([]string, len(d))
	for i, x := range d {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, " × ")
}

// human formats a byte count in binary units.
func human(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	x, i := float64(n), -1
	for x >= unit && i < 5 {
		x /= unit
		i++
	}
	return fmt.Sprintf("%.2f %ciB", x, "KMGTPE"[i])
}
