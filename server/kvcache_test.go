package server

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"ds4go/kvdisk"
)

// syncBuf is a log sink safe for the server's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// kvEnv starts a fake-engine server with the disk cache in dir (small
// knobs so that short prompts are cached).
func kvEnv(t *testing.T, dir string, logs *syncBuf, mod func(*KVCacheConfig)) *testEnv {
	t.Helper()
	return newEnv(t, nil, func(c *Config, _ *FakeEngine) {
		c.KVCache = DefaultKVCacheConfig()
		c.KVCache.Dir = dir
		c.KVCache.MinTokens = 64
		c.KVCache.BoundaryTrimTokens = 8
		c.KVCache.BoundaryAlignTokens = 64
		c.KVCache.ContinuedIntervalTokens = 0
		if mod != nil {
			mod(&c.KVCache)
		}
		if logs != nil {
			c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		}
	})
}

func (e *testEnv) stop() {
	e.hs.CloseClientConnections()
	e.hs.Close()
	e.s.Close()
}

func longUser(tag string, words int) map[string]any {
	return user(tag + " " + strings.Repeat("lorem ipsum dolor sit amet ", words/5))
}

func chatBody(msgs ...any) map[string]any {
	return map[string]any{"model": AliasChat, "messages": msgs, "max_tokens": 8}
}

