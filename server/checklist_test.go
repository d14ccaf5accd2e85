package server

// Tests named after the behaviours ds4-server is unit-tested for
// (shared/reference/server-behaviours.md), over HTTP where possible.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"ds4go/chat"
)

// rendered parses and prepares a request body and returns its prompt.
func (e *testEnv) rendered(api apiKind, body any) (*genRequest, *apiError) {
	e.t.Helper()
	b, _ := json.Marshal(body)
	var r *genRequest
	var ae *apiError
	switch api {
	case apiChat:
		r, ae = parseChatRequest(b, e.s.ctxSize)
	case apiMessages:
		r, ae = parseMessagesRequest(b, e.s.ctxSize)
	case apiResponses:
		r, ae = parseResponsesRequest(b, e.s.ctxSize)
	case apiCompletions:
		r, ae = parseCompletionRequest(b, e.s.ctxSize)
	}
	if ae != nil {
		return nil, ae
	}
	return r, e.s.prepare(r)
}

func user(s string) map[string]any { return map[string]any{"role": "user", "content": s} }

func TestThinkMaxPrefixAndNonThinkingClose(t *testing.T) {
	big := newEnv(t, nil, func(_ *Config, f *FakeEngine) { f.Ctx = chat.ThinkMaxMinContext })
	r, e := big.rendered(apiChat, map[string]any{"reasoning_effort": "max", "messages": []any{user("x")}})
	if e != nil || !strings.HasPrefix(r.promptText, chat.BOS+chat.ReasoningEffortMaxPrefix) || !strings.HasSuffix(r.promptText, chat.ThinkStart) {
		t.Fatalf("think-max: %v %q", e, r.promptText)
	}
	// Anthropic output_config.effort=max too; below 384K it is plain thinking.
	r, _ = big.rendered(apiMessages, map[string]any{"output_config": map[string]any{"effort": "max"}, "messages": []any{user("x")}})
	if !strings.Contains(r.promptText, chat.ReasoningEffortMaxPrefix) {
		t.Fatal("output_config.effort max ignored")
	}
	small := newEnv(t, nil)
	r, _ = small.rendered(apiChat, map[string]any{"reasoning_effort": "max", "messages": []any{user("x")}})
	if strings.Contains(r.promptText, chat.ReasoningEffortMaxPrefix) || r.mode != chat.ModeThinking {
		t.Fatalf("think-max below 384K: %q", r.promptText)
	}
	// xhigh is normal thinking, never Think-Max.
	r, _ = big.rendered(apiChat, map[string]any{"reasoning_effort": "xhigh", "messages": []any{user("x")}})
	if r.mode != chat.ModeThinking {
		t.Fatalf("xhigh: %v", r.mode)
	}
	r, _ = small.rendered(apiChat, map[string]any{"model": AliasChat, "messages": []any{user("x")}})
	if !strings.HasSuffix(r.promptText, chat.AssistantToken+chat.ThinkEnd) {
		t.Fatalf("non-thinking prompt: %q", r.promptText)
	}
}

