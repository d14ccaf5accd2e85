package server

import (
	"bytes"
	"encoding/json"
	"strconv"

	"ds4go/chat"
)

// responsesRequest is the OpenAI Responses body (fields ds4 uses).
type responsesRequest struct {
	Model           string            `json:"model"`
	Input           json.RawMessage   `json:"input"`
	Instructions    *string           `json:"instructions"`
	Tools           []json.RawMessage `json:"tools"`
	ToolChoice      json.RawMessage   `json:"tool_choice"`
	MaxOutputTokens optNumber         `json:"max_output_tokens"`
	MaxTokens       optNumber         `json:"max_tokens"`
	Temperature     optNumber         `json:"temperature"`
	TopP            optNumber         `json:"top_p"`
	TopK            optNumber         `json:"top_k"`
	MinP            optNumber         `json:"min_p"`
	Seed            optNumber         `json:"seed"`
	Stream          *bool             `json:"stream"`
	Stop            json.RawMessage   `json:"stop"`
	Reasoning       *struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	} `json:"reasoning"`
	Thinking           json.RawMessage `json:"thinking"`
	Think              *bool           `json:"think"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Include            []string        `json:"include"`
	Conversation       json.RawMessage `json:"conversation"`
}

// responsesItem is one input item (the fields of every type we read).
type responsesItem struct {
	Type      string            `json:"type"`
	Role      string            `json:"role"`
	Content   json.RawMessage   `json:"content"`
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	CallID    string            `json:"call_id"`
	ID        string            `json:"id"`
	Arguments json.RawMessage   `json:"arguments"`
	Output    json.RawMessage   `json:"output"`
	Input     json.RawMessage   `json:"input"`
	Summary   json.RawMessage   `json:"summary"`
	Action    json.RawMessage   `json:"action"`
	Result    json.RawMessage   `json:"result"`
	Status    string            `json:"status"`
	Tools     []json.RawMessage `json:"tools"`

	EncryptedContent string `json:"encrypted_content"`
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// rawText returns a JSON string's value, or the raw JSON of anything else.
func rawText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	return string(raw)
}

// parseResponsesRequest parses /v1/responses.
func parseResponsesRequest(body []byte, ctxSize int) (*genRequest, *apiError) {
	var in responsesRequest
	if e := decodeJSON(body, &in); e != nil {
		return nil, e
	}
	if !isNull(in.PreviousResponseID) {
		return nil, badRequest("previous_response_id is not supported; replay the full input instead")
	}
	if !isNull(in.Conversation) {
		return nil, badRequest("conversation is not supported; replay the full input instead")
	}
	if isNull(in.Input) {
		return nil, badRequest("missing input")
	}
	r := &genRequest{api: apiResponses, model: in.Model}
	if r.model == "" {
		r.model = ModelID
	}
	t := newThinkCtl()
	if e := commonThinking(&t, in.Thinking, in.Think, nil); e != nil {
		return nil, e
	}
	if in.Reasoning != nil {
		if in.Reasoning.Effort != nil {
			if e := t.effortField("reasoning.effort", in.Reasoning.Effort); e != nil {
				return nil, e
			}
			// An explicit effort is a thinking control of its own.
			t.got = true
			t.enabled = t.eff != effNone
		}
		if s := in.Reasoning.Summary; s != nil && (*s == "auto" || *s == "concise" || *s == "detailed") {
			r.summary = true
		}
	}
	for _, inc := range in.Include {
		if inc == "reasoning.encrypted_content" {
			r.encReasoning = true
		}
	}
	r.mode = t.mode(in.Model, ctxSize)
	var e *apiError
	if r.sampling, e = samplingFrom(r.mode, in.Temperature, in.TopP, in.MinP, in.TopK); e != nil {
		return nil, e
	}
	r.seed, r.hasSeed = seedOf(in.Seed)
	if r.maxTokens, e = maxTokensOf("max_output_tokens", in.MaxOutputTokens, in.MaxTokens); e != nil {
		return nil, e
	}
	if r.stops, e = parseStop(in.Stop, "stop"); e != nil {
		return nil, e
	}
	r.stream = in.Stream != nil && *in.Stream

	// tool_choice: "none" disables tools, "auto" is the default; forcing a
	// tool needs constrained decoding, which is refused rather than ignored.
	choiceNone := false
	if tc := bytes.TrimSpace(in.ToolChoice); len(tc) > 0 && string(tc) != "null" {
		var s string
		if json.Unmarshal(tc, &s) == nil {
			switch s {
			case "none":
				choiceNone = true
			case "auto":
			default:
				return nil, badRequest("tool_choice=%s is not supported", s)
			}
		} else {
			return nil, badRequest("forced tool_choice is not supported")
		}
	}

	var msgs []chat.Message
	var loaded []json.RawMessage
	wire := map[string]toolWire{}
	raw := bytes.TrimSpace(in.Input)
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("input: invalid string")
		}
		msgs = []chat.Message{{Role: chat.RoleUser, Content: s}}
	} else {
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, badRequest("input must be a string or an array of items")
		}
		if msgs, loaded, e = responsesInput(items, wire); e != nil {
			return nil, e
		}
	}
	if in.Instructions != nil && *in.Instructions != "" {
		msgs = append([]chat.Message{{Role: chat.RoleSystem, Content: *in.Instructions}}, msgs...)
	}
	r.conv.Messages = msgs
	tools, w2, e := parseToolList(in.Tools, "tools")
	if e != nil {
		return nil, e
	}
	for k, v := range w2 {
		wire[k] = v
	}
	tools = append(tools, loaded...)
	if len(tools) > 0 && !choiceNone {
		r.conv.Tools, r.toolWire, r.hasTools = tools, wire, true
	}
	return r, nil
}

// responsesInput converts input items into messages. Reasoning items attach
// to the next assistant message or call; calls join the preceding
// assistant message; tool_search_output items load more tool schemas.
func responsesInput(items []json.RawMessage, wire map[string]toolWire) ([]chat.Message, []json.RawMessage, *apiError) {
	var msgs []chat.Message
	var loaded []json.RawMessage
	var pending string // reasoning waiting for its assistant turn
	addReasoning := func(s string) {
		if s == "" {
			return
		}
		if pending != "" {
			pending += "\n"
		}
		pending += s
	}
	addCall := func(tc chat.ToolCall) {
		if n := len(msgs); n > 0 && msgs[n-1].Role == chat.RoleAssistant {
			last := &msgs[n-1]
			if pending != "" && last.Reasoning == "" {
				last.Reasoning, pending = pending, ""
			}
			last.ToolCalls = append(last.ToolCalls, tc)
			return
		}
		msgs = append(msgs, chat.Message{Role: chat.RoleAssistant, Reasoning: pending, ToolCalls: []chat.ToolCall{tc}})
		pending = ""
	}
	for i, raw := range items {
		where := "input[" + strconv.Itoa(i) + "]"
		var it responsesItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, nil, badRequest("%s: %v", where, err)
		}
		if it.Status != "" && it.Status != "completed" {
			return nil, nil, badRequest("%s: item status %q: only completed items can be replayed", where, it.Status)
		}
		t := it.Type
		if t == "" {
			t = "message"
		}
		consumes := (t == "message" && it.Role == "assistant") || t == "function_call" ||
			t == "custom_tool_call" || t == "local_shell_call" || t == "web_search_call" ||
			t == "tool_search_call" || t == "image_generation_call"
		bookkeeping := t == "compaction" || t == "context_compaction"
		if !consumes && !bookkeeping && pending != "" {
			msgs = append(msgs, chat.Message{Role: chat.RoleAssistant, Reasoning: pending})
			pending = ""
		}
		switch t {
		case "message":
			text, e := contentText(it.Content, where+".content")
			if e != nil {
				return nil, nil, e
			}
			m := chat.Message{Content: text}
			switch it.Role {
			case "user", "":
				m.Role = chat.RoleUser
			case "assistant":
				m.Role = chat.RoleAssistant
				m.Reasoning, pending = pending, ""
			case "system", "developer":
				m.Role = chat.RoleSystem
			default:
				return nil, nil, badRequest("%s: unknown role %q", where, it.Role)
			}
			msgs = append(msgs, m)
		case "function_call", "custom_tool_call":
			id := it.CallID
			if id == "" {
				id = it.ID
			}
			args := "{}"
			if !isNull(it.Arguments) {
				args = rawText(it.Arguments)
			} else if !isNull(it.Input) {
				args = rawText(it.Input)
			}
			name := it.Name
			if t == "function_call" && it.Namespace != "" && name != "" {
				name = it.Namespace + name
			}
			addCall(chat.ToolCall{ID: id, Name: name, Arguments: args})
		case "local_shell_call", "web_search_call", "tool_search_call", "image_generation_call":
			id := it.CallID
			if id == "" {
				id = it.ID
			}
			name := t
			switch t {
			case "tool_search_call":
				name = "tool_search"
			case "local_shell_call":
				name = "local_shell"
			}
			args := "{}"
			switch {
			case !isNull(it.Action):
				args = rawText(it.Action)
			case !isNull(it.Arguments):
				args = rawText(it.Arguments)
			case !isNull(it.Input):
				args = rawText(it.Input)
			}
			addCall(chat.ToolCall{ID: id, Name: name, Arguments: args})
		case "function_call_output", "custom_tool_call_output", "local_shell_call_output",
			"web_search_call_output", "tool_search_output", "tool_search_call_output",
			"image_generation_call_output":
			id := it.CallID
			if id == "" {
				id = it.ID
			}
			var out string
			switch {
			case !isNull(it.Output):
				o := bytes.TrimSpace(it.Output)
				if o[0] == '[' {
					var e *apiError
					if out, e = contentText(o, where+".output"); e != nil {
						return nil, nil, e
					}
				} else {
					out = rawText(o)
				}
			case !isNull(it.Result):
				out = rawText(it.Result)
			case t == "tool_search_output" && len(it.Tools) > 0:
				b, _ := json.Marshal(it.Tools)
				out = string(b)
			}
			if t == "tool_search_output" && len(it.Tools) > 0 {
				tools, w, e := parseToolList(it.Tools, where+".tools")
				if e != nil {
					return nil, nil, e
				}
				loaded = append(loaded, tools...)
				for k, v := range w {
					wire[k] = v
				}
			}
			msgs = append(msgs, chat.Message{Role: chat.RoleTool, ToolCallID: id, Content: out})
		case "reasoning":
			if rs, ok := decodeReasoning(it.EncryptedContent); ok {
				// Our own opaque reasoning: the exact text, which supersedes
				// the summary.
				addReasoning(rs)
				break
			}
			if !isNull(it.Summary) {
				s, e := contentText(it.Summary, where+".summary")
				if e != nil {
					return nil, nil, e
				}
				addReasoning(s)
			}
			if !isNull(it.Content) {
				s, e := contentText(it.Content, where+".content")
				if e != nil {
					return nil, nil, e
				}
				addReasoning(s)
			}
		case "compaction", "context_compaction":
		default:
			return nil, nil, badRequest("%s: input item type %q is not supported", where, t)
		}
	}
	if pending != "" {
		msgs = append(msgs, chat.Message{Role: chat.RoleAssistant, Reasoning: pending})
	}
	return msgs, loaded, nil
}
