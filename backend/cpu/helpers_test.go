package cpu_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"ds4go/backend/cpu"
	"ds4go/engine"
	"ds4go/gguf"
	"ds4go/internal/golden"
	"ds4go/model"
)

var tmpDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "ds4go-cpu-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tmpDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// goldenModel is a golden case converted to an F32 GGUF and loaded.
type goldenModel struct {
	*golden.Case
	w *model.Weights
}

var (
	goldenMu    sync.Mutex
	goldenCache = map[string]*goldenModel{}
)

// loadGolden converts (once per test binary) and loads a golden case.
func loadGolden(t testing.TB, name string) *goldenModel {
	t.Helper()
	goldenMu.Lock()
	defer goldenMu.Unlock()
	if g, ok := goldenCache[name]; ok {
		return g
	}
	c, err := golden.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmpDir, name+".gguf")
	if err := c.Convert(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	g := &goldenModel{Case: c, w: w}
	goldenCache[name] = g
	return g
}

func newBackend(t testing.TB, w *model.Weights, opts cpu.Options) *cpu.Backend {
	t.Helper()
	be, err := cpu.New(w, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func newSession(t testing.TB, be engine.Backend, opts engine.Options) *engine.Session {
	t.Helper()
	s, err := engine.NewSession(be, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
