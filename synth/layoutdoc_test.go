package synth

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/quant"
)

var update = flag.Bool("update", false, "rewrite the generated part of docs/gguf-layout.md")

const (
	layoutDoc   = "../docs/gguf-layout.md"
	beginMarker = "<!-- BEGIN GENERATED: go test ./synth -run TestLayoutDoc -update -->\n"
	endMarker   = "<!-- END GENERATED -->\n"
)

// TestLayoutDoc checks (or with -update rewrites) the tables of
// docs/gguf-layout.md, which are generated from model.ExpectedTensors,
// model.Schemes and the metadata synth writes.
func TestLayoutDoc(t *testing.T) {
	gen, err := layoutTables()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(layoutDoc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the generated-section markers", layoutDoc)
	}
	fresh := s[:i+len(beginMarker)] + gen + s[j:]
	if fresh == s {
		return
	}
	if *update {
		if err := os.WriteFile(layoutDoc, []byte(fresh), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is stale: run go test ./synth -run TestLayoutDoc -update", layoutDoc)
}

// shapeFormulas gives each tensor's dimensions in terms of the
// hyperparameters; TestShapeFormulas checks them against ExpectedTensors.
var shapeFormulas = map[string]string{
	"token_embd.weight":              "E, V",
	"hc_attn_fn.weight":              "HC·E, M",
	"hc_attn_scale.weight":           "3",
	"hc_attn_base.weight":            "M",
	"attn_norm.weight":               "E",
	"attn_q_a.weight":                "E, QL",
	"attn_q_a_norm.weight":           "QL",
	"attn_q_b.weight":                "QL, H·HD",
	"attn_kv.weight":                 "E, HD",
	"attn_kv_a_norm.weight":          "HD",
	"attn_sinks.weight":              "H",
	"attn_output_a.weight":           "HD·H/G, G·OL",
	"attn_output_b.weight":           "G·OL, E",
	"attn_compressor_ape.weight":     "CW, r",
	"attn_compressor_kv.weight":      "E, CW",
	"attn_compressor_gate.weight":    "E, CW",
	"attn_compressor_norm.weight":    "HD",
	"indexer.attn_q_b.weight":        "QL, IH·IHD",
	"indexer.proj.weight":            "E, IH",
	"indexer_compressor_ape.weight":  "2·IHD, 4",
	"indexer_compressor_kv.weight":   "E, 2·IHD",
	"indexer_compressor_gate.weight": "E, 2·IHD",
	"indexer_compressor_norm.weight": "IHD",
	"hc_ffn_fn.weight":               "HC·E, M",
	"hc_ffn_scale.weight":            "3",
	"hc_ffn_base.weight":             "M",
	"ffn_norm.weight":                "E",
	"ffn_gate_inp.weight":            "E, NE",
	"ffn_gate_tid2eid.weight":        "K, V",
	"exp_probs_b.bias":               "NE",
	"ffn_gate_exps.weight":           "E, FF, NE",
	"ffn_up_exps.weight":             "E, FF, NE",
	"ffn_down_exps.weight":           "FF, E, NE",
	"ffn_gate_shexp.weight":          "E, FF",
	"ffn_up_shexp.weight":            "E, FF",
	"ffn_down_shexp.weight":          "FF, E",
	"output_hc_base.weight":          "HC",
	"output_hc_fn.weight":            "HC·E, HC",
	"output_hc_scale.weight":         "1",
	"output_norm.weight":             "E",
	"output.weight":                  "E, V",
}

func baseName(n string) string {
	if strings.HasPrefix(n, "blk.") {
		return n[strings.Index(n[4:], ".")+5:]
	}
	return n
}

// evalShape evaluates a formula such as "HD·H/G, G·OL" for layer l.
func evalShape(f string, c *model.Config, l int) ([]uint64, error) {
	sym := map[string]uint64{
		"E": uint64(c.Embed), "V": uint64(c.Vocab), "H": uint64(c.Heads), "HD": uint64(c.HeadDim),
		"QL": uint64(c.QLoraRank), "OL": uint64(c.OLoraRank), "G": uint64(c.OGroups), "HC": uint64(c.HC),
		"M": uint64(c.HCMixes()), "NE": uint64(c.Experts), "K": uint64(c.ExpertsUsed), "FF": uint64(c.ExpertFF),
		"IH": uint64(c.IndexerHeads), "IHD": uint64(c.IndexerHeadDim),
	}
	if l >= 0 {
		sym["r"], sym["CW"] = uint64(c.Ratio(l)), uint64(c.CompressorWidth(l))
	}
	var dims []uint64
	for _, d := range strings.Split(f, ", ") {
		v, op := uint64(1), byte('*')
		for d != "" {
			k := strings.IndexAny(d, "·/")
			tok := d
			next := byte(0)
			if k >= 0 {
				tok = d[:k]
				if d[k] == '/' {
					next = '/'
					d = d[k+1:]
				} else {
					next = '*'
					d = d[k+len("·"):]
				}
			} else {
				d = ""
			}
			x, ok := sym[tok]
			if !ok {
				n, err := strconv.ParseUint(tok, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("unknown symbol %q", tok)
				}
				x = n
			}
			if op == '/' {
				v /= x
			} else {
				v *= x
			}
			op = next
		}
		dims = append(dims, v)
	}
	return dims, nil
}

func TestShapeFormulas(t *testing.T) {
	for _, c := range []model.Config{model.Flash(), Tiny()} {
		for _, sp := range model.ExpectedTensors(&c) {
			f, ok := shapeFormulas[baseName(sp.Name)]
			if !ok {
				t.Errorf("no formula for %s", sp.Name)
				continue
			}
			got, err := evalShape(f, &c, sp.Layer)
			if err != nil || !slices.Equal(got, sp.Dims) {
				t.Errorf("%s: formula %q gives %v (%v), want %v", sp.Name, f, got, err, sp.Dims)
			}
		}
	}
}

type layerKind struct {
	name  string
	ratio int
	hash  bool
}

func (k layerKind) String() string {
	r := "learned routing"
	if k.hash {
		r = "hash routing"
	}
	return fmt.Sprintf("ratio %d, %s", k.ratio, r)
}

func tensorBytes(t quant.Type, dims []uint64) uint64 {
	n, err := t.TensorBytes(dims)
	if err != nil {
		return 0
	}
	return n
}

func layoutTables() (string, error) {
	c := model.Flash()
	specs := model.ExpectedTensors(&c)
	q2, q4 := model.SchemeQ2, model.SchemeQ4
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	dims := func(d []uint64) string {
		s := make([]string, len(d))
		for i, x := range d {
			s[i] = fmt.Sprint(x)
		}
		return strings.Join(s, " × ")
	}
	row := func(name, note string, sp *model.TensorSpec) {
		t2, t4 := q2.TypeFor(sp.Role), q4.TypeFor(sp.Role)
		b2 := tensorBytes(t2, sp.Dims)
		q4col := "same"
		if t4 != t2 {
			q4col = fmt.Sprintf("%v, %d", t4, tensorBytes(t4, sp.Dims))
		}
		if sp.Optional {
			note += " (optional)"
		}
		p("| `%s`%s | %s | [%s] | %s | %v | %d | %s |\n", name, note, sp.Role, shapeFormulas[baseName(sp.Name)], dims(sp.Dims), t2, b2, q4col)
	}
	header := "| tensor | role | dims (ne0 first) | Flash | q2 type | q2 bytes | q4 type, bytes |\n|---|---|---|---|---|---|---|\n"

	// Model-level tensors.
	p("### Model-level tensors\n\n%s", header)
	for i := range specs {
		if specs[i].Layer < 0 {
			row(specs[i].Name, "", &specs[i])
		}
	}

	// Per-layer tensors, grouped by the layer kinds that carry them.
	kinds := map[layerKind][]int{}
	var kindOrder []layerKind
	for l := 0; l < c.Layers; l++ {
		k := layerKind{ratio: c.Ratio(l), hash: c.IsHashLayer(l)}
		if _, ok := kinds[k]; !ok {
			kindOrder = append(kindOrder, k)
		}
		kinds[k] = append(kinds[k], l)
	}
	type entry struct {
		spec  model.TensorSpec
		kinds []layerKind
	}
	var order []string
	entries := map[string]*entry{} // base name + dims
	for _, k := range kindOrder {
		l := kinds[k][0]
		for _, sp := range specs {
			if sp.Layer != l {
				continue
			}
			key := baseName(sp.Name) + dims(sp.Dims)
			e, ok := entries[key]
			if !ok {
				e = &entry{spec: sp}
				entries[key] = e
				order = append(order, key)
			}
			e.kinds = append(e.kinds, k)
		}
	}
	groups := []struct {
		title string
		match func(base string) bool
	}{
		{"every layer", nil},
		{"compressed layers (ratio 4 and 128): the attention compressor", func(n string) bool { return strings.HasPrefix(n, "attn_compressor_") }},
		{"ratio-4 layers: the indexer", func(n string) bool { return strings.HasPrefix(n, "indexer") }},
		{"hash-routing layers (the first hash_layer_count)", func(n string) bool { return n == "ffn_gate_tid2eid.weight" }},
		{"learned-routing layers", func(n string) bool { return n == "exp_probs_b.bias" }},
	}
	for gi, g := range groups {
		p("\n### Per-layer tensors: %s\n\n%s", g.title, header)
		for _, key := range order {
			e := entries[key]
			base := baseName(e.spec.Name)
			mine := g.match == nil
			for _, o := range groups[1:] {
				if o.match(base) {
					mine = gi > 0 && o.title == g.title
				}
			}
			if !mine {
				continue
			}
			if gi == 0 && len(e.kinds) != len(kindOrder) {
				return "", fmt.Errorf("%s is not in every layer kind", base)
			}
			note := ""
			if gi == 1 && len(e.kinds) < 3 {
				note = fmt.Sprintf(" (ratio %d)", e.kinds[0].ratio)
			}
			row("blk.N."+base, note, &e.spec)
		}
	}

	// Layer kinds.
	p("\n### Layer kinds\n\n| kind | layers | count | tensors | q2 bytes per layer | q4 bytes per layer |\n|---|---|---|---|---|---|\n")
	for _, k := range kindOrder {
		ls := kinds[k]
		var n int
		var b2, b4 uint64
		for _, sp := range specs {
			if sp.Layer == ls[0] {
				n++
				b2 += tensorBytes(q2.TypeFor(sp.Role), sp.Dims)
				b4 += tensorBytes(q4.TypeFor(sp.Role), sp.Dims)
			}
		}
		lstr := make([]string, len(ls))
		for i, l := range ls {
			lstr[i] = fmt.Sprint(l)
		}
		p("| %s | %s | %d | %d | %d | %d |\n", k, strings.Join(lstr, ", "), len(ls), n, b2, b4)
	}

	// Totals.
	p("\n### Totals (Flash, 43 layers)\n\n| | q2 | q4 |\n|---|---|---|\n")
	type tot struct {
		layout *gguf.Layout
		byType map[quant.Type][2]uint64
		data   uint64
	}
	var tots [2]tot
	for i, s := range []model.Scheme{q2, q4} {
		_, l, err := Plan(Options{Config: c, Scheme: s})
		if err != nil {
			return "", err
		}
		tt := tot{layout: l, byType: map[quant.Type][2]uint64{}}
		for j, sp := range specs {
			typ := s.TypeFor(sp.Role)
			v := tt.byType[typ]
			v[0]++
			v[1] += l.Sizes[j]
			tt.byType[typ] = v
			tt.data += l.Sizes[j]
		}
		tots[i] = tt
	}
	gib := func(n uint64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
	p("| tensors | %d | %d |\n", len(specs), len(specs))
	p("| header (metadata with the vocabulary, tensor directory, padding) | %d | %d |\n",
		tots[0].layout.Offsets[0], tots[1].layout.Offsets[0])
	p("| tensor data | %d (%s) | %d (%s) |\n", tots[0].data, gib(tots[0].data), tots[1].data, gib(tots[1].data))
	p("| **file size** | **%d (%s)** | **%d (%s)** |\n", tots[0].layout.TotalSize, gib(tots[0].layout.TotalSize),
		tots[1].layout.TotalSize, gib(tots[1].layout.TotalSize))
	var types []quant.Type
	for typ := range tots[0].byType {
		types = append(types, typ)
	}
	for typ := range tots[1].byType {
		if _, ok := tots[0].byType[typ]; !ok {
			types = append(types, typ)
		}
	}
	slices.SortFunc(types, func(a, b quant.Type) int {
		return int(int64(tots[0].byType[b][1]+tots[1].byType[b][1]) - int64(tots[0].byType[a][1]+tots[1].byType[a][1]))
	})
	for _, typ := range types {
		cell := func(v [2]uint64) string {
			if v[0] == 0 {
				return "–"
			}
			return fmt.Sprintf("%d tensors, %d (%s)", v[0], v[1], gib(v[1]))
		}
		p("| %v | %s | %s |\n", typ, cell(tots[0].byType[typ]), cell(tots[1].byType[typ]))
	}

	// Schemes.
	p("\n### Schemes (`model.Schemes`)\n\n| scheme | dense | small | expert gate/up | expert down | vector | token map |\n|---|---|---|---|---|---|---|\n")
	for _, s := range model.Schemes {
		p("| %s | %v | %v | %v | %v | %v | %v |\n", s.Name, s.Dense, s.Small, s.ExpertGateUp, s.ExpertDown,
			s.TypeFor(model.RoleVector), s.TypeFor(model.RoleTokenMap))
	}
	p("\nTypes each role accepts when a file is validated (`Role.Allowed`):\n\n| role | allowed types |\n|---|---|\n")
	for r := model.RoleVector; r <= model.RoleTokenMap; r++ {
		p("| %s | %v |\n", r, r.Allowed())
	}

	// Metadata.
	p("\n### Metadata keys (Flash values, as `Config.Metadata` and `synth` write them)\n\n| key | type | value |\n|---|---|---|\n")
	for _, kv := range c.Metadata() {
		typ := kv.Value.Type.String()
		if kv.Value.Type == gguf.TypeArray {
			typ = "array of " + kv.Value.ElemType.String()
		}
		p("| `%s` | %s | %s |\n", kv.Key, typ, strings.ReplaceAll(kv.Value.Format(6), "|", "\\|"))
	}
	return b.String(), nil
}
