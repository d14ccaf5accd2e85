// Package server is ds4-server: an OpenAI- and Anthropic-compatible HTTP
// server for DeepSeek V4 Flash, modelled on antirez/ds4's ds4_server.c.
//
// It serves /v1/chat/completions, /v1/completions, /v1/responses and
// /v1/messages (plus /v1/models, /health and /metrics) on top of an Engine:
// prompts are rendered by package chat, outputs parsed by chat/dsml, and
// one live session is reused across requests whose prompts extend it. See
// docs/server.md.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"ds4go/tokenizer"
)

// Defaults of Config.
const (
	DefaultMaxTokens    = 393216 // ds4's -n: output limit when the client gives none
	DefaultMaxBodyBytes = 64 << 20
	DefaultMaxQueue     = 256
	DefaultKeepAlive    = 5 * time.Second
	DefaultWriteTimeout = 30 * time.Second
)

// Config configures a Server.
type Config struct {
	// Engine runs the model (required).
	Engine Engine
	// ModelID is the model id reported by /v1/models (ModelID if empty).
	ModelID string
	// DefaultMaxTokens limits output when a request gives no limit.
	DefaultMaxTokens int
	// APIKey, when set, is required as "Authorization: Bearer KEY" or
	// "x-api-key: KEY" on /v1/* and /metrics.
	APIKey string
	// CORS adds Access-Control-Allow-* headers (for browser clients).
	CORS bool
	// MaxBodyBytes limits request bodies.
	MaxBodyBytes int64
	// MaxQueue bounds the requests waiting for the engine; more get 503.
	MaxQueue int
	// KeepAlive is the interval of SSE comment lines sent while a stream
	// has nothing else to say (queueing, long prefill, hidden reasoning).
	KeepAlive time.Duration
	// WriteTimeout bounds each write to a client; a client that does not
	// read for that long is dropped (and its generation cancelled).
	WriteTimeout time.Duration
	// ToolMemoryMaxIDs bounds the exact-DSML replay map.
	ToolMemoryMaxIDs int
	// DisableExactReplay turns the exact-DSML replay map off (tool history
	// is then rendered canonically from JSON).
	DisableExactReplay bool
	// Logger receives the server's logs (slog.Default() if nil).
	Logger *slog.Logger
	// KVCache configures the disk KV cache (off when KVCache.Dir is empty;
	// start from DefaultKVCacheConfig for ds4's knobs).
	KVCache KVCacheConfig
	// Warmup, when positive, is the number of tokens New prefills into the
	// session and rewinds before serving, so that the first request does
	// not pay the engine's one-time costs (kernel modules and library
	// handles loaded, scratch buffers made).
	Warmup int
}

// Server is ds4-server. Create it with New, serve Handler, stop with Close.
type Server struct {
	cfg     Config
	eng     Engine
	tok     *tokenizer.Tokenizer
	ctxSize int
	log     *slog.Logger
	metrics *metrics
	toolMem *toolMemory
	sched   *scheduler
	seq     atomic.Uint64
	started time.Time
	handler http.Handler
}

// New starts a server on cfg.Engine: it opens the live session and the
// scheduler's worker.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("server: no engine")
	}
	if cfg.ModelID == "" {
		cfg.ModelID = ModelID
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = DefaultMaxTokens
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = DefaultMaxQueue
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, eng: cfg.Engine, tok: cfg.Engine.Tokenizer(), ctxSize: cfg.Engine.ContextSize(),
		log: cfg.Logger, metrics: newMetrics(), started: time.Now()}
	if s.tok == nil {
		return nil, errors.New("server: engine has no tokenizer")
	}
	if s.ctxSize < 2 {
		return nil, fmt.Errorf("server: context size %d is too small", s.ctxSize)
	}
	s.toolMem = newToolMemory(cfg.ToolMemoryMaxIDs, 0, cfg.DisableExactReplay)
	sess, err := cfg.Engine.NewSession()
	if err != nil {
		return nil, fmt.Errorf("server: new session: %w", err)
	}
	if err := s.warmUp(sess, cfg.Warmup); err != nil {
		sess.Close()
		return nil, err
	}
	kv, err := newKVCache(s, cfg.KVCache, sess)
	if err != nil {
		sess.Close()
		return nil, err
	}
	s.sched = newScheduler(s, sess, kv, cfg.MaxQueue)
	s.handler = s.routes()
	return s, nil
}

