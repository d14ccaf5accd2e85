// Command ds4-server serves DeepSeek V4 Flash over OpenAI- and
// Anthropic-compatible HTTP APIs (see docs/server.md). Its flags follow
// antirez/ds4's ds4-server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"ds4go/engine"
	"ds4go/kvdisk"
	"ds4go/server"
)

type options struct {
	model        string
	ctx          int
	tokens       int
	threads      int
	host         string
	port         int
	apiKey       string
	cors         bool
	trace        string
	fake         bool
	maxQueue     int
	maxBodyMB    int
	keepAlive    time.Duration
	writeTimeout time.Duration
	toolMaxIDs   int
	noExactDSML  bool
	logLevel     string
	backend      string
	chdir        string
	fast         bool // CUDA fast mode
	warmup       int  // tokens prefilled at start (-1: one chunk on CUDA)
	mtp          string
	mtpDraft     int // ≥ 2: requests decoded speculatively with the MTP block

	kv        server.KVCacheConfig
	kvIgnored map[string]*string // accepted for ds4 compatibility, not implemented
}

func parseFlags(args []string) (*options, error) {
	o := &options{kvIgnored: map[string]*string{}, kv: server.DefaultKVCacheConfig()}
	fs := flag.NewFlagSet("ds4-server", flag.ContinueOnError)
	str := func(p *string, def, usage string, names ...string) {
		for _, n := range names {
			fs.StringVar(p, n, def, usage)
		}
	}
	num := func(p *int, def int, usage string, names ...string) {
		for _, n := range names {
			fs.IntVar(p, n, def, usage)
		}
	}
	str(&o.model, "", "GGUF model path (default: the built-in demo model, when available)", "m", "model")
	num(&o.ctx, 32768, "context size allocated at startup", "c", "ctx")
	num(&o.tokens, server.DefaultMaxTokens, "default max output tokens when the client gives none", "n", "tokens")
	num(&o.threads, 0, "CPU threads (0: all)", "t", "threads")
	str(&o.host, "127.0.0.1", "bind address", "host")
	num(&o.port, 8000, "bind port", "port")
	str(&o.apiKey, "", "require this key as 'Authorization: Bearer KEY' or 'x-api-key: KEY' (also $DS4_API_KEY)", "api-key")
	fs.BoolVar(&o.cors, "cors", false, "add Access-Control-Allow-* headers for browser clients")
	str(&o.trace, "", "write a debug-level log of every request to FILE", "trace")
	fs.BoolVar(&o.fake, "fake", false, "serve the deterministic fake engine (testing only: it echoes, it is not a model)")
	num(&o.maxQueue, server.DefaultMaxQueue, "requests that may wait for the engine before 503", "max-queue")
	num(&o.maxBodyMB, server.DefaultMaxBodyBytes>>20, "largest request body in MiB", "max-body-mb")
	fs.DurationVar(&o.keepAlive, "sse-keepalive", server.DefaultKeepAlive, "interval of SSE keepalive comments")
	fs.DurationVar(&o.writeTimeout, "write-timeout", server.DefaultWriteTimeout, "drop a client that does not read for this long")
	num(&o.toolMaxIDs, server.DefaultToolMemoryMaxIDs, "maximum exact tool-call ids kept for DSML replay", "tool-memory-max-ids")
	fs.BoolVar(&o.noExactDSML, "disable-exact-dsml-tool-replay", false, "render tool history canonically from JSON instead of the sampled DSML")
	str(&o.logLevel, "info", "log level: debug, info, warn, error", "log-level")
	str(&o.backend, "", "backend: cpu or cuda (cuda needs libds4cuda.so, docs/cuda.md)", "backend")
	str(&o.chdir, "", "change directory before loading the model", "chdir")
	fs.BoolVar(&o.fast, "fast", false, "CUDA: fast mode (on an H200 ≈ 4× faster prompts and ≈ 1.2× faster decode than exact mode: README's Performance) — parallel sums, prompts' attention and products in f16 on the tensor cores, decode attention split over the keys (not bit-identical to the CPU backend; docs/cuda.md)")
	num(&o.warmup, -1, "prefill N tokens at start and rewind, so that the first request pays no one-time costs (kernel loading, scratch buffers); -1: one prefill chunk on the CUDA backend, none on the CPU", "warmup")
	var cpu, cuda, metal bool
	fs.BoolVar(&cpu, "cpu", false, "use the CPU backend")
	fs.BoolVar(&cuda, "cuda", false, "use the CUDA backend")
	fs.BoolVar(&metal, "metal", false, "not supported (ds4go has no Metal backend)")
	str(&o.kv.Dir, "", "enable disk KV checkpoints in DIR (created if needed; docs/kvdisk.md)", "kv-disk-dir")
	num(&o.kv.SpaceMB, kvdisk.DefaultBudgetMB, "disk budget for checkpoint files in MiB (least recently used files are removed beyond it)", "kv-disk-space-mb")
	num(&o.kv.MinTokens, server.DefaultKVCacheMinTokens, "do not save or load checkpoints shorter than N tokens", "kv-cache-min-tokens")
	num(&o.kv.ColdMaxTokens, server.DefaultKVCacheColdMaxTokens, "cold first prompts in [min, N] tokens are saved before generation; 0 disables cold saves", "kv-cache-cold-max-tokens")
	num(&o.kv.ContinuedIntervalTokens, server.DefaultKVCacheContinuedInterval, "save at absolute aligned frontiers about N tokens apart; 0 disables", "kv-cache-continued-interval-tokens")
	num(&o.kv.BoundaryTrimTokens, server.DefaultKVCacheBoundaryTrimTokens, "trim N tail tokens before a cold save (tokenizer boundary merges)", "kv-cache-boundary-trim-tokens")
	num(&o.kv.BoundaryAlignTokens, server.DefaultKVCacheBoundaryAlign, "align cold saves down to a multiple of N tokens; 0 disables", "kv-cache-boundary-align-tokens")
	fs.BoolVar(&o.kv.RejectDifferentQuant, "kv-cache-reject-different-quant", false, "refuse checkpoints written with another routed-expert quantization")
	str(&o.mtp, "", "separate MTP GGUF (the draft head of speculative decoding)", "mtp")
	num(&o.mtpDraft, 1, "2: requests decoded speculatively, one token drafted by the MTP block and verified a pass, greedy or sampled (the same tokens as without it, but for near ties --fast may flip); k > 2: requests (greedy or sampled) draft up to k-1 a pass, the block run again over its own output, as deep as the backend's measured costs say pays; 1: no speculation (ds4's default)", "mtp-draft")
	for _, n := range []string{"mtp-margin",
		"dir-steering-file", "dir-steering-ffn", "dir-steering-attn"} {
		v := new(string)
		o.kvIgnored[n] = v
		fs.StringVar(v, n, "", "accepted for ds4 compatibility; not implemented (ignored)")
	}
	var ignoredBool bool
	fs.BoolFunc("quality", "exact kernels (the default; --fast turns it off)", func(string) error { o.fast = false; return nil })
	fs.BoolVar(&ignoredBool, "warm-weights", false, "accepted for ds4 compatibility (weights are always paged in at start)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case metal:
		return nil, errors.New("--metal: ds4go has no Metal backend")
	case cuda:
		o.backend = "cuda"
	case cpu:
		o.backend = "cpu"
	}
	if o.apiKey == "" {
		o.apiKey = os.Getenv("DS4_API_KEY")
	}
	if o.ctx < 2 {
		return nil, fmt.Errorf("--ctx %d is too small", o.ctx)
	}
	for name, v := range map[string]int{"kv-disk-space-mb": o.kv.SpaceMB, "kv-cache-min-tokens": o.kv.MinTokens,
		"kv-cache-cold-max-tokens": o.kv.ColdMaxTokens, "kv-cache-continued-interval-tokens": o.kv.ContinuedIntervalTokens,
		"kv-cache-boundary-trim-tokens": o.kv.BoundaryTrimTokens, "kv-cache-boundary-align-tokens": o.kv.BoundaryAlignTokens} {
		if v < 0 {
			return nil, fmt.Errorf("--%s %d must not be negative", name, v)
		}
	}
	if o.kv.ColdMaxTokens > 0 && o.kv.ColdMaxTokens < o.kv.MinTokens {
		return nil, errors.New("--kv-cache-cold-max-tokens must be 0 or >= --kv-cache-min-tokens")
	}
	if o.mtpDraft < 1 || o.mtpDraft > engine.MaxDraftDepth+1 {
		return nil, fmt.Errorf("--mtp-draft %d must be 1..%d", o.mtpDraft, engine.MaxDraftDepth+1)
	}
	if o.port < 0 || o.port > 65535 {
		return nil, fmt.Errorf("--port %d is out of range", o.port)
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ds4-server:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "ds4-server:", err)
		os.Exit(1)
	}
}

