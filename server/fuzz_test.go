package server

import (
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

var (
	fuzzOnce sync.Once
	fuzzSrv  *Server
)

// fuzzServer is a server whose prepare step (validation, replay, render,
// tokenize) the fuzzers drive; nothing is generated.
func fuzzServer(t testing.TB) *Server {
	fuzzOnce.Do(func() {
		eng := &FakeEngine{Tok: testTokenizer(t), Ctx: 1 << 20}
		s, err := New(Config{Engine: eng, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		fuzzSrv = s
	})
	return fuzzSrv
}

// fuzzParse checks a parser on arbitrary bodies: no panic, errors are
// 4xx, and an accepted request renders to a prompt its tokens decode to.
func fuzzParse(t *testing.T, body []byte, parse func([]byte, int) (*genRequest, *apiError)) {
	s := fuzzServer(t)
	r, e := parse(body, s.ctxSize)
	if e != nil {
		if e.status < 400 || e.status >= 500 || e.msg == "" {
			t.Fatalf("bad error %+v", e)
		}
		return
	}
	if e := s.prepare(r); e != nil {
		if e.status < 400 || e.status >= 500 {
			t.Fatalf("bad prepare error %+v", e)
		}
		return
	}
	if !strings.HasPrefix(r.promptText, "<｜begin▁of▁sentence｜>") {
		t.Fatalf("prompt without BOS: %q", r.promptText)
	}
	if b, err := s.tok.Decode(r.promptTokens); err != nil || string(b) != r.promptText {
		t.Fatalf("tokens do not decode to the prompt")
	}
	_ = errorBody(r.api, badRequest("x"))
}

var chatSeeds = []string{
	`{"model":"deepseek-chat","messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":[1,2]}"}}]},{"role":"tool","tool_call_id":"call_1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"stream":true,"stream_options":{"include_usage":true},"stop":["x"],"max_tokens":5,"temperature":0.5,"reasoning_effort":"max"}`,
	`{"messages":[],"thinking":{"type":"disabled"},"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}}}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"x":1}}}]}]}`,
}

func FuzzChatRequest(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { fuzzParse(t, body, parseChatRequest) })
}

func FuzzCompletionRequest(f *testing.F) {
	f.Add([]byte(`{"prompt":"Once upon","max_tokens":5,"stop":"x","stream":true}`))
	f.Add([]byte(`{"prompt":["a"],"think":false,"seed":3}`))
	f.Fuzz(func(t *testing.T, body []byte) { fuzzParse(t, body, parseCompletionRequest) })
}

func FuzzMessagesRequest(f *testing.F) {
	f.Add([]byte(`{"model":"claude","max_tokens":10,"system":[{"type":"text","text":"x-anthropic-billing"},{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"max_tokens":10,"messages":[{"role":"user","content":"q"},{"content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"a"},{"type":"tool_use","id":"toolu_1","name":"f","input":{"b":1}}],"role":"assistant"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"r"}]},{"type":"text","text":"more"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"thinking":{"type":"enabled","budget_tokens":100},"stop_sequences":["z"]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_x","content":"r"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) { fuzzParse(t, body, parseMessagesRequest) })
}

func FuzzResponsesRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi","instructions":"be","reasoning":{"effort":"high","summary":"auto"},"include":["reasoning.encrypted_content"]}`))
	f.Add([]byte(`{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}],"encrypted_content":"ds4go1:dGhpbms="},{"type":"function_call","call_id":"c1","name":"f","namespace":"ns__","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"o"},{"type":"tool_search_output","call_id":"c2","tools":[{"type":"function","name":"g"}]}],"tools":[{"type":"function","name":"f"},{"type":"namespace","name":"ns__","tools":[{"type":"function","name":"f"}]},{"type":"tool_search"}],"tool_choice":"auto","max_output_tokens":9}`))
	f.Add([]byte(`{"input":[{"type":"function_call_output","call_id":"nope","output":"o"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) { fuzzParse(t, body, parseResponsesRequest) })
}

// FuzzStopFilter: whatever the split, the emitted text is the input up to
// the first stop sequence (or all of it), and nothing past a match.
func FuzzStopFilter(f *testing.F) {
	f.Add("hello world END tail", "END", "wor", 3)
	f.Add("aaaaab", "aab", "", 1)
	f.Add("ééé stop", "é s", "op", 2)
	f.Fuzz(func(t *testing.T, text, s1, s2 string, step int) {
		if step <= 0 || step > 64 {
			step = 1 + (step&63+64)%64
		}
		stops, _ := parseStop([]byte(`[`+jsonString(s1)+`,`+jsonString(s2)+`]`), "stop")
		want := text
		hit := false
		best := -1
		for _, st := range stops {
			if i := strings.Index(text, st); i >= 0 && (best < 0 || i < best) {
				best = i
			}
		}
		if best >= 0 {
			want, hit = text[:best], true
		}
		sf := newStopFilter(stops)
		var got strings.Builder
		done := false
		for i := 0; i < len(text) && !done; i += step {
			out, d := sf.push(text[i:min(i+step, len(text))])
			got.WriteString(out)
			done = d
		}
		if !done {
			got.WriteString(sf.flush())
		}
		if got.String() != want || done != hit {
			t.Fatalf("text %q stops %q step %d: got %q (%v) want %q (%v)", text, stops, step, got.String(), done, want, hit)
		}
	})
}
