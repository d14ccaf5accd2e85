package server

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"
)

// encryptedPrefix marks reasoning the server hands to Responses clients as
// "encrypted_content" (it is not encrypted, only opaque to the client): a
// stateless replay that sends the item back restores the exact reasoning.
const encryptedPrefix = "ds4go1:"

func encodeReasoning(s string) string {
	return encryptedPrefix + base64.StdEncoding.EncodeToString([]byte(s))
}

func decodeReasoning(s string) (string, bool) {
	rest, ok := strings.CutPrefix(s, encryptedPrefix)
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return "", false
	}
	return string(b), true
}

func responsesStatus(finish string) string {
	switch finish {
	case "length":
		return "incomplete"
	case "error":
		return "failed"
	}
	return "completed"
}

func itemStatus(finish string) string {
	if finish == "length" || finish == "error" {
		return "incomplete"
	}
	return "completed"
}

type responsesUsageT struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens     int `json:"cached_tokens"`
		CacheWriteTokens int `json:"cache_write_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func responsesUsage(res *genResult) responsesUsageT {
	var u responsesUsageT
	u.InputTokens = res.prompt
	u.InputTokensDetails.CachedTokens = min(res.cached, res.prompt)
	u.InputTokensDetails.CacheWriteTokens = max(res.prompt-res.cached, 0)
	u.OutputTokens = res.completion
	u.OutputTokensDetails.ReasoningTokens = res.reasoningTokens
	u.TotalTokens = res.prompt + res.completion
	return u
}

// emitReasoning reports whether the client gets reasoning items: it asked
// for a summary or for encrypted reasoning (for stateless replay).
func (r *genRequest) emitReasoning() bool { return r.summary || r.encReasoning }

func reasoningItem(r *genRequest, id, text, status string) map[string]any {
	summary := []any{}
	if text != "" && r.summary {
		summary = append(summary, map[string]any{"type": "summary_text", "text": text})
	}
	item := map[string]any{"id": id, "type": "reasoning", "status": status, "summary": summary}
	if r.encReasoning {
		item["encrypted_content"] = encodeReasoning(text)
	}
	return item
}

func messageItem(id, text, status string) map[string]any {
	content := []any{}
	if status != "in_progress" {
		content = append(content, map[string]any{"type": "output_text", "text": text, "annotations": []any{}})
	}
	return map[string]any{"id": id, "type": "message", "status": status, "role": "assistant", "content": content}
}

// callItem is a function_call item (or tool_search_call for the hosted
// tool_search), with the client's name and namespace restored.
func callItem(r *genRequest, fcID, callID, name, args, status string, withArgs bool) map[string]any {
	w, ok := r.toolWire[name]
	if ok && w.toolSearch {
		a := json.RawMessage(`{}`)
		if withArgs {
			a = toolInput(args)
		}
		return map[string]any{"id": fcID, "type": "tool_search_call", "status": status, "call_id": callID,
			"execution": "client", "arguments": a}
	}
	item := map[string]any{"id": fcID, "type": "function_call", "status": status, "name": name, "call_id": callID, "arguments": ""}
	if ok {
		item["name"] = w.name
		if w.namespace != "" {
			item["namespace"] = w.namespace
		}
	}
	if withArgs {
		item["arguments"] = args
	}
	return item
}

func responsesEnvelope(id string, created int64, r *genRequest, status string, output []any) map[string]any {
	return map[string]any{"id": id, "object": "response", "created_at": created, "status": status,
		"model": r.model, "output": output, "parallel_tool_calls": true, "tool_choice": "auto",
		"error": nil, "incomplete_details": nil}
}

func finishDetails(m map[string]any, finish string) {
	switch finish {
	case "length":
		m["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	case "error":
		m["error"] = map[string]any{"code": "server_error", "message": "generation failed"}
	}
}

func responsesFinal(r *genRequest, res *genResult) any {
	var output []any
	st := itemStatus(res.finish)
	if res.reasoning != "" && r.emitReasoning() {
		rs := st
		if res.reasoningOpen {
			rs = "incomplete"
		}
		output = append(output, reasoningItem(r, randomID("rs_"), res.reasoning, rs))
	}
	if res.text != "" {
		output = append(output, messageItem(randomID("msg_"), res.text, st))
	}
	for _, c := range res.calls {
		output = append(output, callItem(r, randomID("fc_"), c.ID, c.Name, c.Arguments, st, true))
	}
	if output == nil {
		output = []any{}
	}
	m := responsesEnvelope(randomID("resp_"), time.Now().Unix(), r, responsesStatus(res.finish), output)
	finishDetails(m, res.finish)
	m["usage"] = responsesUsage(res)
	return m
}

// responsesStream writes the Responses event lifecycle with
// sequence_number on every event.
type responsesStream struct {
	s       *Server
	r       *genRequest
	id      string
	created int64
	seq     int
	nextOut int
	output  []any // finished items, in output order

	rsID           string
	rsIndex        int
	rsOpen, rsDone bool
	rsBuf          strings.Builder

	msgID    string
	msgIndex int
	msgOpen  bool
	msgDone  bool
	msgBuf   strings.Builder
	calls    map[int]*respCall
}

type respCall struct {
	fcID, callID, name string
	out                int
	args               strings.Builder
}

func newResponsesStream(s *Server, r *genRequest) *responsesStream {
	return &responsesStream{s: s, r: r, id: randomID("resp_"), created: time.Now().Unix(),
		rsID: randomID("rs_"), msgID: randomID("msg_"), calls: map[int]*respCall{}}
}

func (p *responsesStream) emit(x *sse, typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = p.seq
	p.seq++
	return x.event(typ, fields)
}

func (p *responsesStream) start(x *sse, res *genResult) error {
	env := responsesEnvelope(p.id, p.created, p.r, "in_progress", []any{})
	if err := p.emit(x, "response.created", map[string]any{"response": env}); err != nil {
		return err
	}
	return p.emit(x, "response.in_progress", map[string]any{"response": env})
}

func (p *responsesStream) closeReasoning(x *sse, status string) error {
	if !p.rsOpen || p.rsDone {
		return nil
	}
	p.rsDone = true
	text := p.rsBuf.String()
	if p.r.summary {
		if err := p.emit(x, "response.reasoning_summary_text.done", map[string]any{"item_id": p.rsID,
			"output_index": p.rsIndex, "summary_index": 0, "text": text}); err != nil {
			return err
		}
		if err := p.emit(x, "response.reasoning_summary_part.done", map[string]any{"item_id": p.rsID,
			"output_index": p.rsIndex, "summary_index": 0, "part": map[string]any{"type": "summary_text", "text": text}}); err != nil {
			return err
		}
	}
	item := reasoningItem(p.r, p.rsID, text, status)
	p.output = append(p.output, item)
	return p.emit(x, "response.output_item.done", map[string]any{"output_index": p.rsIndex, "item": item})
}

func (p *responsesStream) closeMessage(x *sse, status string) error {
	if !p.msgOpen || p.msgDone {
		return nil
	}
	p.msgDone = true
	text := p.msgBuf.String()
	part := map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	if err := p.emit(x, "response.output_text.done", map[string]any{"item_id": p.msgID, "output_index": p.msgIndex,
		"content_index": 0, "text": text}); err != nil {
		return err
	}
	if err := p.emit(x, "response.content_part.done", map[string]any{"item_id": p.msgID, "output_index": p.msgIndex,
		"content_index": 0, "part": part}); err != nil {
		return err
	}
	item := messageItem(p.msgID, text, status)
	p.output = append(p.output, item)
	return p.emit(x, "response.output_item.done", map[string]any{"output_index": p.msgIndex, "item": item})
}

func (p *responsesStream) event(x *sse, ev *event) error {
	switch ev.kind {
	case evReasoning:
		if !p.r.emitReasoning() {
			return nil
		}
		if !p.rsOpen {
			p.rsOpen, p.rsIndex = true, p.nextOut
			p.nextOut++
			if err := p.emit(x, "response.output_item.added", map[string]any{"output_index": p.rsIndex,
				"item": map[string]any{"id": p.rsID, "type": "reasoning", "status": "in_progress", "summary": []any{}}}); err != nil {
				return err
			}
			if p.r.summary {
				if err := p.emit(x, "response.reasoning_summary_part.added", map[string]any{"item_id": p.rsID,
					"output_index": p.rsIndex, "summary_index": 0, "part": map[string]any{"type": "summary_text", "text": ""}}); err != nil {
					return err
				}
			}
		}
		p.rsBuf.WriteString(ev.text)
		if !p.r.summary {
			return nil
		}
		return p.emit(x, "response.reasoning_summary_text.delta", map[string]any{"item_id": p.rsID,
			"output_index": p.rsIndex, "summary_index": 0, "delta": ev.text})
	case evText:
		if err := p.closeReasoning(x, "completed"); err != nil {
			return err
		}
		if p.msgDone {
			return nil // text after tool calls is not expected; ignore
		}
		if !p.msgOpen {
			p.msgOpen, p.msgIndex = true, p.nextOut
			p.nextOut++
			if err := p.emit(x, "response.output_item.added", map[string]any{"output_index": p.msgIndex,
				"item": messageItem(p.msgID, "", "in_progress")}); err != nil {
				return err
			}
			if err := p.emit(x, "response.content_part.added", map[string]any{"item_id": p.msgID, "output_index": p.msgIndex,
				"content_index": 0, "part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}}); err != nil {
				return err
			}
		}
		p.msgBuf.WriteString(ev.text)
		return p.emit(x, "response.output_text.delta", map[string]any{"item_id": p.msgID, "output_index": p.msgIndex,
			"content_index": 0, "delta": ev.text})
	case evToolBegin:
		if err := p.closeReasoning(x, "completed"); err != nil {
			return err
		}
		if err := p.closeMessage(x, "completed"); err != nil {
			return err
		}
		c := &respCall{fcID: randomID("fc_"), callID: ev.id, name: ev.name, out: p.nextOut}
		p.nextOut++
		p.calls[ev.index] = c
		return p.emit(x, "response.output_item.added", map[string]any{"output_index": c.out,
			"item": callItem(p.r, c.fcID, c.callID, c.name, "", "in_progress", false)})
	case evToolArgs:
		c := p.calls[ev.index]
		if c == nil {
			return nil
		}
		c.args.WriteString(ev.text)
		if w, ok := p.r.toolWire[c.name]; ok && w.toolSearch {
			return nil
		}
		return p.emit(x, "response.function_call_arguments.delta", map[string]any{"item_id": c.fcID,
			"output_index": c.out, "delta": ev.text})
	case evToolEnd:
		c := p.calls[ev.index]
		if c == nil {
			return nil
		}
		args := ev.call.Arguments
		status := "completed"
		if ev.call.Truncated {
			status = "incomplete"
		}
		if w, ok := p.r.toolWire[c.name]; !ok || !w.toolSearch {
			done := map[string]any{"item_id": c.fcID, "output_index": c.out, "arguments": args, "name": c.name}
			if ok {
				done["name"] = w.name
			}
			if err := p.emit(x, "response.function_call_arguments.done", done); err != nil {
				return err
			}
		}
		item := callItem(p.r, c.fcID, c.callID, c.name, args, status, true)
		p.output = append(p.output, item)
		return p.emit(x, "response.output_item.done", map[string]any{"output_index": c.out, "item": item})
	case evToolAbort:
		c := p.calls[ev.index]
		if c == nil {
			return nil
		}
		delete(p.calls, ev.index)
		return p.emit(x, "response.output_item.done", map[string]any{"output_index": c.out,
			"item": callItem(p.r, c.fcID, c.callID, c.name, c.args.String(), "incomplete", true)})
	}
	return nil
}

func (p *responsesStream) done(x *sse, res *genResult) error {
	rs := "completed"
	if res.reasoningOpen {
		rs = "incomplete"
	}
	if err := p.closeReasoning(x, rs); err != nil {
		return err
	}
	if err := p.closeMessage(x, itemStatus(res.finish)); err != nil {
		return err
	}
	typ := "response.completed"
	switch res.finish {
	case "length":
		typ = "response.incomplete"
	case "error":
		typ = "response.failed"
	}
	out := p.output
	if out == nil {
		out = []any{}
	}
	env := responsesEnvelope(p.id, p.created, p.r, responsesStatus(res.finish), out)
	finishDetails(env, res.finish)
	env["usage"] = responsesUsage(res)
	return p.emit(x, typ, map[string]any{"response": env})
}

func (p *responsesStream) fail(x *sse, e *apiError) error {
	if err := p.emit(x, "error", map[string]any{"code": "server_error", "message": e.msg, "param": nil}); err != nil {
		return err
	}
	env := responsesEnvelope(p.id, p.created, p.r, "failed", []any{})
	env["error"] = map[string]any{"code": "server_error", "message": e.msg}
	return p.emit(x, "response.failed", map[string]any{"response": env})
}
