package engineadapter

import (
	"encoding/json"
	"strings"
	"testing"

	"ds4go/server"
)

// TestDemoModelServes drives the real engine (synthetic tiny model, CPU
// backend) through the HTTP server: generation, prefix reuse, streaming.
func TestDemoModelServes(t *testing.T) {
	eng := demo(t, 512)
	send, _ := testServer(t, eng, server.KVCacheConfig{})
	post := func(body string) map[string]any {
		b := send(body)
		if strings.Contains(body, `"stream":true`) {
			if !strings.Contains(string(b), "data: [DONE]") {
				t.Fatalf("stream: %s", b)
			}
			return nil
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	body := `{"model":"deepseek-chat","max_tokens":8,"temperature":0,"messages":[{"role":"user","content":"Hello, demo model."}]}`
	m1 := post(body)
	u1 := m1["usage"].(map[string]any)
	if u1["completion_tokens"].(float64) < 1 || u1["prompt_tokens"].(float64) < 5 {
		t.Fatalf("usage: %v", u1)
	}
	// The same request again reuses the whole prompt from the live session
	// and, greedy, gives the same completion.
	m2 := post(body)
	u2 := m2["usage"].(map[string]any)
	if u2["prompt_tokens_details"].(map[string]any)["cached_tokens"] != u2["prompt_tokens"] {
		t.Fatalf("no prefix reuse: %v", u2)
	}
	c1 := m1["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]
	c2 := m2["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]
	if c1 != c2 {
		t.Fatalf("greedy not deterministic across prefix reuse: %q vs %q", c1, c2)
	}
	post(`{"stream":true,"max_tokens":4,"messages":[{"role":"user","content":"Hi"}]}`)
}
