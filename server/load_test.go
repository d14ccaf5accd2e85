package server

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLoad is the opt-in load test (DS4_LOADTEST=1): rounds of 50
// concurrent streaming clients on loopback, a third of which disconnect at
// a random point. It reports time-to-first-token percentiles and checks
// that goroutines and heap return to their baseline afterwards.
//
//	DS4_LOADTEST=1 go test ./server -run TestLoad -v
func TestLoad(t *testing.T) {
	if os.Getenv("DS4_LOADTEST") != "1" {
		t.Skip("set DS4_LOADTEST=1 to run the load test")
	}
	const clients, rounds = 50, 3
	reply := strings.Repeat("token ", 60)
	e := newEnv(t, thinkReply("Some reasoning first.", reply), func(c *Config, f *FakeEngine) {
		f.TokenDelay = 200 * time.Microsecond
		f.Ctx = 8192
	})
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	client := &http.Client{Transport: tr}

	baseline := func() (int, uint64) {
		tr.CloseIdleConnections()
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), ms.HeapInuse
	}
	g0, h0 := baseline()
	var ttfts []time.Duration
	var mu sync.Mutex
	var dropped, completed, failed int
	start := time.Now()
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		for i := 0; i < clients; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
				dropAfter := -1
				if rng.IntN(3) == 0 {
					dropAfter = rng.IntN(40)
				}
				body := fmt.Sprintf(`{"stream":true,"messages":[{"role":"user","content":"client %d round %d: %s"}]}`, i, round, strings.Repeat("x", rng.IntN(200)))
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", e.hs.URL+"/v1/chat/completions", strings.NewReader(body))
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				chunks, first := 0, time.Duration(0)
				ok := false
				for sc.Scan() {
					line := sc.Text()
					if !strings.HasPrefix(line, "data: ") {
						continue
					}
					if first == 0 && (strings.Contains(line, `"reasoning_content"`) || strings.Contains(line, `"content":"t`)) {
						first = time.Since(t0)
					}
					if line == "data: [DONE]" {
						ok = true
						break
					}
					chunks++
					if chunks == dropAfter {
						cancel()
						break
					}
				}
				mu.Lock()
				defer mu.Unlock()
				if first > 0 {
					ttfts = append(ttfts, first)
				}
				switch {
				case ok:
					completed++
				case dropAfter >= 0:
					dropped++
				default:
					failed++
				}
			}(i)
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	waitFor(t, "the scheduler to drain", func() bool { q, _, busy := e.s.sched.status(); return q == 0 && !busy })
	time.Sleep(100 * time.Millisecond)
	g1, h1 := baseline()

	slices.Sort(ttfts)
	pct := func(p float64) time.Duration { return ttfts[min(len(ttfts)-1, int(p*float64(len(ttfts))))] }
	t.Logf("%d rounds x %d streaming clients in %v: %d completed, %d disconnected on purpose, %d failed",
		rounds, clients, elapsed.Round(time.Millisecond), completed, dropped, failed)
	t.Logf("TTFT over %d clients: p50 %v  p90 %v  p99 %v  max %v", len(ttfts), pct(0.5).Round(time.Microsecond),
		pct(0.9).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), ttfts[len(ttfts)-1].Round(time.Microsecond))
	t.Logf("goroutines %d -> %d, heap in use %.1f MiB -> %.1f MiB, tokens generated %d",
		g0, g1, float64(h0)/(1<<20), float64(h1)/(1<<20), e.eng.Prefilled.Load())
	if failed > 0 {
		t.Fatalf("%d clients failed", failed)
	}
	if g1 > g0+5 {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("goroutine leak: %d -> %d\n%s", g0, g1, buf[:n])
	}
	if h1 > h0+32<<20 {
		t.Fatalf("heap grew from %d to %d bytes", h0, h1)
	}
}

// TestWarmupBeforeServing: Config.Warmup prefills that many tokens into the
// session before New returns and rewinds it, so the first request starts
// from an empty session (its prompt counted in full) and gets its answer.
func TestWarmupBeforeServing(t *testing.T) {
	e := newEnv(t, thinkReply("r", "ok"), func(c *Config, _ *FakeEngine) { c.Warmup = 40 })
	if got := e.eng.Prefilled.Load(); got != 40 {
		t.Fatalf("prefilled %d tokens at start, want the warm-up's 40", got)
	}
	resp := e.postJSON("/v1/chat/completions", map[string]any{
		"model": "x", "messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 5})
	if c := dig(resp, "choices", 0, "message", "content"); c != "ok" {
		t.Fatalf("first request after the warm-up: content %v (%v)", c, resp)
	}
	prompt := num(dig(resp, "usage", "prompt_tokens"))
	if cached := num(dig(resp, "usage", "prompt_tokens_details", "cached_tokens")); prompt == 0 || cached != 0 {
		t.Fatalf("usage after the warm-up: %d prompt tokens, %d cached (want none cached)", prompt, cached)
	}
}
