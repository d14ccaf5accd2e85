package cli

import (
	"fmt"
	"io"
	"os"

	"ds4go/backend/cuda"
	"ds4go/loader"
)

// DefaultModelPath is the model used when -m is not given (as in ds4.c).
const DefaultModelPath = loader.DefaultPath

// DemoWarning is printed on stderr when the built-in demo model runs.
const DemoWarning = "ds4: warning: running the built-in demo model (synthetic, random weights, real tokenizer): its text is meaningless; use -m MODEL.gguf for real output"

// openModel opens the model the flags ask for: -m PATH, else ./ds4flash.gguf
// if present, else (or with --demo) the built-in demo model. A real file's
// weights are paged in first, behind a progress bar when stderr is a
// terminal (--no-warm skips that).
func openModel(o *Options, stderr io.Writer, stderrTTY bool) (*loader.Model, error) {
	lo := loader.Options{Path: o.Model, Demo: o.Demo, MTPPath: o.MTP, Backend: o.Backend, Threads: o.Threads, CUDA: cuda.Options{Fast: o.Fast}, Warm: !o.NoWarm}
	if o.DumpTokens || o.Inspect {
		lo.Backend = loader.BackendNone
	}
	if stderrTTY {
		lo.Progress = stderr
	}
	path, err := loader.Resolve(lo)
	if err != nil {
		return nil, err
	}
	if path == "" {
		fmt.Fprintln(stderr, DemoWarning)
	}
	m, err := loader.Open(lo)
	if err != nil {
		return nil, err
	}
	if o.MTPDraft >= 2 && lo.Backend != loader.BackendNone && !m.HasMTP() {
		m.Close()
		return nil, fmt.Errorf("--mtp-draft %d needs an MTP block: --mtp FILE, or a model file that carries one", o.MTPDraft)
	}
	return m, nil
}

// stderrIsTerminal reports whether w is the process's stderr and a terminal.
func stderrIsTerminal(w io.Writer) bool {
	return w == io.Writer(os.Stderr) && isTerminal(os.Stderr)
}