func cacheFiles(t *testing.T, dir string) []kvdisk.Entry {
	t.Helper()
	st, err := kvdisk.Open(kvdisk.Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return st.Entries()
}

func TestKVDiskRestartSkipsPrefill(t *testing.T) {
	dir := t.TempDir()
	body := chatBody(longUser("first", 600))
	a := kvEnv(t, dir, nil, nil)
	m := a.postJSON("/v1/chat/completions", body)
	prompt := num(dig(m, "usage", "prompt_tokens"))
	if prompt < 500 || a.eng.Prefilled.Load() < int64(prompt) {
		t.Fatalf("prompt %d tokens, prefilled %d", prompt, a.eng.Prefilled.Load())
	}
	a.stop()
	files := cacheFiles(t, dir)
	reasons := map[kvdisk.Reason]int{}
	for _, f := range files {
		reasons[f.Header.Reason]++
	}
	if reasons[kvdisk.ReasonCold] != 1 || reasons[kvdisk.ReasonShutdown] != 1 {
		t.Fatalf("want one cold and one shutdown checkpoint, got %v", files)
	}
	// Restart: the same request loads the cold checkpoint and prefills only
	// the rest of the prompt.
	var logs syncBuf
	b := kvEnv(t, dir, &logs, nil)
	m = b.postJSON("/v1/chat/completions", body)
	cached := num(dig(m, "usage", "prompt_tokens_details", "cached_tokens"))
	prefilled := b.eng.Prefilled.Load() - int64(num(dig(m, "usage", "completion_tokens")))
	if b.eng.Loaded.Load() == 0 || cached < prompt-64-8 || prefilled > int64(prompt-cached+1) {
		t.Fatalf("after restart: loaded %d, cached %d of %d, prefilled %d", b.eng.Loaded.Load(), cached, prompt, prefilled)
	}
	if !strings.Contains(logs.String(), "kv cache: hit") {
		t.Fatalf("no hit logged: %s", logs.String())
	}
	if got := dig(m, "choices", 0, "message", "content"); !strings.Contains(got.(string), "You said") {
		t.Fatalf("reply %v", got)
	}
	// The hit was counted in the file.
	b.stop()
	hits := 0
	for _, f := range cacheFiles(t, dir) {
		hits += int(f.Header.Hits)
	}
	if hits != 1 {
		t.Fatalf("hit counts sum to %d, want 1", hits)
	}
}

func TestKVDiskEvictAndSwitchBack(t *testing.T) {
	dir := t.TempDir()
	e := kvEnv(t, dir, nil, func(c *KVCacheConfig) { c.ColdMaxTokens = 0 })
	ua := longUser("conversation A", 400)
	m := e.postJSON("/v1/chat/completions", chatBody(ua))
	replyA := dig(m, "choices", 0, "message", "content").(string)
	e.postJSON("/v1/chat/completions", chatBody(longUser("conversation B is different", 400)))
	files := cacheFiles(t, dir)
	if len(files) != 1 || files[0].Header.Reason != kvdisk.ReasonEvict {
		t.Fatalf("want one evict checkpoint of conversation A, got %+v", files)
	}
	// The client of conversation A sends its next turn: the checkpoint
	// (prompt + reply) is a prefix of it.
	before := e.eng.Prefilled.Load()
	m = e.postJSON("/v1/chat/completions", chatBody(ua, map[string]any{"role": "assistant", "content": replyA}, user("and then?")))
	prompt := num(dig(m, "usage", "prompt_tokens"))
	cached := num(dig(m, "usage", "prompt_tokens_details", "cached_tokens"))
	prefilled := e.eng.Prefilled.Load() - before - int64(num(dig(m, "usage", "completion_tokens")))
	if cached < 400 || prefilled > int64(prompt-cached) || e.eng.Loaded.Load() == 0 {
		t.Fatalf("switching back: cached %d, prefilled %d of %d tokens", cached, prefilled, prompt)
	}
	// Switching back evicted B in turn.
	if n := len(cacheFiles(t, dir)); n != 2 {
		t.Fatalf("%d files after switching back", n)
	}
}

func TestKVDiskCorruptFileIgnored(t *testing.T) {
	dir := t.TempDir()
	body := chatBody(longUser("corrupt me", 400))
	a := kvEnv(t, dir, nil, nil)
	a.postJSON("/v1/chat/completions", body)
	a.stop()
	for _, f := range cacheFiles(t, dir) {
		b, _ := os.ReadFile(f.Path)
		b[len(b)-5] ^= 1 // in the payload
		if err := os.WriteFile(f.Path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuf
	b := kvEnv(t, dir, &logs, nil)
	m := b.postJSON("/v1/chat/completions", body)
	if b.eng.Loaded.Load() != 0 || num(dig(m, "usage", "prompt_tokens_details", "cached_tokens")) != 0 {
		t.Fatal("a corrupt checkpoint was loaded")
	}
	if !strings.Contains(logs.String(), "checksum mismatch") {
		t.Fatalf("no log line for the corrupt file: %s", logs.String())
	}
	if got := dig(m, "choices", 0, "message", "content"); !strings.Contains(got.(string), "You said") {
		t.Fatalf("reply %v", got)
	}
}

// rewriteCacheFiles rewrites every cache file of dir (valid checksum) after
// edit changed its header or payload, and returns the store.
func rewriteCacheFiles(t *testing.T, dir string, edit func(h *kvdisk.Header, payload *[]byte)) *kvdisk.Store {
	t.Helper()
	st, err := kvdisk.Open(kvdisk.Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range st.Entries() {
		f, err := st.Load(e)
		if err != nil {
			t.Fatal(err)
		}
		h, payload := f.Header, f.Payload
		edit(&h, &payload)
		if _, err := st.Save(h, f.Text, int64(len(payload)), func(w io.Writer) error { _, err := w.Write(payload); return err }, nil); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

func TestKVDiskRejectedByEngine(t *testing.T) {
	// A file with a valid checksum whose payload the engine refuses (another
	// model): logged, left on disk for the model that wrote it, never tried
	// again by this server; the request prefills normally.
	dir := t.TempDir()
	body := chatBody(longUser("other model", 400))
	a := kvEnv(t, dir, nil, nil)
	a.postJSON("/v1/chat/completions", body)
	a.stop()
	st := rewriteCacheFiles(t, dir, func(h *kvdisk.Header, payload *[]byte) { *payload = []byte("NOPE") })
	var logs syncBuf
	b := kvEnv(t, dir, &logs, nil)
	b.postJSON("/v1/chat/completions", body)
	if b.eng.Loaded.Load() != 0 || strings.Count(logs.String(), "cannot use") != 1 {
		t.Fatalf("loaded %d; log %s", b.eng.Loaded.Load(), logs.String())
	}
	for _, e := range st.Entries() {
		if _, err := os.Stat(e.Path); err != nil {
			t.Errorf("the other model's file was removed: %v", err)
		}
	}
	// After an unrelated request replaced the live session, the same
	// request again does not try the rejected file again.
	b.postJSON("/v1/chat/completions", chatBody(user("something else")))
	b.postJSON("/v1/chat/completions", body)
	if n := strings.Count(logs.String(), "cannot use"); n != 1 || b.eng.Loaded.Load() != 0 {
		t.Errorf("rejected file tried again: %d log lines, %d loads", n, b.eng.Loaded.Load())
	}
}

func TestKVDiskContinuedFrontiers(t *testing.T) {
	dir := t.TempDir()
	e := kvEnv(t, dir, nil, func(c *KVCacheConfig) {
		c.ColdMaxTokens = 0
		c.ContinuedIntervalTokens = 100 // rounded up to the alignment: 128
	})
	m := e.postJSON("/v1/chat/completions", chatBody(longUser("long", 500)))
	prompt := num(dig(m, "usage", "prompt_tokens"))
	var got []int
	for _, f := range cacheFiles(t, dir) {
		if f.Header.Reason != kvdisk.ReasonContinued || f.Header.Tokens%128 != 0 {
			t.Fatalf("unexpected checkpoint %+v", f.Header)
		}
		got = append(got, int(f.Header.Tokens))
	}
	if len(got) != prompt/128 {
		t.Fatalf("prompt of %d tokens: continued checkpoints at %v", prompt, got)
	}
}

func TestKVDiskToolMapSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	call := dsmlBlock(dsmlInvoke("bash", dsmlParam("command", true, "ls")))
	script := func(p string) string {
		if strings.Contains(LastUserText(p), "<tool_result>") {
			return "ok"
		}
		return call
	}
	start := func() *testEnv {
		return newEnv(t, script, func(c *Config, _ *FakeEngine) {
			c.KVCache = DefaultKVCacheConfig()
			c.KVCache.Dir, c.KVCache.MinTokens = dir, 16
		})
	}
	a := start()
	body := map[string]any{"model": AliasChat, "messages": []any{longUser("x", 100)}, "tools": []any{bashTool}}
	m := a.postJSON("/v1/chat/completions", body)
	id := dig(m, "choices", 0, "message", "tool_calls", 0, "id").(string)
	a.stop()
	found := false
	for _, e := range cacheFiles(t, dir) {
		ms, err := kvdisk.ReadToolMap(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, mp := range ms {
			found = found || (mp.ID == id && mp.DSML == call)
		}
	}
	if !found {
		t.Fatal("the shutdown checkpoint has no KTM entry for the call")
	}
	b := start()
	if blk, n, ok := b.s.toolMem.get(id); !ok || blk != call || n != 1 {
		t.Fatalf("restarted server's tool memory: %q %d %v", blk, n, ok)
	}
}

func TestKVDiskContinuedDuringDecode(t *testing.T) {
	dir := t.TempDir()
	e := kvEnv(t, dir, nil, func(c *KVCacheConfig) {
		c.ColdMaxTokens = 0
		c.ContinuedIntervalTokens = 64
	})
	body := chatBody(longUser("echo", 50)) // the fake echoes the user text: the reply crosses frontiers
	body["max_tokens"] = 400
	m := e.postJSON("/v1/chat/completions", body)
	prompt, completion := num(dig(m, "usage", "prompt_tokens")), num(dig(m, "usage", "completion_tokens"))
	beyond := 0
	for _, f := range cacheFiles(t, dir) {
		if f.Header.Reason != kvdisk.ReasonContinued || f.Header.Tokens%64 != 0 {
			t.Fatalf("unexpected checkpoint %+v", f.Header)
		}
		if int(f.Header.Tokens) > prompt {
			beyond++
		}
	}
	// Decoding fed the sampled tokens back one by one: every frontier in
	// (prompt, prompt+completion] got a checkpoint (the last sampled token
	// is not fed back, hence −1).
	if want := (prompt+completion-1)/64 - prompt/64; beyond != want || want == 0 {
		t.Fatalf("prompt %d + completion %d: %d checkpoints during decoding, want %d", prompt, completion, beyond, want)
	}
}

func TestKVDiskRejectDifferentQuant(t *testing.T) {
	dir := t.TempDir()
	body := chatBody(longUser("quant", 400))
	a := kvEnv(t, dir, nil, nil)
	a.postJSON("/v1/chat/completions", body)
	a.stop()
	// Mark every checkpoint as written by a q4 model (the fake reports 0).
	rewriteCacheFiles(t, dir, func(h *kvdisk.Header, _ *[]byte) { h.Quant = 4 })
	for _, strict := range []bool{true, false} {
		b := kvEnv(t, dir, nil, func(c *KVCacheConfig) { c.RejectDifferentQuant = strict })
		b.postJSON("/v1/chat/completions", body)
		if hit := b.eng.Loaded.Load() > 0; hit == strict {
			t.Fatalf("strict=%v: hit=%v", strict, hit)
		}
		b.stop()
	}
}

func TestKVDiskWholePromptCheckpoint(t *testing.T) {
	// With no trim and no alignment the cold checkpoint is the whole
	// prompt: after a restart nothing is prefilled (the restored logits
	// give the first token).
	dir := t.TempDir()
	mod := func(c *KVCacheConfig) { c.BoundaryTrimTokens, c.BoundaryAlignTokens = 0, 0 }
	body := chatBody(longUser("whole", 300))
	a := kvEnv(t, dir, nil, mod)
	m1 := a.postJSON("/v1/chat/completions", body)
	a.stop()
	b := kvEnv(t, dir, nil, mod)
	m2 := b.postJSON("/v1/chat/completions", body)
	prompt, completion := num(dig(m2, "usage", "prompt_tokens")), num(dig(m2, "usage", "completion_tokens"))
	if num(dig(m2, "usage", "prompt_tokens_details", "cached_tokens")) != prompt || b.eng.Loaded.Load() != int64(prompt) {
		t.Fatalf("usage %v, loaded %d", dig(m2, "usage"), b.eng.Loaded.Load())
	}
	// Only the sampled tokens were fed (EOS is not).
	if got := b.eng.Prefilled.Load(); got != int64(completion) {
		t.Fatalf("prefilled %d tokens for %d completion tokens", got, completion)
	}
	if dig(m1, "choices", 0, "message", "content") != dig(m2, "choices", 0, "message", "content") {
		t.Fatal("replies differ")
	}
}
