package engineadapter

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"ds4go/loader"
	"ds4go/server"
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

// testServer serves eng (with the disk cache kv, off when kv.Dir is empty)
// over HTTP. post sends a chat completion request and returns the body of
// its 200 response; stop closes the server (the disk cache's shutdown save
// runs) and is also registered as a cleanup.
func testServer(t *testing.T, eng *Engine, kv server.KVCacheConfig) (post func(body string) []byte, stop func()) {
	t.Helper()
	srv, err := server.New(server.Config{Engine: eng, KVCache: kv, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			hs.Close()
			srv.Close()
		}
	}
	t.Cleanup(stop)
	post = func(body string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/chat/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return b
	}
	return post, stop
}
