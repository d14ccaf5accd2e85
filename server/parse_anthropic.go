package server

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"ds4go/chat"
)

// messagesRequest is the Anthropic /v1/messages body (fields ds4 uses).
type messagesRequest struct {
	Model         string            `json:"model"`
	System        json.RawMessage   `json:"system"`
	Messages      []json.RawMessage `json:"messages"`
	Tools         []json.RawMessage `json:"tools"`
	ToolChoice    json.RawMessage   `json:"tool_choice"`
	MaxTokens     optNumber         `json:"max_tokens"`
	Temperature   optNumber         `json:"temperature"`
	TopP          optNumber         `json:"top_p"`
	TopK          optNumber         `json:"top_k"`
	Stream        *bool             `json:"stream"`
	StopSequences json.RawMessage   `json:"stop_sequences"`
	Thinking      json.RawMessage   `json:"thinking"`
	OutputConfig  *struct {
		Effort *string `json:"effort"`
	} `json:"output_config"`
	ReasoningEffort *string `json:"reasoning_effort"`
}

// anthropicBlock is one content block (the fields of every type we read).
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	ID        string          `json:"id"`
	ToolUseID string          `json:"tool_use_id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// parseMessagesRequest parses an Anthropic Messages request.
func parseMessagesRequest(body []byte, ctxSize int) (*genRequest, *apiError) {
	var in messagesRequest
	if e := decodeJSON(body, &in); e != nil {
		return nil, e
	}
	if in.Messages == nil {
		return nil, badRequest("missing messages")
	}
	r := &genRequest{api: apiMessages, model: in.Model}
	if r.model == "" {
		r.model = ModelID
	}
	t := newThinkCtl()
	if e := t.thinkingField(in.Thinking); e != nil {
		return nil, e
	}
	if e := t.effortField("reasoning_effort", in.ReasoningEffort); e != nil {
		return nil, e
	}
	if in.OutputConfig != nil {
		if e := t.effortField("output_config.effort", in.OutputConfig.Effort); e != nil {
			return nil, e
		}
	}
	r.mode = t.mode(in.Model, ctxSize)
	var e *apiError
	if r.sampling, e = samplingFrom(r.mode, in.Temperature, in.TopP, optNumber{}, in.TopK); e != nil {
		return nil, e
	}
	if r.maxTokens, e = maxTokensOf("max_tokens", in.MaxTokens); e != nil {
		return nil, e
	}
	if r.stops, e = parseStop(in.StopSequences, "stop_sequences"); e != nil {
		return nil, e
	}
	r.stream = in.Stream != nil && *in.Stream

	system, e := anthropicSystem(in.System)
	if e != nil {
		return nil, e
	}
	if system != "" {
		r.conv.Messages = append(r.conv.Messages, chat.Message{Role: chat.RoleSystem, Content: system})
	}
	for i, raw := range in.Messages {
		msgs, e := anthropicInputMessage(raw, i)
		if e != nil {
			return nil, e
		}
		r.conv.Messages = append(r.conv.Messages, msgs...)
	}
	tools, wire, e := parseToolList(in.Tools, "tools")
	if e != nil {
		return nil, e
	}
	if len(tools) > 0 && !toolChoiceIsNone(in.ToolChoice) {
		r.conv.Tools, r.toolWire, r.hasTools = tools, wire, true
	}
	return r, nil
}

// anthropicSystem flattens "system": a string or text blocks, joined by
// newlines. Parts starting with "x-anthropic-" (Claude Code's per-request
// billing header) are dropped, as ds4 does, so they do not break prefix
// reuse.
func anthropicSystem(raw json.RawMessage) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var parts []string
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", badRequest("system: invalid string")
		}
		parts = []string{s}
	} else {
		var blocks []json.RawMessage
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return "", badRequest("system must be a string or an array of text blocks")
		}
		for i, b := range blocks {
			b = bytes.TrimSpace(b)
			if len(b) > 0 && b[0] == '"' {
				var s string
				_ = json.Unmarshal(b, &s)
				parts = append(parts, s)
				continue
			}
			var blk anthropicBlock
			if err := json.Unmarshal(b, &blk); err != nil {
				return "", badRequest("system[%d]: %v", i, err)
			}
			if blk.Text != nil {
				parts = append(parts, *blk.Text)
			}
		}
	}
	var sb strings.Builder
	for _, p := range parts {
		if p == "" || strings.HasPrefix(p, "x-anthropic-") {
			continue
		}
		if sb.Len() > 0 && !strings.HasSuffix(sb.String(), "\n") {
			sb.WriteByte('\n')
		}
		sb.WriteString(p)
	}
	return sb.String(), nil
}

// anthropicInputMessage converts one message. A user message's tool_result
// blocks become tool messages (in order, with its text around them);
// an assistant message's thinking, text and tool_use blocks become one
// assistant message. The role may come after the content in the JSON.
func anthropicInputMessage(raw json.RawMessage, i int) ([]chat.Message, *apiError) {
	where := "messages[" + strconv.Itoa(i) + "]"
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badRequest("%s: %v", where, err)
	}
	content := bytes.TrimSpace(m.Content)
	var blocks []anthropicBlock
	switch {
	case len(content) == 0 || string(content) == "null":
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return nil, badRequest("%s.content: invalid string", where)
		}
		s2 := s
		blocks = []anthropicBlock{{Type: "text", Text: &s2}}
	case content[0] == '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(content, &raws); err != nil {
			return nil, badRequest("%s.content: %v", where, err)
		}
		for j, b := range raws {
			b = bytes.TrimSpace(b)
			if len(b) > 0 && b[0] == '"' {
				var s string
				_ = json.Unmarshal(b, &s)
				blocks = append(blocks, anthropicBlock{Type: "text", Text: &s})
				continue
			}
			var blk anthropicBlock
			if err := json.Unmarshal(b, &blk); err != nil {
				return nil, badRequest("%s.content[%d]: %v", where, j, err)
			}
			blocks = append(blocks, blk)
		}
	default:
		return nil, badRequest("%s.content must be a string or an array of blocks", where)
	}

	switch m.Role {
	case "system", "developer":
		// Not in Anthropic's schema, but Claude Code sends it; ds4 treats
		// it as system text.
		var sb strings.Builder
		for _, b := range blocks {
			if b.Text != nil {
				sb.WriteString(*b.Text)
			}
		}
		return []chat.Message{{Role: chat.RoleSystem, Content: sb.String()}}, nil
	case "assistant":
		msg := chat.Message{Role: chat.RoleAssistant}
		for j, b := range blocks {
			switch b.Type {
			case "text":
				if b.Text != nil {
					msg.Content += *b.Text
				}
			case "thinking":
				if b.Thinking != nil {
					msg.Reasoning += *b.Thinking
				}
			case "redacted_thinking":
			case "tool_use", "server_tool_use":
				args := string(bytes.TrimSpace(b.Input))
				if args == "" || args == "null" {
					args = "{}"
				}
				msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
			default:
				return nil, badRequest("%s.content[%d]: block type %q is not supported in assistant messages", where, j, b.Type)
			}
		}
		return []chat.Message{msg}, nil
	case "user", "":
		var out []chat.Message
		var text strings.Builder
		flush := func() {
			if text.Len() > 0 {
				out = append(out, chat.Message{Role: chat.RoleUser, Content: text.String()})
				text.Reset()
			}
		}
		for j, b := range blocks {
			switch b.Type {
			case "text":
				if b.Text != nil {
					text.WriteString(*b.Text)
				}
			case "tool_result":
				flush()
				id := b.ToolUseID
				if id == "" {
					id = b.ID
				}
				res, e := contentText(b.Content, where+".content["+strconv.Itoa(j)+"].content")
				if e != nil {
					return nil, e
				}
				out = append(out, chat.Message{Role: chat.RoleTool, ToolCallID: id, Content: res})
			case "document":
				return nil, badRequest("%s.content[%d]: document blocks are not supported (text only)", where, j)
			case "image":
				return nil, badRequest("%s.content[%d]: image blocks are not supported (text only)", where, j)
			default:
				// Unknown blocks without text (e.g. cache-control markers
				// in newer clients) carry no prompt content.
				if b.Text != nil {
					text.WriteString(*b.Text)
				}
			}
		}
		flush()
		if len(out) == 0 {
			out = append(out, chat.Message{Role: chat.RoleUser})
		}
		return out, nil
	}
	return nil, badRequest("%s: role must be user or assistant, got %q", where, m.Role)
}
