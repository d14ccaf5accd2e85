package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"ds4go/chat"
)

const (
	dsmlOpen  = "<" + chat.DSMLToken
	dsmlClose = "</" + chat.DSMLToken
)

// dsmlBlock renders a tool-call block the way the model writes it.
func dsmlBlock(invokes ...string) string {
	return "\n\n" + dsmlOpen + "tool_calls>\n" + strings.Join(invokes, "\n") + "\n" + dsmlClose + "tool_calls>"
}

func dsmlInvoke(name string, params ...string) string {
	return dsmlOpen + "invoke name=\"" + name + "\">\n" + strings.Join(params, "\n") + "\n" + dsmlClose + "invoke>"
}

func dsmlParam(name string, str bool, value string) string {
	s := "false"
	if str {
		s = "true"
	}
	return dsmlOpen + "parameter name=\"" + name + "\" string=\"" + s + "\">" + value + dsmlClose + "parameter>"
}

var bashTool = map[string]any{"type": "function", "function": map[string]any{
	"name": "bash", "description": "Run a shell command.",
	"parameters": json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}},"required":["command"]}`),
}}

var bashCall = dsmlBlock(dsmlInvoke("bash", dsmlParam("command", true, "ls -la"), dsmlParam("timeout", false, "30")))

func TestModelsAndHealth(t *testing.T) {
	e := newEnv(t, nil)
	resp, err := http.Get(e.hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := jsonOf(t, string(b))
	if dig(m, "data", 0, "id") != ModelID || num(dig(m, "data", 0, "context_length")) != 4096 {
		t.Fatalf("models: %s", b)
	}
	if num(dig(m, "data", 0, "top_provider", "max_completion_tokens")) != 4096 {
		t.Fatalf("max_completion_tokens not clamped to the context: %s", b)
	}
	for _, id := range []string{ModelID, AliasChat, AliasReasoner} {
		resp, err := http.Get(e.hs.URL + "/v1/models/" + id)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("model %s: %v %v", id, err, resp.Status)
		}
		resp.Body.Close()
	}
	resp, _ = http.Get(e.hs.URL + "/v1/models/gpt-4")
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || dig(jsonOf(t, string(b)), "error", "code") != "model_not_found" {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, b)
	}
	resp, _ = http.Get(e.hs.URL + "/health")
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || dig(jsonOf(t, string(b)), "status") != "ok" {
		t.Fatalf("health: %s", b)
	}
	resp, _ = http.Get(e.hs.URL + "/nope")
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || dig(jsonOf(t, string(b)), "error", "message") == nil {
		t.Fatalf("404: %s", b)
	}
}

func TestChatCompletion(t *testing.T) {
	e := newEnv(t, thinkReply("Thinking hard.", "Hello!"))
	// Default: thinking.
	m := e.postJSON("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Hi"}}})
	if dig(m, "choices", 0, "message", "content") != "Hello!" || dig(m, "choices", 0, "message", "reasoning_content") != "Thinking hard." {
		t.Fatalf("thinking reply: %v", m)
	}
	if dig(m, "choices", 0, "finish_reason") != "stop" || dig(m, "object") != "chat.completion" || dig(m, "model") != ModelID {
		t.Fatalf("fields: %v", m)
	}
	u := dig(m, "usage").(map[string]any)
	if num(u["completion_tokens"]) == 0 || num(u["total_tokens"]) != num(u["prompt_tokens"])+num(u["completion_tokens"]) ||
		num(dig(u, "completion_tokens_details", "reasoning_tokens")) == 0 {
		t.Fatalf("usage: %v", u)
	}
	// deepseek-chat: no thinking; thinking control overrides the alias.
	for _, tc := range []struct {
		body      map[string]any
		reasoning bool
	}{
		{map[string]any{"model": AliasChat}, false},
		{map[string]any{"model": AliasReasoner}, true},
		{map[string]any{"model": AliasChat, "thinking": map[string]any{"type": "enabled"}}, true},
		{map[string]any{"think": false}, false},
		{map[string]any{"reasoning_effort": "none"}, false},
		{map[string]any{"thinking": map[string]any{"type": "disabled", "budget_tokens": 10}}, false},
	} {
		tc.body["messages"] = []any{map[string]any{"role": "user", "content": "Hi"}}
		m := e.postJSON("/v1/chat/completions", tc.body)
		_, has := dig(m, "choices", 0, "message").(map[string]any)["reasoning_content"]
		if has != tc.reasoning || dig(m, "choices", 0, "message", "content") != "Hello!" {
			t.Fatalf("%v: %v", tc.body, m)
		}
		if tc.body["model"] != nil && dig(m, "model") != tc.body["model"] {
			t.Fatalf("model not echoed: %v", m)
		}
	}
}

func TestChatStream(t *testing.T) {
	e := newEnv(t, thinkReply("Let me think.", "Hello, world!"))
	evs := e.stream("/v1/chat/completions", map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true},
		"messages": []any{map[string]any{"role": "user", "content": "Hi"}}})
	first := jsonOf(t, evs[0].data)
	if dig(first, "choices", 0, "delta", "role") != "assistant" || dig(first, "object") != "chat.completion.chunk" {
		t.Fatalf("first chunk: %s", evs[0].data)
	}
	a := accumulateChat(t, evs)
	if a.content != "Hello, world!" || a.reasoning != "Let me think." || a.finish != "stop" || !a.done {
		t.Fatalf("stream: %+v", a)
	}
	if a.usage == nil || num(a.usage["completion_tokens"]) == 0 {
		t.Fatalf("usage chunk missing: %+v", a)
	}
	// Without include_usage there is no usage chunk.
	evs = e.stream("/v1/chat/completions", map[string]any{"stream": true, "messages": []any{map[string]any{"role": "user", "content": "Hi"}}})
	if a := accumulateChat(t, evs); a.usage != nil || !a.done {
		t.Fatalf("unexpected usage: %+v", a)
	}
}

func TestChatToolCalls(t *testing.T) {
	e := newEnv(t, thinkReply("I should list files.", "Let me look."+bashCall))
	body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "List files"}}, "tools": []any{bashTool}}
	m := e.postJSON("/v1/chat/completions", body)
	msg := dig(m, "choices", 0, "message").(map[string]any)
	if dig(m, "choices", 0, "finish_reason") != "tool_calls" || msg["content"] != "Let me look." {
		t.Fatalf("tool reply: %v", m)
	}
	tc := dig(msg, "tool_calls", 0).(map[string]any)
	id, _ := tc["id"].(string)
	if !strings.HasPrefix(id, "call_") || len(id) != 37 || tc["type"] != "function" ||
		dig(tc, "function", "name") != "bash" || dig(tc, "function", "arguments") != `{"command": "ls -la", "timeout": 30}` {
		t.Fatalf("tool call: %v", tc)
	}
	// Streaming: tool call header first, then argument fragments in order.
	body["stream"] = true
	evs := e.stream("/v1/chat/completions", body)
	a := accumulateChat(t, evs)
	if a.finish != "tool_calls" || a.names[0] != "bash" || a.args[0] != `{"command": "ls -la", "timeout": 30}` ||
		a.content != "Let me look." || !strings.HasPrefix(a.ids[0], "call_") {
		t.Fatalf("stream: %+v", a)
	}
	for _, ev := range evs {
		if strings.Contains(ev.data, "DSML") || strings.Contains(ev.data, "tool_calls>") {
			t.Fatalf("DSML leaked: %s", ev.data)
		}
	}
	// Without tools in the request, DSML is plain text.
	delete(body, "tools")
	delete(body, "stream")
	m = e.postJSON("/v1/chat/completions", body)
	if dig(m, "choices", 0, "finish_reason") != "stop" || !strings.Contains(dig(m, "choices", 0, "message", "content").(string), "invoke") {
		t.Fatalf("no tools: %v", m)
	}
	// tool_choice none disables tools too.
	body["tools"] = []any{bashTool}
	body["tool_choice"] = "none"
	m = e.postJSON("/v1/chat/completions", body)
	if dig(m, "choices", 0, "finish_reason") != "stop" {
		t.Fatalf("tool_choice none: %v", m)
	}
}

func TestCompletions(t *testing.T) {
	e := newEnv(t, func(p string) string {
		if !strings.Contains(p, completionSystem+chat.UserToken+"Once upon") {
			return "bad prompt"
		}
		return "a time</think> there was a fox."
	})
	m := e.postJSON("/v1/completions", map[string]any{"prompt": "Once upon", "max_tokens": 50})
	if dig(m, "object") != "text_completion" || dig(m, "choices", 0, "text") != "a time</think> there was a fox." {
		t.Fatalf("completion: %v", m)
	}
	evs := e.stream("/v1/completions", map[string]any{"prompt": []string{"Once upon"}, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "stop": "fox"})
	var text, finish string
	var usage bool
	for _, ev := range evs {
		if ev.data == "[DONE]" {
			continue
		}
		m := jsonOf(t, ev.data)
		if dig(m, "usage") != nil {
			usage = true
		}
		if s, ok := dig(m, "choices", 0, "text").(string); ok {
			text += s
		}
		if f, ok := dig(m, "choices", 0, "finish_reason").(string); ok {
			finish = f
		}
	}
	if text != "a time</think> there was a " || finish != "stop" || !usage {
		t.Fatalf("stream: %q %q %v", text, finish, usage)
	}
}

func TestResponses(t *testing.T) {
	e := newEnv(t, thinkReply("Plan the answer.", "Answer text."))
	m := e.postJSON("/v1/responses", map[string]any{"input": "Hi", "instructions": "Be brief.", "reasoning": map[string]any{"summary": "auto"}})
	if dig(m, "object") != "response" || dig(m, "status") != "completed" {
		t.Fatalf("response: %v", m)
	}
	if dig(m, "output", 0, "type") != "reasoning" || dig(m, "output", 0, "summary", 0, "text") != "Plan the answer." ||
		dig(m, "output", 1, "type") != "message" || dig(m, "output", 1, "content", 0, "text") != "Answer text." {
		t.Fatalf("output: %v", m)
	}
	if num(dig(m, "usage", "output_tokens")) == 0 || dig(m, "usage", "input_tokens_details", "cached_tokens") == nil {
		t.Fatalf("usage: %v", m)
	}
	// Without a summary request, no reasoning item.
	m = e.postJSON("/v1/responses", map[string]any{"input": "Hi"})
	if dig(m, "output", 0, "type") != "message" {
		t.Fatalf("reasoning leaked: %v", m)
	}
	// Streaming lifecycle with sequence numbers.
	evs := e.stream("/v1/responses", map[string]any{"input": []any{map[string]any{"role": "user", "content": "Hi"}}, "stream": true,
		"reasoning": map[string]any{"effort": "high", "summary": "detailed"}})
	var types []string
	var text, rs string
	for i, ev := range evs {
		m := jsonOf(t, ev.data)
		if num(m["sequence_number"]) != i || m["type"] != ev.name {
			t.Fatalf("event %d: %s %s", i, ev.name, ev.data)
		}
		types = append(types, ev.name)
		switch ev.name {
		case "response.output_text.delta":
			text += m["delta"].(string)
		case "response.reasoning_summary_text.delta":
			rs += m["delta"].(string)
		}
	}
	want := "response.created response.in_progress response.output_item.added response.reasoning_summary_part.added"
	if !strings.HasPrefix(strings.Join(types, " "), want) || types[len(types)-1] != "response.completed" {
		t.Fatalf("events: %v", types)
	}
	if text != "Answer text." || rs != "Plan the answer." {
		t.Fatalf("deltas %q %q", text, rs)
	}
	final := jsonOf(t, evs[len(evs)-1].data)
	if dig(final, "response", "output", 1, "content", 0, "text") != "Answer text." || dig(final, "response", "usage", "total_tokens") == nil {
		t.Fatalf("final: %s", evs[len(evs)-1].data)
	}
}

func TestResponsesToolCalls(t *testing.T) {
	e := newEnv(t, func(string) string { return "Running it." + bashCall })
	tool := map[string]any{"type": "function", "name": "bash", "description": "Run.",
		"parameters": json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"integer"}}}`)}
	body := map[string]any{"model": AliasChat, "input": "list", "tools": []any{tool}, "stream": true}
	evs := e.stream("/v1/responses", body)
	var args string
	var added, done map[string]any
	for _, ev := range evs {
		m := jsonOf(t, ev.data)
		switch ev.name {
		case "response.output_item.added":
			if dig(m, "item", "type") == "function_call" {
				added = m
			}
		case "response.function_call_arguments.delta":
			args += m["delta"].(string)
		case "response.output_item.done":
			if dig(m, "item", "type") == "function_call" {
				done = m
			}
		}
	}
	if added == nil || dig(added, "item", "status") != "in_progress" || dig(added, "item", "arguments") != "" {
		t.Fatalf("added: %v", added)
	}
	if args != `{"command": "ls -la", "timeout": 30}` || dig(done, "item", "arguments") != args ||
		dig(done, "item", "name") != "bash" || !strings.HasPrefix(dig(done, "item", "call_id").(string), "call_") {
		t.Fatalf("done: %v args %q", done, args)
	}
	final := jsonOf(t, evs[len(evs)-1].data)
	if evs[len(evs)-1].name != "response.completed" || dig(final, "response", "output", 1, "type") != "function_call" {
		t.Fatalf("final: %s", evs[len(evs)-1].data)
	}
	delete(body, "stream")
	m := e.postJSON("/v1/responses", body)
	if dig(m, "output", 1, "type") != "function_call" || dig(m, "output", 1, "arguments") != `{"command": "ls -la", "timeout": 30}` {
		t.Fatalf("non-stream: %v", m)
	}
	// Forced tool choice is refused, not ignored.
	body["tool_choice"] = "required"
	if resp, out := e.post("/v1/responses", body); resp.StatusCode != 400 || !strings.Contains(string(out), "tool_choice") {
		t.Fatalf("tool_choice required: %d %s", resp.StatusCode, out)
	}
}