func newLogger(o *options) (*slog.Logger, func(), error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, nil, fmt.Errorf("--log-level: %w", err)
	}
	h := slog.Handler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	closeFn := func() {}
	if o.trace != "" {
		f, err := os.Create(o.trace)
		if err != nil {
			return nil, nil, fmt.Errorf("--trace: %w", err)
		}
		closeFn = func() { f.Close() }
		h = teeHandler{h, slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug})}
	}
	return slog.New(h), closeFn, nil
}

// teeHandler sends records to two handlers.
type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if t.a.Enabled(ctx, r.Level) {
		_ = t.a.Handle(ctx, r.Clone())
	}
	if t.b.Enabled(ctx, r.Level) {
		return t.b.Handle(ctx, r)
	}
	return nil
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}

func (t teeHandler) WithGroup(n string) slog.Handler {
	return teeHandler{t.a.WithGroup(n), t.b.WithGroup(n)}
}

func run(o *options) error {
	log, closeLog, err := newLogger(o)
	if err != nil {
		return err
	}
	defer closeLog()
	slog.SetDefault(log)
	if o.chdir != "" {
		if err := os.Chdir(o.chdir); err != nil {
			return err
		}
	}
	for n, v := range o.kvIgnored {
		if *v != "" {
			log.Warn("flag accepted for ds4 compatibility but not implemented", "flag", "--"+n)
		}
	}

	eng, desc, closeEng, err := openEngine(o, log)
	if err != nil {
		return err
	}
	defer closeEng()
	srv, err := server.New(server.Config{
		Engine: eng, DefaultMaxTokens: o.tokens, APIKey: o.apiKey, CORS: o.cors,
		MaxBodyBytes: int64(o.maxBodyMB) << 20, MaxQueue: o.maxQueue, KeepAlive: o.keepAlive,
		WriteTimeout: o.writeTimeout, ToolMemoryMaxIDs: o.toolMaxIDs, DisableExactReplay: o.noExactDSML,
		Logger: log, KVCache: o.kv, Warmup: o.warmup,
	})
	if err != nil {
		return err
	}
	if o.noExactDSML {
		log.Info("exact DSML tool replay disabled; tool history uses canonical JSON rendering")
	}

	addr := net.JoinHostPort(o.host, strconv.Itoa(o.port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		srv.Close()
		return err
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if o.apiKey == "" && !isLoopback(o.host) {
		log.Warn("listening on a non-loopback address without --api-key: anyone who can reach it can use the model", "addr", addr)
	}
	log.Info("ds4-server listening", "addr", "http://"+ln.Addr().String(), "engine", desc, "ctx", srv.ContextSize(),
		"auth", o.apiKey != "")

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		srv.Close()
		return err
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = hs.Shutdown(ctx)
	_ = hs.Close() // cancels streams still running, which stops their generation
	srv.Close()
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