func TestReasoningDroppedWithoutToolsKeptWithTools(t *testing.T) {
	e := newEnv(t, nil)
	hist := []any{user("a"), map[string]any{"role": "assistant", "content": "A", "reasoning_content": "secret-thought"}, user("b")}
	r, _ := e.rendered(apiChat, map[string]any{"messages": hist})
	if strings.Contains(r.promptText, "secret-thought") {
		t.Fatal("old reasoning kept without tools")
	}
	r, _ = e.rendered(apiChat, map[string]any{"messages": hist, "tools": []any{bashTool}})
	if !strings.Contains(r.promptText, "secret-thought"+chat.ThinkEnd+"A") {
		t.Fatalf("reasoning dropped with tools: %q", r.promptText)
	}
	// ds4: a history with tool calls keeps reasoning even without schemas.
	hist2 := []any{user("a"), map[string]any{"role": "assistant", "content": "", "reasoning_content": "secret-thought",
		"tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "bash", "arguments": `{"command":"ls"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "ok"}}
	r, _ = e.rendered(apiChat, map[string]any{"messages": hist2})
	if !strings.Contains(r.promptText, "secret-thought") {
		t.Fatal("reasoning dropped in a tool history")
	}
}

func TestToolSchemaPropertyOrderIsClients(t *testing.T) {
	e := newEnv(t, nil)
	props := `{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"},"mid":{"type":"boolean"}}}`
	want := `"properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}, "mid": {"type": "boolean"}}`
	openaiTool := map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": json.RawMessage(props)}}
	anthTool := map[string]any{"name": "f", "input_schema": json.RawMessage(props)}
	respTool := map[string]any{"type": "function", "name": "f", "parameters": json.RawMessage(props)}
	for _, tc := range []struct {
		api  apiKind
		body map[string]any
	}{
		{apiChat, map[string]any{"messages": []any{user("x")}, "tools": []any{openaiTool}}},
		{apiMessages, map[string]any{"messages": []any{user("x")}, "tools": []any{anthTool}}},
		{apiResponses, map[string]any{"input": "x", "tools": []any{respTool}}},
	} {
		r, err := e.rendered(tc.api, tc.body)
		if err != nil || !strings.Contains(r.promptText, want) || !strings.Contains(r.promptText, `{"name": "f", "parameters"`) {
			t.Fatalf("%v: %v\n%s", tc.api, err, r.promptText)
		}
	}
}

func TestDSMLPromptEscapesToolSuppliedText(t *testing.T) {
	e := newEnv(t, nil)
	hist := []any{user("run"),
		map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "write", "arguments": `{"text":"a</｜DSML｜parameter>b","n":["</｜DSML｜parameter>"]}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "x</tool_result>y"}}
	r, err := e.rendered(apiChat, map[string]any{"messages": hist, "tools": []any{bashTool}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"x&lt;/tool_result>y", "a&lt;/｜DSML｜parameter>b", `["\u003c/｜DSML｜parameter>"]`} {
		if !strings.Contains(r.promptText, want) {
			t.Fatalf("missing %q in %q", want, r.promptText)
		}
	}
}

func TestRequestDefaultsAndEffortMapping(t *testing.T) {
	e := newEnv(t, nil)
	r, _ := e.rendered(apiChat, map[string]any{"messages": []any{user("x")}})
	if r.sampling != DefaultSampling() || r.sampling.MinP != 0.05 || r.mode != chat.ModeThinking {
		t.Fatalf("defaults: %+v %v", r.sampling, r.mode)
	}
	for name, want := range map[string]effort{"max": effMax, "xhigh": effHigh, "high": effHigh, "medium": effHigh,
		"low": effHigh, "minimal": effHigh, "none": effNone} {
		if got, ok := parseEffort(name); !ok || got != want {
			t.Fatalf("%s: %v", name, got)
		}
	}
	if _, ok := parseEffort("extreme"); ok {
		t.Fatal("unknown effort accepted")
	}
	// Client sampling is honoured without thinking, ignored with it.
	r, _ = e.rendered(apiChat, map[string]any{"model": AliasChat, "temperature": 0.2, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "messages": []any{user("x")}})
	if r.sampling != (SamplingParams{Temperature: 0.2, TopP: 0.9, TopK: 5, MinP: 0.1}) {
		t.Fatalf("sampling: %+v", r.sampling)
	}
	r, _ = e.rendered(apiChat, map[string]any{"temperature": 0.2, "messages": []any{user("x")}})
	if r.sampling != DefaultSampling() {
		t.Fatalf("thinking sampling: %+v", r.sampling)
	}
	// Responses: reasoning.effort none disables thinking; summary alone does not.
	r, _ = e.rendered(apiResponses, map[string]any{"input": "x", "reasoning": map[string]any{"effort": "none"}})
	if r.mode != chat.ModeChat {
		t.Fatal("responses effort none")
	}
	r, _ = e.rendered(apiResponses, map[string]any{"model": AliasChat, "input": "x", "reasoning": map[string]any{"summary": "auto"}})
	if r.mode != chat.ModeChat || !r.summary {
		t.Fatal("responses summary alone changed the mode")
	}
}

func TestThinkingDSMLNotExecutableBeforeThinkClose(t *testing.T) {
	inThink := "I might call " + dsmlBlock(dsmlInvoke("bash", dsmlParam("command", true, "rm -rf /"))) + " but no." + chat.ThinkEnd + "Done."
	e := newEnv(t, func(string) string { return inThink })
	m := e.postJSON("/v1/chat/completions", map[string]any{"messages": []any{user("x")}, "tools": []any{bashTool}})
	if dig(m, "choices", 0, "finish_reason") != "stop" || dig(m, "choices", 0, "message", "tool_calls") != nil ||
		!strings.Contains(dig(m, "choices", 0, "message", "reasoning_content").(string), "rm -rf") {
		t.Fatalf("DSML in think executed: %v", m)
	}
	after := "Think." + chat.ThinkEnd + bashCall
	e2 := newEnv(t, func(string) string { return after })
	m = e2.postJSON("/v1/chat/completions", map[string]any{"messages": []any{user("x")}, "tools": []any{bashTool}})
	if dig(m, "choices", 0, "finish_reason") != "tool_calls" {
		t.Fatalf("DSML after think not executed: %v", m)
	}
}

func TestToolArgsPreserveCallOrder(t *testing.T) {
	call := dsmlBlock(dsmlInvoke("f", dsmlParam("zeta", true, "z"), dsmlParam("alpha", false, "1"), dsmlParam("mid", false, `{"b":1,"a":2}`)))
	e := newEnv(t, func(string) string { return call })
	want := `{"zeta": "z", "alpha": 1, "mid": {"b":1,"a":2}}`
	tool := map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}
	m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}, "tools": []any{tool}})
	if got := dig(m, "choices", 0, "message", "tool_calls", 0, "function", "arguments"); got != want {
		t.Fatalf("openai: %v", got)
	}
	resp, out := e.post("/v1/messages", map[string]any{"model": AliasChat, "max_tokens": 100, "messages": []any{user("x")},
		"tools": []any{map[string]any{"name": "f", "input_schema": map[string]any{"type": "object"}}}})
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"input":{"zeta":"z","alpha":1,"mid":{"b":1,"a":2}}`) {
		t.Fatalf("anthropic: %s", out)
	}
	m = e.postJSON("/v1/responses", map[string]any{"model": AliasChat, "input": "x", "tools": []any{map[string]any{"type": "function", "name": "f"}}})
	if dig(m, "output", 0, "arguments") != want {
		t.Fatalf("responses: %v", m)
	}
}

func TestShortDSMLAndLooseNestedParameters(t *testing.T) {
	short := "\n\n<DSML｜tool_calls>\n<DSML｜invoke name=\"bash\">\n<DSML｜parameter name=\"command\" string=\"true\">pwd</DSML｜parameter>\n</DSML｜invoke>\n</DSML｜tool_calls>"
	nested := dsmlBlock(dsmlInvoke("edit", dsmlOpen+"parameter name=\"opts\">\n"+dsmlParam("a", true, "1")+"\n"+dsmlParam("b", false, "2")+"\n"))
	for _, tc := range []struct{ out, args string }{
		{short, `{"command": "pwd"}`},
		{nested, `{"opts": {"a": "1", "b": 2}}`},
	} {
		e := newEnv(t, func(string) string { return tc.out })
		m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}, "tools": []any{bashTool}})
		if got := dig(m, "choices", 0, "message", "tool_calls", 0, "function", "arguments"); got != tc.args {
			t.Fatalf("%q: %v", tc.out, m)
		}
	}
}

func TestToolParseFailureReturnsRecoverableFinish(t *testing.T) {
	bad := "Try." + "\n\n" + dsmlOpen + "tool_calls>\n" + dsmlOpen + "invoke name=\"bash\">\nstray text\n" + dsmlClose + "invoke>\n" + dsmlClose + "tool_calls>"
	e := newEnv(t, func(string) string { return bad })
	for _, stream := range []bool{false, true} {
		body := map[string]any{"model": AliasChat, "messages": []any{user("x")}, "tools": []any{bashTool}, "stream": stream}
		var content, finish string
		if stream {
			a := accumulateChat(t, e.stream("/v1/chat/completions", body))
			content, finish = a.content, a.finish
		} else {
			m := e.postJSON("/v1/chat/completions", body)
			content, finish = dig(m, "choices", 0, "message", "content").(string), dig(m, "choices", 0, "finish_reason").(string)
		}
		if finish != "stop" || !strings.Contains(content, "stray text") {
			t.Fatalf("stream=%v: %q %q", stream, finish, content)
		}
	}
}

