package loader

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"ds4go/model"
	"ds4go/synth"
)

func TestResolve(t *testing.T) {
	t.Chdir(t.TempDir())
	if p, err := Resolve(Options{}); err != nil || p != "" {
		t.Errorf("no file: %q %v, want the demo", p, err)
	}
	if _, err := Resolve(Options{NoDemoFallback: true}); !errors.Is(err, ErrNoModel) {
		t.Errorf("no file, no fallback: %v", err)
	}
	if p, _ := Resolve(Options{Path: "x.gguf"}); p != "x.gguf" {
		t.Errorf("explicit path: %q", p)
	}
	if err := os.WriteFile(DefaultPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if p, _ := Resolve(Options{}); p != DefaultPath {
		t.Errorf("default present: %q", p)
	}
	if p, _ := Resolve(Options{Demo: true}); p != "" {
		t.Errorf("--demo: %q", p)
	}
}

func TestDemoHasTheRealTokenizer(t *testing.T) {
	m, err := Open(Options{Demo: true, Backend: BackendNone})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.Demo || m.Backend != nil || m.Tokenizer.VocabSize() != synth.RealVocabSize || m.Config.Vocab != synth.RealVocabSize {
		t.Fatalf("demo: %+v vocab %d", m.Config, m.Tokenizer.VocabSize())
	}
	// "Hello" is one token of the real vocabulary.
	if ids := m.Tokenizer.Encode("Hello"); len(ids) != 1 {
		t.Errorf("Hello → %v", ids)
	}
}

func TestOpenFileWarmsWithProgress(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Config: synth.Tiny(), Scheme: model.SchemeQ8, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	var bar bytes.Buffer
	m, err := Open(Options{Path: path, Backend: BackendCPU, Threads: 1, Warm: true, Progress: &bar})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Demo || m.Name != path || m.Backend == nil {
		t.Fatalf("model %+v", m)
	}
	if !strings.Contains(bar.String(), "loading weights") {
		t.Errorf("no progress bar: %q", bar.String())
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(Options{Path: filepath.Join(dir, "missing.gguf"), Backend: BackendCPU})
	if err == nil || !strings.Contains(err.Error(), "huggingface") || !strings.Contains(err.Error(), "--demo") {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.gguf")
	if err := os.WriteFile(bad, []byte("GGUF not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Path: bad, Backend: BackendCPU}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("corrupt file: %v", err)
	}
	if _, err := Open(Options{Demo: true, Backend: "tpu"}); err == nil || !strings.Contains(err.Error(), "tpu") {
		t.Errorf("unknown backend: %v", err)
	}
}

func TestContextSize(t *testing.T) {
	m := &Model{}
	m.Config.ContextLen = 8192
	for _, c := range [][2]int{{100, 100}, {8192, 8192}, {9000, 8192}, {0, 8192}, {-1, 8192}} {
		if got := m.ContextSize(c[0]); got != c[1] {
			t.Errorf("ContextSize(%d) = %d, want %d", c[0], got, c[1])
		}
	}
	m.Config.ContextLen = 0 // the model states none
	if got := m.ContextSize(300); got != 300 {
		t.Errorf("no model limit: %d", got)
	}
}
