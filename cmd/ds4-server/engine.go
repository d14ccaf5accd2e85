package main

import (
	"fmt"
	"log/slog"

	"ds4go/backend/cuda"
	"ds4go/engine"
	"ds4go/loader"
	"ds4go/server"
	"ds4go/server/engineadapter"
)

// openEngine picks the engine to serve: the fake engine behind --fake
// (never silently), the -m model, ./ds4flash.gguf when present, or else the
// built-in demo model (said loudly in the log), on the --backend asked for.
func openEngine(o *options, log *slog.Logger) (server.Engine, string, func(), error) {
	if o.fake {
		log.Warn("serving the FAKE engine (--fake): replies are scripted echoes, not a model")
		eng, err := server.NewFakeEngine(o.ctx, nil)
		if err != nil {
			return nil, "", nil, err
		}
		return eng, "fake", func() {}, nil
	}
	backend := o.backend
	if backend == "" {
		backend = loader.BackendCPU
	}
	if backend != loader.BackendCPU && backend != loader.BackendCUDA {
		return nil, "", nil, fmt.Errorf("unknown backend %q (want cpu or cuda)", backend)
	}
	lo := loader.Options{Path: o.model, MTPPath: o.mtp, Backend: backend, Threads: o.threads, Warm: true, CUDA: cuda.Options{Fast: o.fast}}
	path, err := loader.Resolve(lo)
	if err != nil {
		return nil, "", nil, err
	}
	if path == "" {
		log.Warn("no -m and no ./" + loader.DefaultPath + ": serving the built-in DEMO model (synthetic random weights, real tokenizer; its output is meaningless)")
	}
	m, err := loader.Open(lo)
	if err != nil {
		return nil, "", nil, err
	}
	eng, err := engineadapter.New(m, o.ctx)
	if err != nil {
		m.Close()
		return nil, "", nil, err
	}
	if o.mtpDraft >= 2 {
		if !m.HasMTP() {
			m.Close()
			return nil, "", nil, fmt.Errorf("--mtp-draft %d needs an MTP block: --mtp FILE, or a model file that carries one", o.mtpDraft)
		}
		eng.Opts.Draft, eng.Opts.DraftDepth = true, o.mtpDraft-1
		log.Info("speculative decoding with the MTP block (greedy and sampled requests)", "drafts_greedy", o.mtpDraft-1, "drafts_sampled", 1)
	}
	if o.warmup < 0 { // auto: one prefill chunk on CUDA (its kernels and cuBLAS load on first use)
		o.warmup = 0
		if cs, ok := m.Backend.(engine.ChunkSizer); ok && backend == loader.BackendCUDA {
			o.warmup = cs.PreferredChunk()
		}
	}
	log.Info("model loaded", "model", m.Name, "backend", backend, "fast", o.fast, "weights", m.Weights.String(),
		"map_s", m.MapTime.Seconds(), "validate_s", m.LoadTime.Seconds(), "warm_s", m.WarmTime.Seconds(), "backend_s", m.BackendTime.Seconds())
	return eng, m.Name + " (" + backend + ")", m.Close, nil
}