// warmUp prefills n tokens (at most the context less one; ids spread over
// the vocabulary) into sess and rewinds it to empty.
func (s *Server) warmUp(sess Session, n int) error {
	n = min(n, s.ctxSize-1)
	if n <= 0 {
		return nil
	}
	v := s.tok.VocabSize()
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32((i*7919 + 1) % v)
	}
	t0 := time.Now()
	ctx := context.Background()
	if err := sess.Prefill(ctx, toks); err != nil {
		return fmt.Errorf("server: warm-up prefill of %d tokens: %w", n, err)
	}
	if err := sess.Rewind(ctx, 0); err != nil {
		return fmt.Errorf("server: rewind after the warm-up: %w", err)
	}
	s.log.Info("warm-up done", "tokens", n, "seconds", time.Since(t0).Seconds())
	return nil
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the scheduler (queued requests are refused, the running one
// is expected to be cancelled by its client context or the HTTP server's
// shutdown) and closes the session.
func (s *Server) Close() { s.sched.close() }

// ContextSize is the engine's context size.
func (s *Server) ContextSize() int { return s.ctxSize }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /v1/models/{id...}", s.handleModel)
	mux.HandleFunc("POST /v1/chat/completions", s.handleGen(apiChat, parseChatRequest))
	mux.HandleFunc("POST /v1/completions", s.handleGen(apiCompletions, parseCompletionRequest))
	mux.HandleFunc("POST /v1/responses", s.handleGen(apiResponses, parseResponsesRequest))
	mux.HandleFunc("POST /v1/messages", s.handleGen(apiMessages, parseMessagesRequest))
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, apiForPath(r.URL.Path), &apiError{status: 404, typ: "not_found_error",
			msg: fmt.Sprintf("unknown endpoint %s %s", r.Method, r.URL.Path)})
	})
	return s.middleware(mux)
}

// apiForPath picks the error shape for a path (Anthropic for /v1/messages).
func apiForPath(p string) apiKind {
	if strings.HasPrefix(p, "/v1/messages") {
		return apiMessages
	}
	return apiChat
}

// statusWriter records the status code for logs and metrics.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.code, w.wrote = 200, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// middleware: panic recovery, access log and metrics, CORS, API key,
// request size limit.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		api := apiForPath(r.URL.Path)
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.metrics.panics.Inc()
				s.log.Error("handler panicked", "path", r.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				if !sw.wrote {
					writeError(sw, api, &apiError{status: 500, typ: "server_error", msg: "internal server error"})
				}
			}
			endpoint := r.URL.Path
			if strings.HasPrefix(endpoint, "/v1/models/") {
				endpoint = "/v1/models/{id}"
			} else if !knownEndpoint(endpoint) {
				endpoint = "other"
			}
			code := sw.code
			if code == 0 {
				code = 200
			}
			s.metrics.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
			s.log.Debug("http", "method", r.Method, "path", r.URL.Path, "code", code, "seconds", time.Since(start).Seconds())
		}()
		if s.cfg.CORS {
			setCORS(sw.Header())
		}
		if r.Method == http.MethodOptions {
			sw.WriteHeader(http.StatusNoContent)
			return
		}
		if s.cfg.APIKey != "" && (strings.HasPrefix(r.URL.Path, "/v1/") || r.URL.Path == "/metrics") && !s.authorized(r) {
			e := &apiError{status: 401, typ: "authentication_error", code: "invalid_api_key", msg: "invalid or missing API key"}
			if api != apiMessages {
				e.typ = "invalid_request_error"
			}
			writeError(sw, api, e)
			return
		}
		r.Body = http.MaxBytesReader(sw, r.Body, s.cfg.MaxBodyBytes)
		next.ServeHTTP(sw, r)
	})
}