func TestMessages(t *testing.T) {
	e := newEnv(t, thinkReply("Consider.", "Sure."+dsmlBlock(dsmlInvoke("read", dsmlParam("path", true, "/etc/hosts")))))
	tool := map[string]any{"name": "read", "description": "Read a file.",
		"input_schema": json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)}
	body := map[string]any{"model": "claude-sonnet-4", "max_tokens": 200, "system": "Be helpful.",
		"messages": []any{map[string]any{"role": "user", "content": "read hosts"}}, "tools": []any{tool}}
	m := e.postJSON("/v1/messages", body)
	if dig(m, "type") != "message" || dig(m, "stop_reason") != "tool_use" || dig(m, "model") != "claude-sonnet-4" {
		t.Fatalf("message: %v", m)
	}
	if dig(m, "content", 0, "type") != "thinking" || dig(m, "content", 0, "thinking") != "Consider." ||
		dig(m, "content", 1, "text") != "Sure." || dig(m, "content", 2, "type") != "tool_use" ||
		dig(m, "content", 2, "input", "path") != "/etc/hosts" || !strings.HasPrefix(dig(m, "content", 2, "id").(string), "toolu_") {
		t.Fatalf("content: %v", m)
	}
	u := dig(m, "usage").(map[string]any)
	if num(u["output_tokens"]) == 0 || u["cache_read_input_tokens"] == nil || u["cache_creation_input_tokens"] == nil {
		t.Fatalf("usage: %v", u)
	}
	body["stream"] = true
	evs := e.stream("/v1/messages", body)
	var names []string
	var partial, thinking, text string
	for _, ev := range evs {
		names = append(names, ev.name)
		m := jsonOf(t, ev.data)
		if m["type"] != ev.name {
			t.Fatalf("type mismatch %s %s", ev.name, ev.data)
		}
		switch dig(m, "delta", "type") {
		case "input_json_delta":
			partial += dig(m, "delta", "partial_json").(string)
		case "thinking_delta":
			thinking += dig(m, "delta", "thinking").(string)
		case "text_delta":
			text += dig(m, "delta", "text").(string)
		}
	}
	if names[0] != "message_start" || names[len(names)-1] != "message_stop" || names[len(names)-2] != "message_delta" {
		t.Fatalf("events: %v", names)
	}
	if partial != `{"path": "/etc/hosts"}` || thinking != "Consider." || text != "Sure." {
		t.Fatalf("deltas %q %q %q", partial, thinking, text)
	}
	md := jsonOf(t, evs[len(evs)-2].data)
	if dig(md, "delta", "stop_reason") != "tool_use" || num(dig(md, "usage", "output_tokens")) == 0 {
		t.Fatalf("message_delta: %v", md)
	}
	// Only thinking, no text: an empty text block follows (ds4).
	e2 := newEnv(t, thinkReply("Only thoughts.", ""))
	m = e2.postJSON("/v1/messages", map[string]any{"max_tokens": 10, "messages": []any{map[string]any{"role": "user", "content": "x"}}})
	if dig(m, "content", 1, "type") != "text" || dig(m, "content", 1, "text") != "" {
		t.Fatalf("empty text block: %v", m)
	}
}

func TestCountTokens(t *testing.T) {
	e := newEnv(t, nil)
	m := e.postJSON("/v1/messages/count_tokens", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hello world"}}})
	if num(m["input_tokens"]) < 4 {
		t.Fatalf("count: %v", m)
	}
}
