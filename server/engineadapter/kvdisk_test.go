package engineadapter

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"ds4go/server"
)

// TestDiskCacheRestartRealEngine runs the real forward pass (demo model,
// CPU) through two server lifetimes sharing a cache directory: after the
// restart the prompt's cached prefix is restored instead of prefilled, and
// the greedy reply is the same as the fresh server's (the restored state is
// the state a prefill computes).
func TestDiskCacheRestartRealEngine(t *testing.T) {
	eng := demo(t, 2048)
	dir := t.TempDir()
	kv := server.DefaultKVCacheConfig()
	kv.Dir, kv.MinTokens, kv.BoundaryTrimTokens, kv.BoundaryAlignTokens = dir, 64, 8, 64
	content := "Tell me about caches. " + strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)
	body, _ := json.Marshal(map[string]any{"model": "deepseek-chat", "max_tokens": 6, "temperature": 0,
		"messages": []any{map[string]any{"role": "user", "content": content}}})
	ask := func(kv server.KVCacheConfig) (reply string, prompt, cached float64) {
		post, stop := testServer(t, eng, kv)
		defer stop()
		b := post(string(body))
		var m struct {
			Choices []struct {
				Message struct{ Content string }
			}
			Usage struct {
				PromptTokens        float64 `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens float64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		if json.Unmarshal(b, &m) != nil || len(m.Choices) != 1 {
			t.Fatalf("reply %s", b)
		}
		return m.Choices[0].Message.Content, m.Usage.PromptTokens, m.Usage.PromptTokensDetails.CachedTokens
	}
	r1, p1, c1 := ask(kv)
	if c1 != 0 || p1 < 300 {
		t.Fatalf("fresh server: prompt %v, cached %v", p1, c1)
	}
	files, _ := os.ReadDir(dir)
	if len(files) != 2 { // cold + shutdown
		t.Fatalf("%d cache files after the first lifetime", len(files))
	}
	r2, p2, c2 := ask(kv)
	if p2 != p1 || c2 < p1-64-8 {
		t.Fatalf("after restart: prompt %v, cached %v (want ≥ %v)", p2, c2, p1-72)
	}
	if r1 != r2 {
		t.Fatalf("greedy reply differs after restoring from disk: %q vs %q", r1, r2)
	}
	// Without trim and alignment the checkpoint is the whole prompt: the
	// first token is sampled from the restored logits.
	kv.Dir, kv.BoundaryTrimTokens, kv.BoundaryAlignTokens = t.TempDir(), 0, 0
	if r, _, c := ask(kv); r != r1 || c != 0 {
		t.Fatalf("fresh cache: reply %q, cached %v", r, c)
	}
	if r, p, c := ask(kv); r != r1 || c != p {
		t.Fatalf("whole-prompt checkpoint: reply %q (want %q), cached %v of %v", r, r1, c, p)
	}
}
