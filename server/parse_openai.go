package server

import (
	"bytes"
	"encoding/json"
	"strconv"

	"ds4go/chat"
)

// chatCompletionRequest is the subset of the OpenAI chat request ds4 uses;
// unknown fields are ignored.
type chatCompletionRequest struct {
	Model               string            `json:"model"`
	Messages            []json.RawMessage `json:"messages"`
	Tools               []json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage   `json:"tool_choice"`
	MaxTokens           optNumber         `json:"max_tokens"`
	MaxCompletionTokens optNumber         `json:"max_completion_tokens"`
	Temperature         optNumber         `json:"temperature"`
	TopP                optNumber         `json:"top_p"`
	TopK                optNumber         `json:"top_k"`
	MinP                optNumber         `json:"min_p"`
	Seed                optNumber         `json:"seed"`
	N                   optNumber         `json:"n"`
	Stream              *bool             `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	Stop            json.RawMessage `json:"stop"`
	Thinking        json.RawMessage `json:"thinking"`
	Think           *bool           `json:"think"`
	ReasoningEffort *string         `json:"reasoning_effort"`
	ResponseFormat  *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

// openAIMessage is one chat message.
type openAIMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ToolCallID       string          `json:"tool_call_id"`
	Name             string          `json:"name"`
	ToolCalls        []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// argumentsText returns tool-call arguments as text: a JSON string's value,
// or raw JSON (some clients send an object).
func argumentsText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}"
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	return string(raw)
}

// commonThinking applies "thinking", "think" and "reasoning_effort".
func commonThinking(t *thinkCtl, thinking json.RawMessage, think *bool, eff *string) *apiError {
	if e := t.thinkingField(thinking); e != nil {
		return e
	}
	if think != nil {
		t.got, t.enabled = true, *think
	}
	return t.effortField("reasoning_effort", eff)
}

// maxTokensOf picks the first set limit.
func maxTokensOf(name string, nums ...optNumber) (int, *apiError) {
	for _, n := range nums {
		if n.set {
			v, e := n.int(name)
			if e != nil {
				return 0, e
			}
			if v < 0 {
				return 0, badRequest("%s must not be negative", name)
			}
			return v, nil
		}
	}
	return -1, nil
}

func seedOf(n optNumber) (uint64, bool) {
	if !n.set || n.v <= 0 {
		return 0, false
	}
	return uint64(n.v), true
}

// parseChatRequest parses a /v1/chat/completions body.
func parseChatRequest(body []byte, ctxSize int) (*genRequest, *apiError) {
	var in chatCompletionRequest
	if e := decodeJSON(body, &in); e != nil {
		return nil, e
	}
	if in.Messages == nil {
		return nil, badRequest("missing messages")
	}
	if in.N.set && in.N.v != 1 {
		return nil, badRequest("n must be 1 (only one choice is generated)")
	}
	r := &genRequest{api: apiChat, model: in.Model}
	if r.model == "" {
		r.model = ModelID
	}
	t := newThinkCtl()
	if e := commonThinking(&t, in.Thinking, in.Think, in.ReasoningEffort); e != nil {
		return nil, e
	}
	r.mode = t.mode(in.Model, ctxSize)
	var e *apiError
	if r.sampling, e = samplingFrom(r.mode, in.Temperature, in.TopP, in.MinP, in.TopK); e != nil {
		return nil, e
	}
	r.seed, r.hasSeed = seedOf(in.Seed)
	if r.maxTokens, e = maxTokensOf("max_tokens", in.MaxCompletionTokens, in.MaxTokens); e != nil {
		return nil, e
	}
	if r.stops, e = parseStop(in.Stop, "stop"); e != nil {
		return nil, e
	}
	r.stream = in.Stream != nil && *in.Stream
	r.incUsage = in.StreamOptions != nil && in.StreamOptions.IncludeUsage != nil && *in.StreamOptions.IncludeUsage
	for i, raw := range in.Messages {
		var m openAIMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, badRequest("messages[%d]: %v", i, err)
		}
		msg, e := m.toChat(i)
		if e != nil {
			return nil, e
		}
		r.conv.Messages = append(r.conv.Messages, msg)
	}
	choiceNone := toolChoiceIsNone(in.ToolChoice)
	tools, wire, e := parseToolList(in.Tools, "tools")
	if e != nil {
		return nil, e
	}
	if len(tools) > 0 && !choiceNone {
		r.conv.Tools, r.toolWire, r.hasTools = tools, wire, true
	}
	if rf := in.ResponseFormat; rf != nil && rf.Type == "json_schema" && rf.JSONSchema != nil && len(rf.JSONSchema.Schema) > 0 {
		r.conv.ResponseFormat = rf.JSONSchema.Schema
	}
	return r, nil
}

func (m *openAIMessage) toChat(i int) (chat.Message, *apiError) {
	where := "messages[" + strconv.Itoa(i) + "]"
	content, e := contentText(m.Content, where+".content")
	if e != nil {
		return chat.Message{}, e
	}
	out := chat.Message{Content: content}
	switch m.Role {
	case "system", "developer":
		out.Role = chat.RoleSystem
	case "user", "":
		out.Role = chat.RoleUser
	case "assistant":
		out.Role = chat.RoleAssistant
		rc := m.ReasoningContent
		if len(bytes.TrimSpace(rc)) == 0 || string(bytes.TrimSpace(rc)) == "null" {
			rc = m.Reasoning
		}
		if out.Reasoning, e = contentText(rc, where+".reasoning_content"); e != nil {
			return chat.Message{}, e
		}
		for _, tc := range m.ToolCalls {
			out.ToolCalls = append(out.ToolCalls, chat.ToolCall{
				ID: tc.ID, Name: tc.Function.Name, Arguments: argumentsText(tc.Function.Arguments),
			})
		}
	case "tool", "function":
		out.Role = chat.RoleTool
		out.ToolCallID = m.ToolCallID
	default:
		return chat.Message{}, badRequest("%s: unknown role %q", where, m.Role)
	}
	return out, nil
}

// toolChoiceIsNone reports tool_choice "none" (OpenAI) or {"type":"none"}
// (Anthropic). Other choices are accepted and treated as "auto".
func toolChoiceIsNone(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s == "none"
	}
	var obj struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(raw, &obj) == nil && obj.Type == "none"
}

// parseToolList converts tools of any API into prompt function schemas:
// OpenAI {"type":"function","function":{…}}, Responses flat functions,
// namespaces and tool_search, Anthropic {"name","input_schema"}; other tool
// objects are shown to the model as sent.
func parseToolList(tools []json.RawMessage, where string) ([]json.RawMessage, map[string]toolWire, *apiError) {
	var out []json.RawMessage
	wire := map[string]toolWire{}
	for i, raw := range tools {
		var t struct {
			Type        string            `json:"type"`
			Function    json.RawMessage   `json:"function"`
			Name        string            `json:"name"`
			Description *string           `json:"description"`
			Parameters  json.RawMessage   `json:"parameters"`
			InputSchema json.RawMessage   `json:"input_schema"`
			Tools       []json.RawMessage `json:"tools"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, nil, badRequest("%s[%d]: a tool must be a JSON object: %v", where, i, err)
		}
		switch {
		case len(bytes.TrimSpace(t.Function)) > 0 && string(bytes.TrimSpace(t.Function)) != "null":
			var f struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(t.Function, &f); err != nil || f.Name == "" {
				return nil, nil, badRequest("%s[%d].function needs a name", where, i)
			}
			out = append(out, t.Function)
		case t.Type == "namespace":
			for j, sub := range t.Tools {
				var st struct {
					Type        string          `json:"type"`
					Name        string          `json:"name"`
					Description *string         `json:"description"`
					Parameters  json.RawMessage `json:"parameters"`
					InputSchema json.RawMessage `json:"input_schema"`
				}
				if err := json.Unmarshal(sub, &st); err != nil || st.Name == "" {
					return nil, nil, badRequest("%s[%d].tools[%d]: a namespaced tool needs a name", where, i, j)
				}
				if st.Type != "" && st.Type != "function" {
					continue
				}
				params := st.Parameters
				if len(params) == 0 {
					params = st.InputSchema
				}
				full := t.Name + st.Name
				out = append(out, functionSchema(full, st.Description, params))
				wire[full] = toolWire{name: st.Name, namespace: t.Name}
			}
		case t.Type == "tool_search":
			desc := t.Description
			if desc == nil {
				d := "Search available tools."
				desc = &d
			}
			out = append(out, functionSchema("tool_search", desc, t.Parameters))
			wire["tool_search"] = toolWire{name: "tool_search", toolSearch: true}
		case t.Name != "" && (t.Type == "" || t.Type == "function" || t.Type == "custom" && len(t.InputSchema) > 0):
			params := t.Parameters
			if len(bytes.TrimSpace(params)) == 0 {
				params = t.InputSchema
			}
			out = append(out, functionSchema(t.Name, t.Description, params))
		default:
			var probe map[string]json.RawMessage
			if err := json.Unmarshal(raw, &probe); err != nil {
				return nil, nil, badRequest("%s[%d]: a tool must be a JSON object", where, i)
			}
			out = append(out, raw)
		}
	}
	return out, wire, nil
}

