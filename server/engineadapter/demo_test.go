package engineadapter

import (
	"testing"

	"ds4go/loader"
)

// demo opens the demo model on the CPU backend and serves it with a context
// of ctx tokens.
func demo(t *testing.T, ctx int) *Engine {
	t.Helper()
	m, err := loader.Open(loader.Options{Demo: true, Backend: loader.BackendCPU, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	eng, err := New(m, ctx)
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

func TestNewNeedsABackend(t *testing.T) {
	m, err := loader.Open(loader.Options{Demo: true, Backend: loader.BackendNone})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := New(m, 0); err == nil {
		t.Fatal("no error for a model without a backend")
	}
}