func knownEndpoint(p string) bool {
	switch p {
	case "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
		"/v1/messages/count_tokens", "/health", "/metrics":
		return true
	}
	return false
}

func setCORS(h http.Header) {
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "*")
}

// authorized checks "Authorization: Bearer KEY" (OpenAI) or "x-api-key"
// (Anthropic) in constant time.
func (s *Server) authorized(r *http.Request) bool {
	want := []byte(s.cfg.APIKey)
	if k := r.Header.Get("x-api-key"); k != "" && subtle.ConstantTimeCompare([]byte(k), want) == 1 {
		return true
	}
	auth := r.Header.Get("Authorization")
	if len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(auth[7:])), want) == 1
	}
	return false
}

// writeJSON writes v with a status code.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = 500
		b = []byte(`{"error":{"message":"cannot encode the response","type":"server_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// errorBody is an error in the shape of the request's API.
func errorBody(api apiKind, e *apiError) any {
	if api == apiMessages {
		typ := e.typ
		switch {
		case e.status == 401:
			typ = "authentication_error"
		case e.status == 404:
			typ = "not_found_error"
		case e.status == 413:
			typ = "request_too_large"
		case e.status == 503:
			typ = "overloaded_error"
		case e.status >= 500:
			typ = "api_error"
		case typ == "" || typ == "server_error" || typ == "not_found_error":
			typ = "invalid_request_error"
		}
		inner := map[string]any{"type": typ, "message": e.msg}
		if e.code == "context_length_exceeded" {
			inner["n_prompt_tokens"] = e.nPrompt
			inner["n_ctx"] = e.nCtx
		}
		return map[string]any{"type": "error", "error": inner}
	}
	typ := e.typ
	if typ == "" || (e.status == 404 && typ == "not_found_error") {
		typ = "invalid_request_error"
	}
	if e.status >= 500 {
		typ = "server_error"
	}
	inner := struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
		NPrompt *int    `json:"n_prompt_tokens,omitempty"`
		NCtx    *int    `json:"n_ctx,omitempty"`
	}{Message: e.msg, Type: typ}
	if e.param != "" {
		inner.Param = &e.param
	}
	if e.code != "" {
		inner.Code = &e.code
	}
	if e.code == "context_length_exceeded" {
		inner.NPrompt, inner.NCtx = &e.nPrompt, &e.nCtx
	}
	return map[string]any{"error": inner}
}

func writeError(w http.ResponseWriter, api apiKind, e *apiError) {
	if e.status == 503 {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.status, errorBody(api, e))
}

// contextError is the protocol's context-overflow error, with token counts.
func contextError(api apiKind, nPrompt, nCtx int) *apiError {
	param := "messages"
	switch api {
	case apiResponses:
		param = "input"
	case apiCompletions:
		param = "prompt"
	}
	return &apiError{status: 400, typ: "invalid_request_error", code: "context_length_exceeded", param: param,
		msg:     fmt.Sprintf("Prompt has %d tokens, but the configured context size is %d tokens", nPrompt, nCtx),
		nPrompt: nPrompt, nCtx: nCtx}
}

// modelInfo is one /v1/models entry (ds4's fields).
func (s *Server) modelInfo(id string) map[string]any {
	maxOut := min(s.cfg.DefaultMaxTokens, s.ctxSize)
	return map[string]any{
		"id": id, "object": "model", "created": 1767225600, "owned_by": "ds4go",
		"name": "DeepSeek V4 Flash", "context_length": s.ctxSize,
		"top_provider": map[string]any{"context_length": s.ctxSize, "max_completion_tokens": maxOut, "is_moderated": false},
		"supported_parameters": []string{"tools", "tool_choice", "max_tokens", "temperature", "top_p", "top_k",
			"min_p", "stop", "seed", "stream", "reasoning_effort"},
	}
}

func (s *Server) modelIDs() []string {
	ids := []string{s.cfg.ModelID}
	for _, a := range []string{AliasChat, AliasReasoner} {
		if a != s.cfg.ModelID {
			ids = append(ids, a)
		}
	}
	return ids
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	var data []any
	for _, id := range s.modelIDs() {
		data = append(data, s.modelInfo(id))
	}
	writeJSON(w, 200, map[string]any{"object": "list", "data": data})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	for _, m := range s.modelIDs() {
		if m == id {
			writeJSON(w, 200, s.modelInfo(id))
			return
		}
	}
	writeError(w, apiChat, &apiError{status: 404, typ: "invalid_request_error", code: "model_not_found",
		msg: fmt.Sprintf("The model %q does not exist", id)})
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	queued, live, busy := s.sched.status()
	writeJSON(w, 200, map[string]any{
		"status": "ok", "model": s.cfg.ModelID, "context_size": s.ctxSize,
		"queue_depth": queued, "busy": busy, "live_session_tokens": live,
		"uptime_seconds": int64(time.Since(s.started).Seconds()),
	})
}

// readBody reads a request body within the size limit.
func readBody(r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{status: 413, typ: "invalid_request_error",
				msg: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
		}
		return nil, badRequest("cannot read the request body: %v", err)
	}
	return body, nil
}

// handleCountTokens answers Anthropic's /v1/messages/count_tokens.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(r)
	if e == nil {
		var req *genRequest
		if req, e = parseMessagesRequest(body, s.ctxSize); e == nil {
			attachToolMemory(s.toolMem, req.conv.Messages)
			var text string
			var err error
			if text, err = renderPrompt(req, s.ctxSize); err != nil {
				e = badRequest("cannot render the conversation: %v", err)
			} else {
				writeJSON(w, 200, map[string]any{"input_tokens": len(s.tok.EncodeWithSpecial(text))})
				return
			}
		}
	}
	writeError(w, apiMessages, e)
}

// handleGen serves the four generation endpoints.
func (s *Server) handleGen(api apiKind, parse func([]byte, int) (*genRequest, *apiError)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		body, e := readBody(r)
		if e != nil {
			writeError(w, api, e)
			return
		}
		req, e := parse(body, s.ctxSize)
		if e != nil {
			writeError(w, api, e)
			return
		}
		if e := s.prepare(req); e != nil {
			writeError(w, api, e)
			return
		}
		n := len(req.promptTokens)
		if req.liveTail != "" {
			if fr := s.sched.frontier(); fr != nil {
				n = fr.tokens + len(s.tok.EncodeWithSpecial(req.liveTail))
			}
		}
		if n >= s.ctxSize {
			writeError(w, api, contextError(api, n, s.ctxSize))
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		j := &job{ctx: ctx, req: req, q: newEventQueue(), enqueued: time.Now()}
		if !s.sched.submit(j) {
			writeError(w, api, &apiError{status: 503, typ: "server_error", msg: "server is overloaded (request queue full); retry later"})
			return
		}
		if req.stream {
			s.stream(w, r, j, newStreamer(s, req))
		} else {
			s.respond(w, j, req)
		}
		s.metrics.duration.WithLabelValues(r.URL.Path).Observe(time.Since(start).Seconds())
	}
}

// respond waits for a non-streaming generation and writes its response.
func (s *Server) respond(w http.ResponseWriter, j *job, req *genRequest) {
	var buf []event
	for {
		select {
		case <-j.ctx.Done():
			return
		case <-j.q.notify:
		}
		evs, closed := j.q.take(buf)
		buf = evs
		for _, ev := range evs {
			if ev.kind != evDone {
				continue
			}
			res := ev.res
			if res.err != nil {
				writeError(w, req.api, res.err)
				return
			}
			writeJSON(w, 200, s.finalBody(req, res))
			return
		}
		if closed {
			return
		}
	}
}

// nextID returns a response id with a prefix.
func (s *Server) nextID(prefix string) string {
	return prefix + strconv.FormatUint(s.seq.Add(1), 10) + "-" + randomID("")[:8]
}
