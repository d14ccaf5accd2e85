package engineadapter

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"ds4go/loader"
	"ds4go/server"
	"ds4go/synth"
)

// oneStep serves e's sessions without DecodeGreedy, so the server takes its
// one-token loop (the disk cache's payload methods stay).
type oneStep struct{ *Engine }

func (o oneStep) NewSession() (server.Session, error) {
	s, err := o.Engine.NewSession()
	if err != nil {
		return nil, err
	}
	return struct {
		server.Session
		server.PayloadSession
	}{s, s.(server.PayloadSession)}, nil
}

func (o oneStep) QuantBits() uint8 { return o.Engine.QuantBits() }

// TestGreedyRequestsPipelined: requests whose every token is greedy go
// through the session's DecodeGreedy (server.GreedySession); their replies —
// text, finish reason, usage, prefix reuse of the next request, and the
// continued disk checkpoints written on the way — are those of the
// one-token loop, for chat (to the length limit, to a stop sequence, greedy
// through top_k 1) and raw completions.
func TestGreedyRequestsPipelined(t *testing.T) {
	eng := demo(t, 2048)
	if _, ok := any(&session{}).(server.GreedySession); !ok {
		t.Fatal("the adapter's session is not a server.GreedySession")
	}
	chat := countChat
	run := func(e server.Engine, calls []call, dir string) []map[string]any { return serveCalls(t, e, calls, dir) }
	stop := stopInReply(t, eng)
	calls := []call{
		chat(`,"temperature":0,"max_tokens":40`),
		chat(`,"temperature":0,"max_tokens":40,"stop":[` + string(stop) + `]`),
		chat(`,"temperature":0.8,"top_k":1,"max_tokens":120`),
		{"/v1/completions", `{"model":"deepseek-chat","prompt":"Once upon a time","temperature":0,"max_tokens":30}`},
		chat(`,"temperature":0,"max_tokens":12`),
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	got, want := run(eng, calls, dirA), run(oneStep{eng}, calls, dirB)
	for i := range calls {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("request %d (%s):\n DecodeGreedy: %v\n one step:     %v", i, calls[i].body, got[i], want[i])
		}
	}
	if fr := got[1]["choices"].([]any)[0].(map[string]any)["finish_reason"]; fr != "stop" {
		t.Errorf("the stop sequence %s did not stop the reply: %v", stop, fr)
	}
	fa, _ := os.ReadDir(dirA)
	fb, _ := os.ReadDir(dirB)
	if len(fa) != len(fb) || len(fb) < 3 {
		t.Errorf("disk checkpoints: %d with DecodeGreedy, %d with one step (want the same, at least 3)", len(fa), len(fb))
	}
}

// countChat is a chat request of one user message with the extra JSON
// members extra (",\"temperature\":0,…").
func countChat(extra string) call {
	return call{"/v1/chat/completions", `{"model":"deepseek-chat","messages":[{"role":"user","content":"Count with me, demo model."}]` + extra + `}`}
}

