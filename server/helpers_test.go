package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"ds4go/chat"
	"ds4go/tokenizer"
)

var (
	tokOnce sync.Once
	tokVal  *tokenizer.Tokenizer
	tokErr  error
)

func testTokenizer(t testing.TB) *tokenizer.Tokenizer {
	tokOnce.Do(func() { tokVal, tokErr = tokenizer.Default() })
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return tokVal
}

type testEnv struct {
	t   testing.TB
	s   *Server
	hs  *httptest.Server
	eng *FakeEngine
}

type envOpt func(*Config, *FakeEngine)

// newEnv starts a server on a fake engine running script.
func newEnv(t testing.TB, script func(string) string, opts ...envOpt) *testEnv {
	t.Helper()
	eng := &FakeEngine{Tok: testTokenizer(t), Ctx: 4096, Script: script}
	cfg := Config{Engine: eng, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(&cfg, eng)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		s.Close()
	})
	return &testEnv{t: t, s: s, hs: hs, eng: eng}
}

// thinkReply is a script that reasons when the prompt ends with <think>.
func thinkReply(reasoning, text string) func(string) string {
	return func(p string) string {
		if strings.HasSuffix(p, chat.ThinkStart) {
			return reasoning + chat.ThinkEnd + text
		}
		return text
	}
}

func (e *testEnv) post(path string, body any, hdr ...string) (*http.Response, []byte) {
	e.t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			e.t.Fatal(err)
		}
	}
	req, _ := http.NewRequest("POST", e.hs.URL+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, out
}

// postJSON posts and decodes a 200 JSON answer.
func (e *testEnv) postJSON(path string, body any) map[string]any {
	e.t.Helper()
	resp, out := e.post(path, body)
	if resp.StatusCode != 200 {
		e.t.Fatalf("%s: status %d: %s", path, resp.StatusCode, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		e.t.Fatalf("%s: %v: %s", path, err, out)
	}
	return m
}

type sseEvent struct {
	name string
	data string
}

// parseSSE splits an event stream; comments are returned with name ":".
func parseSSE(t testing.TB, body []byte) []sseEvent {
	var evs []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.name != "" || cur.data != "" {
				evs = append(evs, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			evs = append(evs, sseEvent{name: ":", data: strings.TrimSpace(line[1:])})
		case strings.HasPrefix(line, "event: "):
			cur.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data += line[6:]
		default:
			t.Fatalf("bad SSE line %q", line)
		}
	}
	return evs
}

// stream posts a streaming request and returns its events (comments
// dropped unless keepComments).
func (e *testEnv) stream(path string, body any) []sseEvent {
	e.t.Helper()
	resp, out := e.post(path, body)
	if resp.StatusCode != 200 {
		e.t.Fatalf("%s: status %d: %s", path, resp.StatusCode, out)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		e.t.Fatalf("content type %q", ct)
	}
	var evs []sseEvent
	for _, ev := range parseSSE(e.t, out) {
		if ev.name != ":" {
			evs = append(evs, ev)
		}
	}
	return evs
}

func jsonOf(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return m
}

// dig walks a decoded JSON value by keys and indices.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func num(v any) int {
	f, _ := v.(float64)
	return int(f)
}

// chatDeltas concatenates the content, reasoning and per-index tool
// arguments of chat chunks.
type chatAcc struct {
	content, reasoning string
	names, ids         map[int]string
	args               map[int]string
	finish             string
	usage              map[string]any
	done               bool
}

func accumulateChat(t testing.TB, evs []sseEvent) *chatAcc {
	a := &chatAcc{names: map[int]string{}, ids: map[int]string{}, args: map[int]string{}}
	for _, ev := range evs {
		if ev.data == "[DONE]" {
			a.done = true
			continue
		}
		m := jsonOf(t, ev.data)
		if u, ok := m["usage"].(map[string]any); ok {
			a.usage = u
		}
		ch, _ := m["choices"].([]any)
		if len(ch) == 0 {
			continue
		}
		c := ch[0].(map[string]any)
		if f, ok := c["finish_reason"].(string); ok {
			a.finish = f
		}
		d, _ := c["delta"].(map[string]any)
		if s, ok := d["content"].(string); ok {
			a.content += s
		}
		if s, ok := d["reasoning_content"].(string); ok {
			a.reasoning += s
		}
		tcs, _ := d["tool_calls"].([]any)
		for _, tc := range tcs {
			tm := tc.(map[string]any)
			i := num(tm["index"])
			if id, ok := tm["id"].(string); ok {
				a.ids[i] = id
			}
			f := tm["function"].(map[string]any)
			if n, ok := f["name"].(string); ok && n != "" {
				a.names[i] = n
			}
			if s, ok := f["arguments"].(string); ok {
				a.args[i] += s
			}
		}
	}
	return a
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ = context.Background

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }

type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func newRecorder() *recorder                    { return &recorder{h: http.Header{}} }
func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(c int)           { r.code = c }

func mustReq(method, path string) *http.Request {
	r, _ := http.NewRequest(method, path, nil)
	return r
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
