// Package golden opens the golden cases of testdata/golden for tests: small
// models in the official checkpoint layout, the token runs they were run on,
// and the logits and hidden states the official DeepSeek inference code
// computed for them (docs/forward-reference.md). Tests convert a case to a
// GGUF with Convert and compare the engine's rows with Tensors.Rows.
package golden

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"ds4go/convert"
	"ds4go/gguf"
	"ds4go/model"
	"ds4go/synth"
)

// Dir returns testdata/golden of the module the working directory is in
// (tests run in their package's directory).
func Dir() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "testdata", "golden"), nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("golden: no go.mod above the working directory")
		}
		d = up
	}
}

// Case is one golden case.
type Case struct {
	Name string
	// Dir holds the checkpoint (config.json, *.safetensors), tokens.json,
	// logits.safetensors and hidden.safetensors.
	Dir string
	// Tokens are the token runs by name ("short", "long", ...).
	Tokens map[string][]int32
	// MTP reports that the checkpoint carries an MTP block
	// (inference_config.json's n_mtp_layers), which Convert converts too.
	MTP bool
}

// Open opens a case by name (a folder of testdata/golden).
func Open(name string) (*Case, error) {
	root, err := Dir()
	if err != nil {
		return nil, err
	}
	c := &Case{Name: name, Dir: filepath.Join(root, name)}
	b, err := os.ReadFile(filepath.Join(c.Dir, "tokens.json"))
	if err != nil {
		return nil, fmt.Errorf("golden %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &c.Tokens); err != nil {
		return nil, fmt.Errorf("golden %s: tokens.json: %w", name, err)
	}
	b, err = os.ReadFile(filepath.Join(c.Dir, "inference_config.json"))
	if err != nil {
		return nil, fmt.Errorf("golden %s: %w", name, err)
	}
	var args struct {
		MTPLayers int `json:"n_mtp_layers"`
	}
	if err := json.Unmarshal(b, &args); err != nil {
		return nil, fmt.Errorf("golden %s: inference_config.json: %w", name, err)
	}
	c.MTP = args.MTPLayers > 0
	return c, nil
}

// Convert writes the case's checkpoint as an F32 GGUF at out (what
// `ds4-gguf convert` does; with its MTP block when it has one), with a byte-level vocabulary of the model's size
// added (the official layout carries no tokenizer; loaders want one). The
// weights are the checkpoint's.
func (c *Case) Convert(ctx context.Context, out string) error {
	o := convert.Options{InputDir: c.Dir, Output: out, Scheme: model.SchemeF32, Tokenizer: convert.TokenizerNone, MTP: c.MTP}
	if err := convert.Convert(ctx, o); err != nil {
		return fmt.Errorf("golden %s: convert: %w", c.Name, err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := model.ConfigFromGGUF(f)
	if err != nil {
		return err
	}
	v, err := synth.SmallVocab(cfg.Vocab)
	if err != nil {
		return err
	}
	b := gguf.FromFile(f)
	b.KVs = append(b.KVs, model.VocabMetadata(v)...)
	var buf bytes.Buffer
	if err := b.Write(&buf, func(i int) ([]byte, error) { return f.TensorData(&f.Tensors[i]), nil }); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// Tensor is one reference tensor, F32 or I32.
type Tensor struct {
	Shape []int64
	F32   []float32 // for F32 tensors
	I32   []int32   // for I32 tensors
}

// Tensors are the tensors of one reference file, by name.
type Tensors map[string]*Tensor

// Read reads a whole reference file of the case ("logits.safetensors",
// "hidden.safetensors"; they are small).
func (c *Case) Read(file string) (Tensors, error) {
	sf, err := convert.OpenSafetensors(filepath.Join(c.Dir, file))
	if err != nil {
		return nil, err
	}
	defer sf.Close()
	out := Tensors{}
	for i := range sf.Header.Tensors {
		ti := &sf.Header.Tensors[i]
		b, err := sf.ReadAll(ti)
		if err != nil {
			return nil, err
		}
		t := &Tensor{Shape: ti.Shape}
		switch ti.DType {
		case convert.F32:
			t.F32 = make([]float32, len(b)/4)
			for j := range t.F32 {
				t.F32[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
			}
		case convert.I32:
			t.I32 = make([]int32, len(b)/4)
			for j := range t.I32 {
				t.I32[j] = int32(binary.LittleEndian.Uint32(b[4*j:]))
			}
		default:
			return nil, fmt.Errorf("golden %s: %s: tensor %s has dtype %s (want F32 or I32)", c.Name, file, ti.Name, ti.DType)
		}
		out[ti.Name] = t
	}
	return out, nil
}

// Rows returns the rows of a logits variant: key+".positions" (I32) and
// key+".logits" (F32, [rows, vocab]).
func (ts Tensors) Rows(key string) (pos []int32, rows [][]float32, err error) {
	pt, lt := ts[key+".positions"], ts[key+".logits"]
	if pt == nil || lt == nil || pt.I32 == nil || lt.F32 == nil || len(lt.Shape) != 2 || int(lt.Shape[0]) != len(pt.I32) {
		return nil, nil, fmt.Errorf("golden: no positions/logits pair for %s", key)
	}
	v := int(lt.Shape[1])
	rows = make([][]float32, len(pt.I32))
	for i := range rows {
		rows[i] = lt.F32[i*v : (i+1)*v]
	}
	return pt.I32, rows, nil
}