// stopInReply returns, JSON-quoted, a stop sequence from inside the greedy
// reply of e to countChat (characters 8–10 of its 40 tokens), which that
// request with the sequence as a stop then ends at.
func stopInReply(t *testing.T, e server.Engine) []byte {
	t.Helper()
	first := serveCalls(t, e, []call{countChat(`,"temperature":0,"max_tokens":40`)}, "")
	content, _ := first[0]["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	r := []rune(content)
	if len(r) < 12 {
		t.Fatalf("first reply too short for a stop sequence: %q", content)
	}
	stop, _ := json.Marshal(string(r[8:11]))
	return stop
}

// call is one request to the server: its path and JSON body.
type call struct{ path, body string }

// serveCalls runs calls in turn on a fresh server over e (with a disk KV
// cache in dir, checkpoints every 48 tokens, when dir is set) and returns
// the replies, less their ids and times.
func serveCalls(t *testing.T, e server.Engine, calls []call, dir string, logw ...io.Writer) []map[string]any {
	t.Helper()
	lw := io.Discard
	if len(logw) > 0 {
		lw = logw[0]
	}
	kv := server.KVCacheConfig{}
	if dir != "" {
		kv = server.DefaultKVCacheConfig()
		kv.Dir, kv.MinTokens, kv.ContinuedIntervalTokens, kv.BoundaryAlignTokens, kv.BoundaryTrimTokens = dir, 32, 48, 0, 0
	}
	srv, err := server.New(server.Config{Engine: e, KVCache: kv, Logger: slog.New(slog.NewTextHandler(lw, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer func() { hs.Close(); srv.Close() }()
	var out []map[string]any
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		var m map[string]any
		if resp.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
			t.Fatalf("%s: %d %s", c.body, resp.StatusCode, b)
		}
		delete(m, "id")
		delete(m, "created")
		out = append(out, m)
	}
	return out
}

// TestSpeculativeRequests: with speculative decoding (engine.Options.Draft,
// ds4-server --mtp-draft 2) greedy requests — to the length limit, to a
// stop sequence, raw completions, a continued conversation — get the
// replies of plain greedy decoding, and sampled requests with a seed those
// of plain sampled decoding (the same draws), and drafts were verified on
// the way (with three drafts a pass too, greedy and sampled);
// each generation's log line counts its drafts (adding up to the
// sessions' counts), a plain server's none.
func TestSpeculativeRequests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Config: synth.DemoConfig(), Seed: 1, MTP: synth.MTPInclude}); err != nil {
		t.Fatal(err)
	}
	open := func(draft bool) *Engine {
		m, err := loader.Open(loader.Options{Path: path, Backend: loader.BackendCPU, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		e, err := New(m, 2048)
		if err != nil {
			t.Fatal(err)
		}
		e.Opts.Draft = draft
		return e
	}
	plain, spec := open(false), open(true)
	chat := countChat
	stop := stopInReply(t, plain)
	calls := []call{
		chat(`,"temperature":0,"max_tokens":40`),
		chat(`,"temperature":0,"max_tokens":40,"stop":[` + string(stop) + `]`),
		{"/v1/completions", `{"model":"deepseek-chat","prompt":"Once upon a time","temperature":0,"max_tokens":30}`},
		chat(`,"temperature":0,"max_tokens":12`),
		chat(`,"temperature":0.9,"seed":7,"max_tokens":40`),
		{"/v1/completions", `{"model":"deepseek-chat","prompt":"Once upon a time","temperature":1.2,"top_p":0.9,"seed":3,"max_tokens":30}`},
	}
	var sessions []*session
	var plainLog, specLog bytes.Buffer
	want, got := serveCalls(t, plain, calls, "", &plainLog), serveCalls(t, recording{spec, &sessions}, calls, "", &specLog)
	for i := range calls {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("request %d (%s):\n speculative: %v\n plain:       %v", i, calls[i].body, got[i], want[i])
		}
	}
	drafted := 0
	for _, x := range sessions {
		drafted += x.s.Stats().Drafted
	}
	if len(sessions) == 0 || drafted == 0 {
		t.Errorf("%d sessions, %d drafts verified", len(sessions), drafted)
	}
	// the sampled requests (the last two) went through the drafting path
	done := regexp.MustCompile(`msg="generation done".*`).FindAllString(specLog.String(), -1)
	for i, line := range done[max(0, len(done)-2):] {
		m := regexp.MustCompile(` drafts=(\d+) .* drafts_checked=(\d+)`).FindStringSubmatch(line)
		if m == nil || m[1]+m[2] == "00" {
			t.Errorf("sampled request %d: no drafts verified or checked: %s", i, line)
		}
	}
	logged := 0
	for _, m := range regexp.MustCompile(`msg="generation done".* drafts=(\d+) `).FindAllStringSubmatch(specLog.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		logged += n
	}
	if logged != drafted || strings.Contains(plainLog.String(), "drafts=") {
		t.Errorf("logged drafts %d, verified %d; plain log with drafts: %v", logged, drafted, strings.Contains(plainLog.String(), "drafts="))
	}
	// With a disk KV cache whose checkpoints every 48 tokens pause a
	// generation (a decode run's pick refuses a token, the checkpoint is
	// written, decoding goes on), the same replies.
	var kvLog bytes.Buffer
	want = serveCalls(t, plain, calls, t.TempDir())
	got = serveCalls(t, spec, calls, t.TempDir(), &kvLog)
	for i := range calls {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("with checkpoints, request %d (%s):\n speculative: %v\n plain:       %v", i, calls[i].body, got[i], want[i])
		}
	}
	if !strings.Contains(kvLog.String(), "reason=continued") {
		t.Errorf("no continued checkpoint written during a generation:\n%s", kvLog.String())
	}
	// Deeper drafts (--mtp-draft 4: three a pass, greedy and, since v73,
	// sampled requests): the same replies.
	deep := open(true)
	deep.Opts.DraftDepth = 3
	var deepSessions []*session
	got = serveCalls(t, recording{deep, &deepSessions}, calls, "")
	want = serveCalls(t, plain, calls, "")
	deepDrafted := 0
	for _, x := range deepSessions {
		deepDrafted += x.s.Stats().Drafted
	}
	for i := range calls {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("three drafts a pass, request %d (%s):\n speculative: %v\n plain:       %v", i, calls[i].body, got[i], want[i])
		}
	}
	if deepDrafted == 0 {
		t.Error("three drafts a pass: nothing drafted")
	}
}

// recording serves e's sessions as they are, keeping them in *ss.
type recording struct {
	*Engine
	ss *[]*session
}

func (r recording) NewSession() (server.Session, error) {
	s, err := r.Engine.NewSession()
	if err == nil {
		*r.ss = append(*r.ss, s.(*session))
	}
	return s, err
}
