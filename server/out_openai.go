package server

import (
	"time"
)

// finalBody builds the non-streaming response of a request.
func (s *Server) finalBody(r *genRequest, res *genResult) any {
	switch r.api {
	case apiMessages:
		return anthropicMessage(s.nextAnthropicID(), r, res)
	case apiResponses:
		return responsesFinal(r, res)
	case apiCompletions:
		return map[string]any{
			"id": s.nextID("cmpl-"), "object": "text_completion", "created": time.Now().Unix(), "model": r.model,
			"choices": []any{map[string]any{"text": res.text, "index": 0, "logprobs": nil, "finish_reason": openAIFinish(res.finish)}},
			"usage":   openAIUsage(res),
		}
	}
	msg := map[string]any{"role": "assistant", "content": res.text}
	if res.reasoning != "" {
		msg["reasoning_content"] = res.reasoning
	}
	if len(res.calls) > 0 {
		var calls []any
		for _, c := range res.calls {
			calls = append(calls, map[string]any{"id": c.ID, "type": "function",
				"function": map[string]any{"name": c.Name, "arguments": c.Arguments}})
		}
		msg["tool_calls"] = calls
	}
	return map[string]any{
		"id": s.nextID("chatcmpl-"), "object": "chat.completion", "created": time.Now().Unix(), "model": r.model,
		"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": openAIFinish(res.finish)}},
		"usage":   openAIUsage(res),
	}
}

// openAIFinish maps internal finish reasons to OpenAI's.
func openAIFinish(f string) string {
	switch f {
	case "length", "tool_calls", "stop":
		return f
	}
	return "stop"
}

type openAIUsageT struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens     int `json:"cached_tokens"`
		CacheWriteTokens int `json:"cache_write_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// openAIUsage reports usage: cached_tokens is the prefix reused from the
// live session; cache_write_tokens (a ds4 extension) what was prefilled.
func openAIUsage(res *genResult) openAIUsageT {
	var u openAIUsageT
	u.PromptTokens = res.prompt
	u.CompletionTokens = res.completion
	u.TotalTokens = res.prompt + res.completion
	u.PromptTokensDetails.CachedTokens = min(res.cached, res.prompt)
	u.PromptTokensDetails.CacheWriteTokens = max(res.prompt-res.cached, 0)
	u.CompletionTokensDetails.ReasoningTokens = res.reasoningTokens
	return u
}

// chatStream writes chat.completion.chunk events.
type chatStream struct {
	s       *Server
	r       *genRequest
	id      string
	created int64
}

type chatChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *openAIUsageT `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        any     `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

type toolDelta struct {
	Index    int    `json:"index"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func (c *chatStream) chunk(delta any, finish *string) chatChunk {
	return chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.r.model,
		Choices: []chunkChoice{{Delta: delta, FinishReason: finish}}}
}

func (c *chatStream) start(x *sse, res *genResult) error {
	return x.data(c.chunk(map[string]any{"role": "assistant", "content": ""}, nil))
}

func (c *chatStream) event(x *sse, ev *event) error {
	switch ev.kind {
	case evText:
		return x.data(c.chunk(map[string]string{"content": ev.text}, nil))
	case evReasoning:
		return x.data(c.chunk(map[string]string{"reasoning_content": ev.text}, nil))
	case evToolBegin:
		d := toolDelta{Index: ev.index, ID: ev.id, Type: "function"}
		d.Function.Name = ev.name
		return x.data(c.chunk(map[string]any{"tool_calls": []toolDelta{d}}, nil))
	case evToolArgs:
		d := toolDelta{Index: ev.index}
		d.Function.Arguments = ev.text
		return x.data(c.chunk(map[string]any{"tool_calls": []toolDelta{d}}, nil))
	}
	return nil
}

func (c *chatStream) done(x *sse, res *genResult) error {
	f := openAIFinish(res.finish)
	if err := x.data(c.chunk(struct{}{}, &f)); err != nil {
		return err
	}
	if c.r.incUsage {
		u := openAIUsage(res)
		ch := chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.r.model,
			Choices: []chunkChoice{}, Usage: &u}
		if err := x.data(ch); err != nil {
			return err
		}
	}
	return x.raw("data: [DONE]\n\n")
}

func (c *chatStream) fail(x *sse, e *apiError) error {
	if err := x.data(errorBody(c.r.api, e)); err != nil {
		return err
	}
	return x.raw("data: [DONE]\n\n")
}

// completionStream writes text_completion chunks.
type completionStream struct {
	s       *Server
	r       *genRequest
	id      string
	created int64
}

func (c *completionStream) chunk(text string, finish *string, usage *openAIUsageT) map[string]any {
	m := map[string]any{"id": c.id, "object": "text_completion", "created": c.created, "model": c.r.model}
	if usage != nil {
		m["choices"] = []any{}
		m["usage"] = usage
	} else {
		m["choices"] = []any{map[string]any{"text": text, "index": 0, "logprobs": nil, "finish_reason": finish}}
	}
	return m
}

func (c *completionStream) start(x *sse, res *genResult) error { return nil }

func (c *completionStream) event(x *sse, ev *event) error {
	if ev.kind == evText {
		return x.data(c.chunk(ev.text, nil, nil))
	}
	return nil
}

func (c *completionStream) done(x *sse, res *genResult) error {
	f := openAIFinish(res.finish)
	if err := x.data(c.chunk("", &f, nil)); err != nil {
		return err
	}
	if c.r.incUsage {
		u := openAIUsage(res)
		if err := x.data(c.chunk("", nil, &u)); err != nil {
			return err
		}
	}
	return x.raw("data: [DONE]\n\n")
}

func (c *completionStream) fail(x *sse, e *apiError) error {
	if err := x.data(errorBody(c.r.api, e)); err != nil {
		return err
	}
	return x.raw("data: [DONE]\n\n")
}
