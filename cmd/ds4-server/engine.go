package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"ds4go/server"
	"ds4go/server/engineadapter"
)

// defaultModel is ds4's default model path, used when it exists.
const defaultModel = "ds4flash.gguf"

// openEngine picks the engine to serve: the fake engine behind --fake
// (never silently), the -m model, ./ds4flash.gguf when present, or else the
// built-in demo model (said loudly in the log).
func openEngine(o *options, log *slog.Logger) (server.Engine, string, func(), error) {
	if o.fake {
		log.Warn("serving the FAKE engine (--fake): replies are scripted echoes, not a model")
		eng, err := server.NewFakeEngine(o.ctx, nil)
		if err != nil {
			return nil, "", nil, err
		}
		return eng, "fake", func() {}, nil
	}
	if o.backend != "" && o.backend != "cpu" {
		return nil, "", nil, fmt.Errorf("backend %q is not available in this build (cpu only)", o.backend)
	}
	eo := engineadapter.Options{Ctx: o.ctx, Threads: o.threads}
	path := o.model
	if path == "" {
		if _, err := os.Stat(defaultModel); err == nil {
			path = defaultModel
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, "", nil, err
		}
	}
	if path == "" {
		log.Warn("no -m and no ./" + defaultModel + ": serving the built-in DEMO model (synthetic random weights; its output is meaningless)")
		eng, err := engineadapter.Demo(eo)
		if err != nil {
			return nil, "", nil, fmt.Errorf("demo model: %w", err)
		}
		return eng, "demo (synthetic tiny model, cpu)", func() {}, nil
	}
	eng, closeFn, err := engineadapter.Open(path, eo)
	if err != nil {
		return nil, "", nil, fmt.Errorf("%s: %w", path, err)
	}
	return eng, path + " (cpu)", closeFn, nil
}