// completionRequest is the legacy /v1/completions body.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     optNumber       `json:"max_tokens"`
	Temperature   optNumber       `json:"temperature"`
	TopP          optNumber       `json:"top_p"`
	TopK          optNumber       `json:"top_k"`
	MinP          optNumber       `json:"min_p"`
	Seed          optNumber       `json:"seed"`
	N             optNumber       `json:"n"`
	Stream        *bool           `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	Stop            json.RawMessage `json:"stop"`
	Thinking        json.RawMessage `json:"thinking"`
	Think           *bool           `json:"think"`
	ReasoningEffort *string         `json:"reasoning_effort"`
}

// completionSystem is the system text ds4 wraps completion prompts in.
const completionSystem = "You are a helpful assistant"

// parseCompletionRequest parses /v1/completions. As in ds4 the prompt is
// wrapped in a one-turn chat (system, user, assistant opening) and the
// output is returned raw (reasoning and its closing tag included).
func parseCompletionRequest(body []byte, ctxSize int) (*genRequest, *apiError) {
	var in completionRequest
	if e := decodeJSON(body, &in); e != nil {
		return nil, e
	}
	if len(bytes.TrimSpace(in.Prompt)) == 0 {
		return nil, badRequest("missing prompt")
	}
	if in.N.set && in.N.v != 1 {
		return nil, badRequest("n must be 1 (only one choice is generated)")
	}
	var prompt string
	if err := json.Unmarshal(in.Prompt, &prompt); err != nil {
		var list []string
		if err := json.Unmarshal(in.Prompt, &list); err != nil || len(list) != 1 {
			return nil, badRequest("prompt must be a string (or an array of one string)")
		}
		prompt = list[0]
	}
	r := &genRequest{api: apiCompletions, model: in.Model}
	if r.model == "" {
		r.model = ModelID
	}
	t := newThinkCtl()
	if e := commonThinking(&t, in.Thinking, in.Think, in.ReasoningEffort); e != nil {
		return nil, e
	}
	r.mode = t.mode(in.Model, ctxSize)
	var e *apiError
	if r.sampling, e = samplingFrom(r.mode, in.Temperature, in.TopP, in.MinP, in.TopK); e != nil {
		return nil, e
	}
	r.seed, r.hasSeed = seedOf(in.Seed)
	if r.maxTokens, e = maxTokensOf("max_tokens", in.MaxTokens); e != nil {
		return nil, e
	}
	if r.stops, e = parseStop(in.Stop, "stop"); e != nil {
		return nil, e
	}
	r.stream = in.Stream != nil && *in.Stream
	r.incUsage = in.StreamOptions != nil && in.StreamOptions.IncludeUsage != nil && *in.StreamOptions.IncludeUsage
	r.rawPrompt = prompt
	r.conv.Messages = []chat.Message{
		{Role: chat.RoleSystem, Content: completionSystem},
		{Role: chat.RoleUser, Content: prompt},
	}
	return r, nil
}
