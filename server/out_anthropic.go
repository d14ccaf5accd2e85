package server

import (
	"encoding/json"
)

func (s *Server) nextAnthropicID() string { return randomID("msg_") }

// anthropicStop maps finish reasons to stop_reason.
func anthropicStop(res *genResult) (string, any) {
	switch {
	case res.finish == "tool_calls":
		return "tool_use", nil
	case res.finish == "length":
		return "max_tokens", nil
	case res.stopSeq != "":
		return "stop_sequence", res.stopSeq
	}
	return "end_turn", nil
}

type anthropicUsageT struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
}

// anthropicUsage splits the prompt like ds4: reused prefix = cache read,
// prefilled suffix = cache creation (it is written to the live KV).
func anthropicUsage(res *genResult, output int) anthropicUsageT {
	read := min(res.cached, res.prompt)
	write := max(res.prompt-read, 0)
	return anthropicUsageT{InputTokens: max(res.prompt-read-write, 0), OutputTokens: output,
		CacheReadInputTokens: read, CacheCreationInputTokens: write}
}

// toolInput returns a call's arguments as a JSON object for "input".
func toolInput(args string) json.RawMessage {
	var v map[string]json.RawMessage
	if json.Unmarshal([]byte(args), &v) != nil {
		return json.RawMessage(`{}`)
	}
	return json.RawMessage(args)
}

func anthropicMessage(id string, r *genRequest, res *genResult) any {
	var content []any
	if res.reasoning != "" {
		content = append(content, map[string]any{"type": "thinking", "thinking": res.reasoning, "signature": id})
	}
	if res.text != "" {
		content = append(content, map[string]any{"type": "text", "text": res.text})
	}
	for _, c := range res.calls {
		content = append(content, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": toolInput(c.Arguments)})
	}
	if res.text == "" && len(res.calls) == 0 {
		content = append(content, map[string]any{"type": "text", "text": ""})
	}
	stop, seq := anthropicStop(res)
	return map[string]any{"id": id, "type": "message", "role": "assistant", "model": r.model,
		"content": content, "stop_reason": stop, "stop_sequence": seq,
		"usage": anthropicUsage(res, res.completion)}
}

// anthropicStream writes the Messages event stream: message_start,
// content_block_start/delta/stop for thinking, text and tool_use blocks,
// message_delta, message_stop.
type anthropicStream struct {
	s        *Server
	r        *genRequest
	id       string
	open     string // "", "thinking", "text", "tool_use"
	index    int    // index of the open block
	next     int
	thinking bool
	text     bool
	tools    int
}

func newAnthropicStream(s *Server, r *genRequest) *anthropicStream {
	return &anthropicStream{s: s, r: r, id: s.nextAnthropicID()}
}

func (a *anthropicStream) start(x *sse, res *genResult) error {
	return x.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": a.id, "type": "message", "role": "assistant", "model": a.r.model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": anthropicUsage(res, 0)}})
}

func (a *anthropicStream) openBlock(x *sse, typ string, block map[string]any) error {
	if a.open == typ && typ != "tool_use" {
		return nil
	}
	if err := a.closeBlock(x); err != nil {
		return err
	}
	a.open, a.index = typ, a.next
	a.next++
	return x.event("content_block_start", map[string]any{"type": "content_block_start", "index": a.index, "content_block": block})
}

func (a *anthropicStream) closeBlock(x *sse) error {
	if a.open == "" {
		return nil
	}
	if a.open == "thinking" {
		if err := x.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index,
			"delta": map[string]any{"type": "signature_delta", "signature": a.id}}); err != nil {
			return err
		}
	}
	a.open = ""
	return x.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": a.index})
}

func (a *anthropicStream) delta(x *sse, d map[string]any) error {
	return x.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index, "delta": d})
}

func (a *anthropicStream) event(x *sse, ev *event) error {
	switch ev.kind {
	case evReasoning:
		if err := a.openBlock(x, "thinking", map[string]any{"type": "thinking", "thinking": "", "signature": ""}); err != nil {
			return err
		}
		a.thinking = true
		return a.delta(x, map[string]any{"type": "thinking_delta", "thinking": ev.text})
	case evText:
		if err := a.openBlock(x, "text", map[string]any{"type": "text", "text": ""}); err != nil {
			return err
		}
		a.text = true
		return a.delta(x, map[string]any{"type": "text_delta", "text": ev.text})
	case evToolBegin:
		a.tools++
		return a.openBlock(x, "tool_use", map[string]any{"type": "tool_use", "id": ev.id, "name": ev.name, "input": map[string]any{}})
	case evToolArgs:
		return a.delta(x, map[string]any{"type": "input_json_delta", "partial_json": ev.text})
	case evToolEnd, evToolAbort:
		return a.closeBlock(x)
	}
	return nil
}

func (a *anthropicStream) done(x *sse, res *genResult) error {
	if err := a.closeBlock(x); err != nil {
		return err
	}
	if !a.text && len(res.calls) == 0 {
		if err := a.openBlock(x, "text", map[string]any{"type": "text", "text": ""}); err != nil {
			return err
		}
		if err := a.closeBlock(x); err != nil {
			return err
		}
	}
	stop, seq := anthropicStop(res)
	if err := x.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": seq},
		"usage": map[string]any{"output_tokens": res.completion}}); err != nil {
		return err
	}
	return x.event("message_stop", map[string]any{"type": "message_stop"})
}

func (a *anthropicStream) fail(x *sse, e *apiError) error {
	typ := "api_error"
	if e.status == 400 || e.status == 409 {
		typ = "invalid_request_error"
	}
	return x.event("error", map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": e.msg}})
}