func TestToolSeparatorWhitespaceAndOrphanEnd(t *testing.T) {
	e := newEnv(t, func(string) string { return "Text.  \n\n" + bashCall[2:] })
	m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}, "tools": []any{bashTool}})
	if dig(m, "choices", 0, "message", "content") != "Text." {
		t.Fatalf("separator whitespace became content: %q", dig(m, "choices", 0, "message", "content"))
	}
	e2 := newEnv(t, func(string) string { return "Hello " + dsmlClose + "tool_calls> world" })
	m = e2.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}, "tools": []any{bashTool}})
	if dig(m, "choices", 0, "message", "content") != "Hello  world" || dig(m, "choices", 0, "finish_reason") != "stop" {
		t.Fatalf("orphan end: %v", m)
	}
}

func TestDSMLDecodeStateSeparatesStructureAndPayload(t *testing.T) {
	// Every step also offers a noise token ("Q") almost as likely as the
	// scripted one. Structure is sampled greedily, so the call always
	// parses; the string payload uses the request's sampling and picks up
	// noise.
	tok := testTokenizer(t)
	noise := tok.Encode("Q")
	if len(noise) != 1 {
		t.Fatal("noise token")
	}
	payload := strings.Repeat("abcdefgh ", 6)
	call := dsmlBlock(dsmlInvoke("bash", dsmlParam("command", true, payload), dsmlParam("timeout", false, "[1, 2, 3]")))
	e := newEnv(t, func(string) string { return call }, func(_ *Config, f *FakeEngine) {
		f.NoiseToken, f.NoiseLogit, f.Lenient, f.NoiseAfter, f.NoiseNotAtTags = noise[0], 29.9, true, "tool_calls>", true
	})
	noisy := 0
	for seed := 1; seed <= 6; seed++ {
		m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "seed": seed, "temperature": 1, "min_p": 0,
			"messages": []any{user("x")}, "tools": []any{bashTool}})
		if dig(m, "choices", 0, "finish_reason") != "tool_calls" {
			t.Fatalf("seed %d: structure broken: %v", seed, m)
		}
		var args struct {
			Command string `json:"command"`
			Timeout []int  `json:"timeout"`
		}
		if err := json.Unmarshal([]byte(dig(m, "choices", 0, "message", "tool_calls", 0, "function", "arguments").(string)), &args); err != nil {
			t.Fatal(err)
		}
		if len(args.Timeout) != 3 {
			t.Fatalf("JSON structure not greedy: %+v", args)
		}
		if args.Command != payload {
			noisy++
		}
	}
	if noisy == 0 {
		t.Fatal("payload never used the request's sampling")
	}
}

// toolRoundTrip runs a tool call and returns the assistant message JSON
// and the usage of the call turn.
func TestExactDSMLToolReplay(t *testing.T) {
	// The model writes JSON with spaces and arguments in its own order; the
	// client sends back reordered, minified JSON.
	call := dsmlBlock(dsmlInvoke("bash", dsmlParam("timeout", false, "[ 1,2 ]"), dsmlParam("command", true, "ls")))
	script := func(p string) string {
		if strings.Contains(LastUserText(p), "<tool_result>") {
			return "ok"
		}
		return call
	}
	for _, disabled := range []bool{false, true} {
		e := newEnv(t, script, func(c *Config, _ *FakeEngine) { c.DisableExactReplay = disabled })
		body := map[string]any{"model": AliasChat, "messages": []any{user("x")}, "tools": []any{bashTool}}
		m := e.postJSON("/v1/chat/completions", body)
		tc := dig(m, "choices", 0, "message", "tool_calls", 0).(map[string]any)
		first := num(dig(m, "usage", "total_tokens"))
		reordered := map[string]any{"id": tc["id"], "type": "function", "function": map[string]any{"name": "bash", "arguments": `{"command":"ls","timeout":[1,2]}`}}
		body["messages"] = []any{user("x"), map[string]any{"role": "assistant", "content": "", "tool_calls": []any{reordered}},
			map[string]any{"role": "tool", "tool_call_id": tc["id"], "content": "out"}}
		r, _ := e.rendered(apiChat, body)
		if got := strings.Contains(r.promptText, call); got == disabled {
			t.Fatalf("disabled=%v: exact block in prompt = %v", disabled, got)
		}
		m = e.postJSON("/v1/chat/completions", body)
		cached := num(dig(m, "usage", "prompt_tokens_details", "cached_tokens"))
		if !disabled && cached < first {
			t.Fatalf("exact replay: cached %d < %d", cached, first)
		}
		if disabled && cached >= first {
			t.Fatalf("canonical replay should diverge: cached %d >= %d", cached, first)
		}
	}
}

func TestToolMemoryMaxIDsPrunesOldest(t *testing.T) {
	m := newToolMemory(2, 0, false)
	m.put("call_a", "A", 1)
	m.put("call_b", "B", 1)
	m.put("call_c", "C", 1)
	if _, _, ok := m.get("call_a"); ok || m.len() != 2 {
		t.Fatal("oldest id not pruned")
	}
	if b, _, ok := m.get("call_c"); !ok || b != "C" {
		t.Fatal("newest id lost")
	}
	msgs := []chat.Message{{Role: chat.RoleAssistant, ToolCalls: []chat.ToolCall{{ID: "call_a", Name: "x", Arguments: "{}"}}}}
	if ex, canon := attachToolMemory(m, msgs); ex != 0 || canon != 1 || msgs[0].RawToolCalls != "" {
		t.Fatal("pruned id replayed")
	}
	// A turn is replayed exactly only if all its ids map to one block with
	// that many calls.
	m.put("call_x", "XY", 2)
	m.put("call_y", "XY", 2)
	two := []chat.Message{{Role: chat.RoleAssistant, ToolCalls: []chat.ToolCall{{ID: "call_x"}, {ID: "call_y"}}}}
	one := []chat.Message{{Role: chat.RoleAssistant, ToolCalls: []chat.ToolCall{{ID: "call_x"}}}}
	attachToolMemory(m, two)
	attachToolMemory(m, one)
	if two[0].RawToolCalls != "XY" || one[0].RawToolCalls != "" {
		t.Fatalf("block matching: %q %q", two[0].RawToolCalls, one[0].RawToolCalls)
	}
	d := newToolMemory(10, 0, true)
	d.put("call_a", "A", 1)
	if _, _, ok := d.get("call_a"); ok {
		t.Fatal("disabled memory stored")
	}
}

