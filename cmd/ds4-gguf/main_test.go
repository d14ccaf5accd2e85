package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"ds4go/gguf"
	"ds4go/model"
	"ds4go/synth"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func tinyFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Config: synth.Tiny(), Seed: 1}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestInspectText(t *testing.T) {
	path := tinyFile(t)
	code, out, errOut := runCmd(t, "inspect", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, re := range []string{
		`(?m)^size: \d+ bytes \(.*iB\), GGUF v3, alignment 32, data section at \d+$`,
		`(?m)^metadata: 4\d keys$`,
		`(?m)^  general\.architecture +string +"deepseek4"$`,
		`(?m)^  deepseek4\.block_count +u32 +6$`,
		`(?m)^  deepseek4\.attention\.compress_ratios +\[\]u32 +\[u32 × 6\] \[0, 0, 4, 128, 4, 128\]$`,
		`(?m)^  tokenizer\.ggml\.tokens +\[\]string +\[string × 1024\] \["<｜begin▁of▁sentence｜>", .*, …\]$`,
		`(?m)^tensors: 178$`,
		`(?m)^ +0  token_embd\.weight +F16 +64 × 1024 +131072 +\d+$`,
		`(?m)^ +\d+  blk\.2\.indexer\.attn_q_b\.weight +F16 +64 × 512 +65536 +\d+$`,
		`(?m)^ +\d+  blk\.0\.ffn_gate_exps\.weight +Q8_0 +64 × 64 × 8 +34816 +\d+$`,
		`(?m)^ +\d+  output\.weight +Q8_0 +64 × 1024 +69632 +\d+$`,
		`(?m)^ +Q8_0 +67 tensors +\d+ bytes`,
		`(?m)^  6 layers, embedding 64, vocabulary 1024, context 8192$`,
		`(?m)^  compression: 2 layers ratio 0, 2 ratio 4, 2 ratio 128: \[0 0 4 128 4 128\]$`,
		`(?m)^  tensor layout: OK \(scheme q8\)$`,
		`(?m)^    deepseek4\.block_count: got 6, Flash has 43$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s", re)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
	// --kv-max 2 abbreviates arrays further; flags may follow the file.
	_, out, _ = runCmd(t, "inspect", path, "--kv-max", "2")
	if !strings.Contains(out, "[u32 × 6] [0, 0, …]") {
		t.Error("--kv-max 2 not applied")
	}
}

func TestInspectJSON(t *testing.T) {
	path := tinyFile(t)
	code, out, errOut := runCmd(t, "inspect", "--json", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Size     int64 `json:"size"`
		Metadata []struct {
			Key, Type string
			Count     uint64
			Value     any
			Truncated bool
		} `json:"metadata"`
		Tensors []struct {
			Name   string
			Type   string
			Dims   []uint64
			Offset uint64
			Bytes  uint64
		} `json:"tensors"`
		Summary struct {
			Tensors     int
			TensorBytes uint64 `json:"tensor_bytes"`
		}
		DS4 struct {
			Config        model.Config
			Scheme        string
			LayoutOK      bool     `json:"layout_ok"`
			DiffFromFlash []string `json:"diff_from_flash"`
		} `json:"ds4"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if r.Size != st.Size() || len(r.Tensors) != 178 || r.Summary.Tensors != 178 {
		t.Errorf("size %d tensors %d/%d", r.Size, len(r.Tensors), r.Summary.Tensors)
	}
	if !r.DS4.LayoutOK || r.DS4.Scheme != "q8" || r.DS4.Config.Layers != 6 || len(r.DS4.DiffFromFlash) == 0 {
		t.Errorf("ds4: %+v", r.DS4)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, tj := range r.Tensors {
		ti := &f.Tensors[i]
		if tj.Name != ti.Name || tj.Offset != f.DataOffset+ti.Offset || tj.Bytes != ti.Size || tj.Type != ti.Type.String() {
			t.Fatalf("tensor %d: %+v", i, tj)
		}
	}
	for _, kv := range r.Metadata {
		switch kv.Key {
		case model.KeyBlockCount:
			if kv.Type != "u32" || kv.Value != 6.0 {
				t.Errorf("%s: %+v", kv.Key, kv)
			}
		case model.KeyTokens:
			if vs, ok := kv.Value.([]any); kv.Count != 1024 || !kv.Truncated || !ok || len(vs) != 16 {
				t.Errorf("%s: count %d truncated %v", kv.Key, kv.Count, kv.Truncated)
			}
		}
	}
	_, out, _ = runCmd(t, "inspect", "--json", "--kv-max", "-1", path)
	if !strings.Contains(out, `"count": 1024`) || strings.Contains(out, `"truncated"`) {
		t.Error("--kv-max -1 still truncates")
	}
}

func TestValidateAndSynth(t *testing.T) {
	path := tinyFile(t)
	code, out, errOut := runCmd(t, "validate", path)
	if code != 0 || !strings.HasSuffix(out, "OK\n") || !strings.Contains(out, "deepseek4 q8: 6 layers") {
		t.Fatalf("validate: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "validate", "--scan", path)
	if code != 0 || !strings.Contains(out, "scanned 178 tensors") {
		t.Fatalf("validate --scan: exit %d\n%s%s", code, out, errOut)
	}

	// synth writes the same bytes as the library.
	p2 := filepath.Join(t.TempDir(), "s.gguf")
	code, out, errOut = runCmd(t, "synth", "-o", p2, "--tiny", "--seed", "1", "--workers", "1")
	if code != 0 || !strings.Contains(out, "wrote "+p2) {
		t.Fatalf("synth: exit %d\n%s%s", code, out, errOut)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(p2)
	if !bytes.Equal(a, b) {
		t.Error("synth --tiny differs from synth.WriteFile")
	}

	// Custom hyperparameters.
	p3 := filepath.Join(t.TempDir(), "c.gguf")
	code, _, errOut = runCmd(t, "synth", "-o", p3, "--layers", "3", "--dim", "256", "--experts", "4",
		"--ff", "256", "--vocab", "700", "--window", "8", "--topk", "2", "--scheme", "q2", "--ratios", "0,4,128")
	if code != 0 {
		t.Fatalf("synth custom: %s", errOut)
	}
	code, out, _ = runCmd(t, "inspect", p3)
	for _, want := range []string{"tensor layout: OK (scheme q2)", "3 layers, embedding 256, vocabulary 700",
		"[0 4 128]", "experts: 4 routed (2 used, ff 256)", "window 8", "top-k 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("custom model: %q missing", want)
		}
	}

	// The Flash q2 plan has the published file's size.
	code, out, _ = runCmd(t, "synth", "--flash-q2", "--dry-run")
	if code != 0 || !strings.Contains(out, "86720105792 bytes (80.76 GiB)") {
		t.Errorf("flash-q2 plan: %s", out)
	}
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	// A DS4 file whose tensors are missing.
	c := synth.Tiny()
	b := &gguf.Builder{KVs: c.Metadata()}
	var buf bytes.Buffer
	if err := b.Write(&buf, nil); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	os.WriteFile(empty, buf.Bytes(), 0o644)

	cases := []struct {
		args    []string
		code    int
		stderr  string
		stdout  string
		comment string
	}{
		{nil, 2, "usage: ds4-gguf COMMAND", "", "no command"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`, "", ""},
		{[]string{"inspect"}, 2, "want one FILE", "", ""},
		{[]string{"inspect", "-h"}, 0, "usage: ds4-gguf inspect FILE", "", ""},
		{[]string{"inspect", "--bogus", "x"}, 2, "flag provided but not defined: -bogus", "", ""},
		{[]string{"inspect", filepath.Join(dir, "nope.gguf")}, 1, "no such file", "", ""},
		{[]string{"validate", empty}, 1, "tensor layout: ", "", ""},
		{[]string{"inspect", empty}, 0, "", "tensor layout: 175 problem(s)", ""},
		{[]string{"synth"}, 2, "-o FILE is required", "", ""},
		{[]string{"synth", "-o", filepath.Join(dir, "x"), "--tiny", "--flash-q2"}, 2, "choose one of", "", ""},
		{[]string{"synth", "-o", filepath.Join(dir, "x"), "--scheme", "q3"}, 2, `unknown --scheme "q3"`, "", ""},
		{[]string{"synth", "-o", filepath.Join(dir, "x"), "--scheme", "q2"}, 1, "not a multiple of the IQ2_XXS block size", "", "tiny rows of 64"},
		{[]string{"synth", "-o", filepath.Join(dir, "x"), "--vocab", "100"}, 1, "small vocabulary of 100 tokens", "", ""},
		{[]string{"synth", "-h"}, 0, "--flash-q2", "", ""},
	}
	for _, tc := range cases {
		code, out, errOut := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.stderr) || !strings.Contains(out, tc.stdout) {
			t.Errorf("%q: exit %d, stdout %.300q, stderr %.300q", tc.args, code, out, errOut)
		}
	}
}