func TestCanonicalSuffixEqualsNextPrompt(t *testing.T) {
	// The live tail appended for tool results is exactly what a full
	// replay renders after the tool-call turn.
	e := newEnv(t, nil)
	calls := []chat.ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"command":"a"}`}, {ID: "call_2", Name: "bash", Arguments: `{"command":"b"}`}}
	for _, mode := range []chat.Mode{chat.ModeChat, chat.ModeThinking} {
		base := []chat.Message{{Role: chat.RoleUser, Content: "go"}, {Role: chat.RoleAssistant, Reasoning: "r", ToolCalls: calls}}
		results := []chat.Message{{Role: chat.RoleTool, ToolCallID: "call_2", Content: "B</tool_result>"}, {Role: chat.RoleTool, ToolCallID: "call_1", Content: "A"}, {Role: chat.RoleUser, Content: "and?"}}
		r := &genRequest{api: apiResponses, mode: mode, conv: chat.Conversation{Messages: append(append([]chat.Message{}, base...), results...)}}
		full, err := renderPrompt(r, e.s.ctxSize)
		if err != nil {
			t.Fatal(err)
		}
		partial := append([]chat.Message{}, base...)
		partial[1].Partial = true
		prefix, _ := renderPrompt(&genRequest{mode: mode, conv: chat.Conversation{Messages: partial}}, e.s.ctxSize)
		tail, ids := liveTail(r, &liveFrontier{api: apiResponses, ids: []string{"call_1", "call_2"}})
		if prefix+tail != full || len(ids) != 2 {
			t.Fatalf("mode %v:\nprefix+tail %q\nfull        %q", mode, prefix+tail, full)
		}
	}
}

func TestAnthropicToolResultsLiveTailAndValidation(t *testing.T) {
	e := newEnv(t, agentScript)
	tools := []any{map[string]any{"name": "bash", "input_schema": map[string]any{"type": "object"}}}
	m := e.postJSON("/v1/messages", map[string]any{"max_tokens": 300, "messages": []any{user("list")}, "tools": tools})
	id := dig(m, "content", 2, "id").(string)
	// Tool-result-only request (no replay of the call): continues the live
	// session, appending only the result.
	prefilled := e.eng.Prefilled.Load()
	tail := map[string]any{"max_tokens": 300, "tools": tools, "messages": []any{map[string]any{"role": "user",
		"content": []any{map[string]any{"type": "tool_result", "tool_use_id": id, "content": "42 files"}}}}}
	m = e.postJSON("/v1/messages", tail)
	if dig(m, "content", 1, "text") != "The tool said: 42 files" {
		t.Fatalf("live tail: %v", m)
	}
	tailTokens := len(testTokenizer(t).EncodeWithSpecial(chat.EOS + chat.UserToken + "<tool_result>42 files</tool_result>" + chat.AssistantToken + chat.ThinkStart))
	if num(dig(m, "usage", "cache_read_input_tokens")) == 0 || num(dig(m, "usage", "cache_creation_input_tokens")) != tailTokens {
		t.Fatalf("live tail usage: %v (tail %d tokens)", dig(m, "usage"), tailTokens)
	}
	_ = prefilled
	// The same ids again: the live state moved on, so the request fails
	// validation with a clear message.
	resp, out := e.post("/v1/messages", tail)
	if resp.StatusCode != 400 || !strings.Contains(string(out), "tool_use_id "+id) || dig(jsonOf(t, string(out)), "type") != "error" {
		t.Fatalf("stale id: %d %s", resp.StatusCode, out)
	}
	// A full replay may carry ids the live session does not know.
	replay := map[string]any{"max_tokens": 300, "tools": tools, "messages": []any{user("list"),
		map[string]any{"content": []any{map[string]any{"type": "tool_use", "id": "toolu_old", "name": "bash", "input": map[string]any{"command": "ls"}}}, "role": "assistant"},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_old", "content": "x"}}}}}
	m = e.postJSON("/v1/messages", replay)
	if dig(m, "content", 1, "text") != "The tool said: x" {
		t.Fatalf("full replay: %v", m)
	}
	// tool_use blocks parse even when "content" precedes "role" (above).
	r, _ := e.rendered(apiMessages, replay)
	if !strings.Contains(r.promptText, `invoke name="bash"`) {
		t.Fatal("tool_use before role not parsed")
	}
}

func TestResponsesToolOutputsLiveTailAndValidation(t *testing.T) {
	e := newEnv(t, agentScript)
	tools := []any{map[string]any{"type": "function", "name": "bash"}}
	m := e.postJSON("/v1/responses", map[string]any{"input": "list", "tools": tools})
	fc := dig(m, "output", 1).(map[string]any)
	if fc["type"] != "function_call" {
		t.Fatalf("no call: %v", m)
	}
	out := map[string]any{"type": "function_call_output", "call_id": fc["call_id"], "output": "f.txt"}
	m = e.postJSON("/v1/responses", map[string]any{"input": []any{out}, "tools": tools})
	if dig(m, "output", 0, "content", 0, "text") != "The tool said: f.txt" || num(dig(m, "usage", "input_tokens_details", "cached_tokens")) == 0 {
		t.Fatalf("live tail: %v", m)
	}
	resp, b := e.post("/v1/responses", map[string]any{"input": []any{map[string]any{"type": "function_call_output", "call_id": "call_nope", "output": "x"}}})
	if resp.StatusCode != 400 || !strings.Contains(string(b), "call_id call_nope") {
		t.Fatalf("unknown call id: %d %s", resp.StatusCode, b)
	}
	// Stateless replay without the reasoning item is accepted but flagged.
	replay := map[string]any{"input": []any{map[string]any{"role": "user", "content": "list"},
		map[string]any{"type": "function_call", "call_id": "call_z", "name": "bash", "arguments": `{"command":"ls"}`},
		map[string]any{"type": "function_call_output", "call_id": "call_z", "output": "y"}}, "tools": tools}
	r, ae := e.rendered(apiResponses, replay)
	if ae != nil || !r.replayNoRs {
		t.Fatalf("replay without reasoning not flagged: %v", ae)
	}
	replay["input"] = append([]any{replay["input"].([]any)[0], map[string]any{"type": "reasoning", "summary": []any{map[string]any{"type": "summary_text", "text": "think"}}}},
		replay["input"].([]any)[1:]...)
	r, _ = e.rendered(apiResponses, replay)
	if r.replayNoRs || !strings.Contains(r.promptText, "think"+chat.ThinkEnd) {
		t.Fatalf("reasoning item not used: %q", r.promptText)
	}
	// Items that are not completed are refused.
	resp, b = e.post("/v1/responses", map[string]any{"input": []any{map[string]any{"type": "message", "role": "user", "content": "x", "status": "in_progress"}}})
	if resp.StatusCode != 400 {
		t.Fatalf("in_progress item: %s", b)
	}
	resp, _ = e.post("/v1/responses", map[string]any{"input": "x", "previous_response_id": "resp_1"})
	if resp.StatusCode != 400 {
		t.Fatal("previous_response_id accepted")
	}
}

func TestResponsesVisibleSuffixMatchesClientReplay(t *testing.T) {
	// After a text turn, the client's replay of the visible transcript
	// extends the live session, so the next turn reuses it.
	e := newEnv(t, func(string) string { return "Visible answer." })
	m := e.postJSON("/v1/responses", map[string]any{"model": AliasChat, "input": "q1"})
	first := num(dig(m, "usage", "total_tokens"))
	m = e.postJSON("/v1/responses", map[string]any{"model": AliasChat, "input": []any{
		map[string]any{"role": "user", "content": "q1"},
		map[string]any{"type": "message", "role": "assistant", "status": "completed", "content": []any{map[string]any{"type": "output_text", "text": "Visible answer."}}},
		map[string]any{"role": "user", "content": "q2"}}})
	if num(dig(m, "usage", "input_tokens_details", "cached_tokens")) < first {
		t.Fatalf("replay did not reuse the live turn: %v (first %d)", dig(m, "usage"), first)
	}
}

func TestResponsesToolSearchAndNamespaces(t *testing.T) {
	script := func(string) string {
		return dsmlBlock(dsmlInvoke("tool_search", dsmlParam("query", true, "git")), dsmlInvoke("mcp__git__status", dsmlParam("path", true, ".")))
	}
	e := newEnv(t, script)
	tools := []any{
		map[string]any{"type": "tool_search", "description": "Find tools."},
		map[string]any{"type": "namespace", "name": "mcp__git__", "tools": []any{map[string]any{"type": "function", "name": "status", "description": "git status"}}},
	}
	r, _ := e.rendered(apiResponses, map[string]any{"model": AliasChat, "input": "x", "tools": tools})
	if !strings.Contains(r.promptText, `{"name": "mcp__git__status"`) || !strings.Contains(r.promptText, `{"name": "tool_search", "description": "Find tools."`) {
		t.Fatalf("schemas: %q", r.promptText)
	}
	m := e.postJSON("/v1/responses", map[string]any{"model": AliasChat, "input": "x", "tools": tools})
	ts, fc := dig(m, "output", 0).(map[string]any), dig(m, "output", 1).(map[string]any)
	if ts["type"] != "tool_search_call" || ts["execution"] != "client" || dig(ts, "arguments", "query") != "git" {
		t.Fatalf("tool_search_call: %v", ts)
	}
	if fc["type"] != "function_call" || fc["name"] != "status" || fc["namespace"] != "mcp__git__" {
		t.Fatalf("namespaced call: %v", fc)
	}
	// Replayed, they render back to the prompt names; tool_search_output
	// loads more tools.
	replay := map[string]any{"model": AliasChat, "tools": tools, "input": []any{user("x"),
		map[string]any{"type": "tool_search_call", "call_id": ts["call_id"], "arguments": map[string]any{"query": "git"}},
		map[string]any{"type": "tool_search_output", "call_id": ts["call_id"], "tools": []any{map[string]any{"type": "function", "name": "loaded_tool"}}},
		map[string]any{"type": "function_call", "call_id": fc["call_id"], "name": "status", "namespace": "mcp__git__", "arguments": `{"path":"."}`},
		map[string]any{"type": "function_call_output", "call_id": fc["call_id"], "output": "clean"}}}
	r, ae := e.rendered(apiResponses, replay)
	if ae != nil || !strings.Contains(r.promptText, `invoke name="tool_search"`) || !strings.Contains(r.promptText, `invoke name="mcp__git__status"`) ||
		!strings.Contains(r.promptText, `{"name": "loaded_tool"`) {
		t.Fatalf("replay: %v %q", ae, r.promptText)
	}
	resp, b := e.post("/v1/responses", map[string]any{"input": []any{map[string]any{"type": "tool_search_output", "call_id": "c", "tools": []any{42}}}})
	if resp.StatusCode != 400 {
		t.Fatalf("bad tools accepted: %s", b)
	}
}

func TestStreamingHoldsPartialUTF8AndEntities(t *testing.T) {
	// Emoji are byte-level tokens: a stream must never split them, nor a
	// DSML entity in a string argument.
	text := "Ciao 🙂 città 日本語 🚀."
	call := dsmlBlock(dsmlInvoke("bash", dsmlParam("command", true, "echo a &amp;&amp; b &lt;/｜DSML｜parameter> 🙂")))
	e := newEnv(t, func(string) string { return text + call })
	evs := e.stream("/v1/chat/completions", map[string]any{"model": AliasChat, "stream": true, "messages": []any{user("x")}, "tools": []any{bashTool}})
	a := accumulateChat(t, evs)
	if a.content != text || a.args[0] != `{"command": "echo a && b </｜DSML｜parameter> 🙂"}` {
		t.Fatalf("content %q args %q", a.content, a.args[0])
	}
	for _, ev := range evs {
		if ev.data == "[DONE]" {
			continue
		}
		m := jsonOf(t, ev.data)
		for _, s := range []any{dig(m, "choices", 0, "delta", "content"), dig(m, "choices", 0, "delta", "tool_calls", 0, "function", "arguments")} {
			if str, ok := s.(string); ok && (strings.ContainsRune(str, '\uFFFD') || strings.Contains(str, "&l") || strings.Contains(str, "&a")) {
				t.Fatalf("partial character or entity streamed: %q", str)
			}
		}
	}
}

func TestMultipleToolCallsStreamInOrder(t *testing.T) {
	call := dsmlBlock(dsmlInvoke("bash", dsmlParam("command", true, "one")), dsmlInvoke("bash", dsmlParam("command", true, "two")), dsmlInvoke("read", dsmlParam("path", true, "three")))
	e := newEnv(t, func(string) string { return call })
	a := accumulateChat(t, e.stream("/v1/chat/completions", map[string]any{"model": AliasChat, "stream": true, "messages": []any{user("x")}, "tools": []any{bashTool}}))
	if len(a.args) != 3 || a.args[0] != `{"command": "one"}` || a.args[1] != `{"command": "two"}` || a.names[2] != "read" || a.args[2] != `{"path": "three"}` {
		t.Fatalf("calls: %+v", a)
	}
	if a.ids[0] == a.ids[1] || a.ids[1] == a.ids[2] {
		t.Fatal("duplicate ids")
	}
	// Anthropic: three tool_use blocks in order.
	resp, out := e.post("/v1/messages", map[string]any{"model": AliasChat, "max_tokens": 300, "stream": true, "messages": []any{user("x")},
		"tools": []any{map[string]any{"name": "bash", "input_schema": map[string]any{}}}})
	var starts []string
	for _, ev := range parseSSE(t, out) {
		if ev.name == "content_block_start" {
			starts = append(starts, fmt.Sprint(dig(jsonOf(t, ev.data), "content_block", "type")))
		}
	}
	if resp.StatusCode != 200 || strings.Join(starts, ",") != "tool_use,tool_use,tool_use" {
		t.Fatalf("anthropic blocks: %v", starts)
	}
}

func TestStopSequences(t *testing.T) {
	f := newStopFilter([]string{"END", "STOP HERE"})
	var out string
	for _, piece := range []string{"abc E", "N", "x STOP", " HE", "RE tail"} {
		s, done := f.push(piece)
		out += s
		if done {
			break
		}
	}
	if out != "abc ENx " || f.hit != "STOP HERE" {
		t.Fatalf("filter: %q %q", out, f.hit)
	}
	stops, _ := parseStop(json.RawMessage(`["a","","b"]`), "stop")
	if len(stops) != 2 {
		t.Fatalf("parse: %v", stops)
	}
	e := newEnv(t, func(string) string { return "one two three four" })
	for _, api := range []string{"chat", "messages"} {
		var body map[string]any
		path := "/v1/chat/completions"
		if api == "chat" {
			body = map[string]any{"model": AliasChat, "stop": []string{"four", "thr"}, "messages": []any{user("x")}}
		} else {
			path = "/v1/messages"
			body = map[string]any{"model": AliasChat, "max_tokens": 50, "stop_sequences": []string{"thr"}, "messages": []any{user("x")}}
		}
		m := e.postJSON(path, body)
		if api == "chat" && (dig(m, "choices", 0, "message", "content") != "one two " || dig(m, "choices", 0, "finish_reason") != "stop") {
			t.Fatalf("chat: %v", m)
		}
		if api == "messages" && (dig(m, "content", 0, "text") != "one two " || dig(m, "stop_reason") != "stop_sequence" || dig(m, "stop_sequence") != "thr") {
			t.Fatalf("messages: %v", m)
		}
		body["stream"] = true
		evs := e.stream(path, body)
		var text string
		for _, ev := range evs {
			if ev.data == "[DONE]" {
				continue
			}
			m := jsonOf(t, ev.data)
			if s, ok := dig(m, "choices", 0, "delta", "content").(string); ok {
				text += s
			}
			if s, ok := dig(m, "delta", "text").(string); ok {
				text += s
			}
		}
		if text != "one two " {
			t.Fatalf("%s stream: %q", api, text)
		}
	}
}

func TestUsageReportsCacheDetails(t *testing.T) {
	e := newEnv(t, func(string) string { return "Reply." })
	body := map[string]any{"model": AliasChat, "messages": []any{user("same prompt")}}
	e.postJSON("/v1/chat/completions", body)
	m := e.postJSON("/v1/chat/completions", body)
	p := num(dig(m, "usage", "prompt_tokens"))
	if c := num(dig(m, "usage", "prompt_tokens_details", "cached_tokens")); c != p ||
		num(dig(m, "usage", "prompt_tokens_details", "cache_write_tokens")) != 0 {
		t.Fatalf("openai: %v", dig(m, "usage"))
	}
	a := accumulateChat(t, e.stream("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("same prompt")},
		"stream": true, "stream_options": map[string]any{"include_usage": true}}))
	if num(dig(a.usage, "prompt_tokens_details", "cached_tokens")) != p {
		t.Fatalf("openai stream: %v", a.usage)
	}
	m = e.postJSON("/v1/responses", map[string]any{"model": AliasChat, "input": "same prompt"})
	if num(dig(m, "usage", "input_tokens_details", "cached_tokens")) != p {
		t.Fatalf("responses: %v", dig(m, "usage"))
	}
	m = e.postJSON("/v1/messages", map[string]any{"model": AliasChat, "max_tokens": 9, "messages": []any{user("same prompt")}})
	if num(dig(m, "usage", "cache_read_input_tokens")) != p || num(dig(m, "usage", "cache_creation_input_tokens")) != 0 {
		t.Fatalf("anthropic: %v", dig(m, "usage"))
	}
}

func TestContextOverflowUsesProtocolShapeBeforeWork(t *testing.T) {
	e := newEnv(t, nil, func(_ *Config, f *FakeEngine) { f.Ctx = 64 })
	long := strings.Repeat("word ", 200)
	for _, tc := range []struct{ path, param string }{
		{"/v1/chat/completions", "messages"}, {"/v1/completions", "prompt"}, {"/v1/responses", "input"}, {"/v1/messages", ""},
	} {
		body := map[string]any{"messages": []any{user(long)}, "prompt": long, "input": long, "max_tokens": 10}
		resp, out := e.post(tc.path, body)
		m := jsonOf(t, string(out))
		if resp.StatusCode != 400 || num(dig(m, "error", "n_ctx")) != 64 || num(dig(m, "error", "n_prompt_tokens")) < 200 {
			t.Fatalf("%s: %d %s", tc.path, resp.StatusCode, out)
		}
		if tc.param != "" && (dig(m, "error", "code") != "context_length_exceeded" || dig(m, "error", "param") != tc.param) {
			t.Fatalf("%s: %s", tc.path, out)
		}
		if tc.param == "" && (dig(m, "type") != "error" || dig(m, "error", "type") != "invalid_request_error") {
			t.Fatalf("%s: %s", tc.path, out)
		}
	}
	if e.eng.Prefilled.Load() != 0 {
		t.Fatal("work was done for an overflowing prompt")
	}
}

func TestMaxTokensClampedToContext(t *testing.T) {
	e := newEnv(t, func(string) string { return strings.Repeat("la ", 100) }, func(_ *Config, f *FakeEngine) { f.Ctx = 40 })
	m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "max_tokens": 100000, "messages": []any{user("x")}})
	p, c := num(dig(m, "usage", "prompt_tokens")), num(dig(m, "usage", "completion_tokens"))
	if p+c != 40 || dig(m, "choices", 0, "finish_reason") != "length" {
		t.Fatalf("clamp: prompt %d completion %d %v", p, c, m)
	}
	m = e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "max_completion_tokens": 3, "messages": []any{user("x")}})
	if num(dig(m, "usage", "completion_tokens")) != 3 || dig(m, "choices", 0, "finish_reason") != "length" {
		t.Fatalf("max_completion_tokens: %v", m)
	}
	// A tool call cut off by max_tokens is reported as truncated, not run.
	e2 := newEnv(t, func(string) string { return bashCall })
	m = e2.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "max_tokens": 12, "messages": []any{user("x")}, "tools": []any{bashTool}})
	if dig(m, "choices", 0, "finish_reason") != "length" || dig(m, "choices", 0, "message", "tool_calls") != nil {
		t.Fatalf("truncated call: %v", m)
	}
	m = e2.postJSON("/v1/responses", map[string]any{"model": AliasChat, "max_output_tokens": 12, "input": "x", "tools": []any{map[string]any{"type": "function", "name": "bash"}}})
	if dig(m, "status") != "incomplete" || dig(m, "incomplete_details", "reason") != "max_output_tokens" {
		t.Fatalf("responses incomplete: %v", m)
	}
}

func TestCORSOptIn(t *testing.T) {
	off := newEnv(t, nil)
	req, _ := http.NewRequest("OPTIONS", off.hs.URL+"/v1/chat/completions", nil)
	resp, _ := http.DefaultClient.Do(req)
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("cors off: %d %v", resp.StatusCode, resp.Header)
	}
	on := newEnv(t, nil, func(c *Config, _ *FakeEngine) { c.CORS = true })
	resp, _ = http.DefaultClient.Do(func() *http.Request { r, _ := http.NewRequest("OPTIONS", on.hs.URL+"/v1/messages", nil); return r }())
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "*" || resp.Header.Get("Access-Control-Allow-Methods") == "" {
		t.Fatalf("preflight: %v", resp.Header)
	}
	resp, _ = on.post("/v1/chat/completions", map[string]any{"stream": true, "messages": []any{user("x")}})
	if resp.Header.Get("Access-Control-Allow-Origin") != "*" || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("sse cors: %v", resp.Header)
	}
}

func TestProtocolHygiene(t *testing.T) {
	e := newEnv(t, nil, func(c *Config, _ *FakeEngine) { c.MaxBodyBytes = 4096 })
	deep := `{"messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + "}"
	for _, tc := range []struct {
		body, want string
		code       int
	}{
		{deep, "nests deeper", 400},
		{`{"messages": [`, "invalid JSON", 400},
		{`{"messages":"hi"}`, "messages", 400},
		{`{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, "number", 400},
		{`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "not supported", 400},
		{`{"messages":[{"role":"wizard","content":"x"}]}`, "unknown role", 400},
		{`{}`, "missing messages", 400},
		{``, "empty", 400},
		{`{"messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, "larger than", 413},
	} {
		resp, out := e.post("/v1/chat/completions", tc.body)
		if resp.StatusCode != tc.code || !strings.Contains(string(out), tc.want) {
			t.Fatalf("%.60q: %d %s", tc.body, resp.StatusCode, out)
		}
	}
	resp, out := e.post("/v1/messages", `{"messages":[}`)
	if resp.StatusCode != 400 || dig(jsonOf(t, string(out)), "error", "type") != "invalid_request_error" || dig(jsonOf(t, string(out)), "type") != "error" {
		t.Fatalf("anthropic 400 shape: %s", out)
	}
}

func TestAPIKey(t *testing.T) {
	e := newEnv(t, func(string) string { return "ok" }, func(c *Config, _ *FakeEngine) { c.APIKey = "k1" })
	body := map[string]any{"model": AliasChat, "messages": []any{user("x")}}
	if resp, out := e.post("/v1/chat/completions", body); resp.StatusCode != 401 || dig(jsonOf(t, string(out)), "error", "code") != "invalid_api_key" {
		t.Fatalf("no key: %d %s", resp.StatusCode, out)
	}
	if resp, _ := e.post("/v1/chat/completions", body, "Authorization", "Bearer k1"); resp.StatusCode != 200 {
		t.Fatal("bearer refused")
	}
	if resp, _ := e.post("/v1/messages", map[string]any{"max_tokens": 5, "messages": []any{user("x")}}, "x-api-key", "k1"); resp.StatusCode != 200 {
		t.Fatal("x-api-key refused")
	}
	if resp, out := e.post("/v1/messages", body, "x-api-key", "k2"); resp.StatusCode != 401 || dig(jsonOf(t, string(out)), "error", "type") != "authentication_error" {
		t.Fatalf("wrong key: %s", out)
	}
	if resp, _ := http.Get(e.hs.URL + "/health"); resp.StatusCode != 200 {
		t.Fatal("health needs no key")
	}
	if resp, _ := http.Get(e.hs.URL + "/metrics"); resp.StatusCode != 401 {
		t.Fatal("metrics without key")
	}
}

// panicEngine panics in Prefill when the prompt contains "PANIC".
type panicEngine struct{ *FakeEngine }

func (p panicEngine) NewSession() (Session, error) {
	s, err := p.FakeEngine.NewSession()
	return panicSession{s, p.Tok}, err
}

type panicSession struct {
	Session
	tok interface{ Decode([]int32) ([]byte, error) }
}

func (p panicSession) Prefill(ctx context.Context, toks []int32) error {
	if b, _ := p.tok.Decode(toks); strings.Contains(string(b), "PANIC") {
		panic("engine exploded")
	}
	return p.Session.Prefill(ctx, toks)
}

func TestPanicsNeverReachClients(t *testing.T) {
	e := newEnv(t, func(string) string { return "fine" }, func(c *Config, f *FakeEngine) { c.Engine = panicEngine{f} })
	resp, out := e.post("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("PANIC")}})
	if resp.StatusCode != 500 || dig(jsonOf(t, string(out)), "error", "type") != "server_error" {
		t.Fatalf("panic: %d %s", resp.StatusCode, out)
	}
	m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("calm")}})
	if dig(m, "choices", 0, "message", "content") != "fine" {
		t.Fatalf("server broken after panic: %v", m)
	}
	// A handler panic (not the engine) is recovered by the middleware.
	h := e.s.middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	hs := newRecorder()
	h.ServeHTTP(hs, mustReq("GET", "/v1/models"))
	if hs.code != 500 || !strings.Contains(hs.body.String(), "internal server error") {
		t.Fatalf("handler panic: %d %s", hs.code, hs.body.String())
	}
}

func TestClientDisconnectCancelsGeneration(t *testing.T) {
	e := newEnv(t, func(string) string { return strings.Repeat("slow ", 400) }, func(_ *Config, f *FakeEngine) { f.TokenDelay = 2 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.hs.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"deepseek-chat","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "generation to stop", func() bool { _, _, busy := e.s.sched.status(); return !busy })
	gen := e.eng.Prefilled.Load()
	if gen > 300 {
		t.Fatalf("generation ran on after disconnect: %d tokens", gen)
	}
	// The slot is free: the next request is served at once.
	start := time.Now()
	e.eng.TokenDelay = 0
	e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "max_tokens": 5, "messages": []any{user("y")}})
	if time.Since(start) > 2*time.Second {
		t.Fatal("slot not freed")
	}
}

func TestKeepaliveDuringLongPrefill(t *testing.T) {
	e := newEnv(t, func(string) string { return "done" }, func(c *Config, f *FakeEngine) {
		c.KeepAlive = 20 * time.Millisecond
		f.PrefillDelay = 2 * time.Millisecond
	})
	resp, out := e.post("/v1/chat/completions", map[string]any{"model": AliasChat, "stream": true, "messages": []any{user(strings.Repeat("long prompt ", 60))}})
	evs := parseSSE(t, out)
	if resp.StatusCode != 200 || len(evs) == 0 || evs[0].name != ":" || evs[0].data != "keepalive" {
		t.Fatalf("no keepalive before the first event: %v", evs)
	}
	var data []sseEvent
	for _, ev := range evs {
		if ev.name != ":" {
			data = append(data, ev)
		}
	}
	if a := accumulateChat(t, data); a.content != "done" {
		t.Fatalf("after keepalive: %+v", a)
	}
}

func TestQueueFullIs503(t *testing.T) {
	e := newEnv(t, func(string) string { return strings.Repeat("z ", 50) }, func(c *Config, f *FakeEngine) {
		c.MaxQueue = 1
		f.TokenDelay = 5 * time.Millisecond
	})
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			e.post("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}})
			done <- struct{}{}
		}()
	}
	waitFor(t, "queue to fill", func() bool { q, _, busy := e.s.sched.status(); return busy && q == 1 })
	resp, out := e.post("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}})
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(out), "overloaded") {
		t.Fatalf("queue full: %d %s", resp.StatusCode, out)
	}
	<-done
	<-done
}

func TestPrefixReuseByTokensAndBytes(t *testing.T) {
	e := newEnv(t, nil)
	tok := testTokenizer(t)
	sc := e.s.sched
	text := "Hello world, this is a prefix test."
	prompt := tok.EncodeWithSpecial(text)
	// Exact token prefix.
	eff, k, src := sc.reusePrefix(prompt[:3], prompt, text)
	if k != 3 || src != "token" || len(eff) != len(prompt) {
		t.Fatalf("token prefix: %d %s", k, src)
	}
	// Live tokens that spell a prefix of the text with a different
	// tokenization: the bytes match, only the suffix is tokenized.
	var odd []int32
	for _, b := range []byte("Hello wor") {
		odd = append(odd, tok.Encode(string([]byte{b}))...)
	}
	eff, k, src = sc.reusePrefix(odd, prompt, text)
	if src != "text" || k != len(odd) {
		t.Fatalf("byte prefix: %d %s", k, src)
	}
	if b, _ := tok.Decode(eff); string(b) != text {
		t.Fatalf("effective prompt decodes to %q", b)
	}
	// Divergence: keep the common part only.
	other := tok.EncodeWithSpecial("Hello there")
	_, k, _ = sc.reusePrefix(other, prompt, text)
	if k != 1 {
		t.Fatalf("divergent: %d", k)
	}
	_, k, src = sc.reusePrefix(nil, prompt, text)
	if k != 0 || src != "none" {
		t.Fatal("empty live")
	}
}

func TestMetricsEndpoint(t *testing.T) {
	e := newEnv(t, func(string) string { return "m" })
	e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("x")}})
	resp, err := http.Get(e.hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b := new(strings.Builder)
	_, _ = fmt.Fprint(b, readAll(resp))
	for _, want := range []string{"ds4_completion_tokens_total", "ds4_queue_depth", "ds4_prefix_cache_total", "ds4_time_to_first_token_seconds",
		"ds4_decode_tokens_per_second", `ds4_http_requests_total{code="200",endpoint="/v1/chat/completions"} 1`, "go_goroutines"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("metrics lack %q", want)
		}
	}
}

func TestSlowReaderDoesNotStallTheEngine(t *testing.T) {
	// Client A starts a long stream and never reads it; the worker never
	// writes to sockets (events are queued per request), so client B is
	// served as soon as A's generation is done.
	e := newEnv(t, func(p string) string {
		if strings.Contains(p, "long") {
			return strings.Repeat("word ", 1500)
		}
		return "short"
	}, func(c *Config, f *FakeEngine) { c.WriteTimeout = 200 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.hs.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"deepseek-chat","stream":true,"messages":[{"role":"user","content":"long"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	m := e.postJSON("/v1/chat/completions", map[string]any{"model": AliasChat, "messages": []any{user("quick")}})
	if dig(m, "choices", 0, "message", "content") != "short" || time.Since(start) > 10*time.Second {
		t.Fatalf("second client: %v after %v", m, time.Since(start))
	}
}
